"""The Whisper engine on the real packaged weights (base and tiny.en)."""

import numpy as np
import pytest

from agent.config import ASRConfig
from latency_bench.callers.audio import mulaw_decode, mulaw_encode, resample, speak
from models.whisper_asr import (
    MAX_DECODE_TOKENS,
    RETRY_TEMPERATURE,
    WhisperASREngine,
    FastResult,
    looks_right,
    decode_token_budget,
)

pytestmark = pytest.mark.slow


def phone_quality(text: str) -> bytes:
    samples, rate = speak(text)
    line = mulaw_decode(mulaw_encode(resample(samples, rate, 8000)))  # what a phone call carries
    return resample(line, 8000, 16_000).tobytes()


@pytest.fixture(scope="module")
def question() -> bytes:
    return phone_quality("What is the capital of France?")


@pytest.mark.parametrize("model", ["package:whisper-base", "package:whisper-tiny.en"])
@pytest.mark.parametrize("padding", [5.0, 0.0])  # trimmed window, and Whisper's full 30 s window
async def test_transcribes_a_phone_question(model, padding, question):
    engine = WhisperASREngine(ASRConfig(model=model, encoder_padding_seconds=padding))
    engine.load()
    transcript = await engine.transcribe(question)
    words = transcript.text.lower()
    assert "capital" in words and "france" in words, transcript.text
    assert 1.5 < transcript.audio_seconds < 4.0
    assert engine.fast_path_fallbacks == 0
    await engine.close()


async def test_silence_gives_no_words(embedded_engines):
    transcript = await embedded_engines.asr.transcribe(np.zeros(16_000 * 2, dtype=np.int16).tobytes())
    assert len(transcript.text.split()) <= 1


def test_the_decode_budget_grows_with_the_audio_and_is_capped():
    assert decode_token_budget(1.0) < decode_token_budget(5.0) <= MAX_DECODE_TOKENS
    assert decode_token_budget(5.0) >= 5 * 5  # room for fast speech (~5 tokens a second)
    assert decode_token_budget(60.0) == MAX_DECODE_TOKENS


async def test_a_repetition_loop_is_retried_on_the_short_window_not_the_full_one(embedded_engines, monkeypatch,
                                                                              question):
    engine = embedded_engines.asr
    calls = []
    real = engine._decode_trimmed_window

    def looping_first(audio, prompt, temperature=0.0, prefix=None):
        calls.append(temperature)
        if temperature == 0.0:  # greedy decoding fell into a loop, as Whisper sometimes does
            return FastResult("in miles in miles " * 12, -0.06, 0.01)
        return real(audio, prompt, temperature, prefix)

    monkeypatch.setattr(engine, "_decode_trimmed_window", looping_first)
    retries, fallbacks = engine.fast_path_retries, engine.fast_path_fallbacks
    transcript = await engine.transcribe(question)
    assert calls == [0.0, RETRY_TEMPERATURE]
    assert engine.fast_path_retries == retries + 1 and engine.fast_path_fallbacks == fallbacks
    assert "capital" in transcript.text.lower()


def test_doubtful_fast_results_are_redone():
    assert looks_right(FastResult("what is the capital of france", -0.2, 0.01))
    assert not looks_right(FastResult("I'm sorry. " * 20, -0.1, 0.01))  # a loop
    assert not looks_right(FastResult("the capital of the", -1.6, 0.01))  # low confidence
    assert not looks_right(FastResult("", -0.1, 0.1))  # nothing, though it sounded like speech
    assert looks_right(FastResult("", -0.1, 0.9))  # nothing, and it was silence


def test_a_transcript_that_starts_over_is_redone_hotter():
    from models.hallucination import starts_over
    from models.whisper_asr import FastResult, looks_right

    restarted = "How much does a large pizza cost? How much does a large pizza"  # seen live, cut by the budget
    assert starts_over(restarted) and not looks_right(FastResult(restarted, -0.2, 0.01))
    for said in ("I want to go to the shop and then I want to go to the park.",
                 "I am sorry. I am sorry about that.", "Thank you. Thank you."):
        assert not starts_over(said) and looks_right(FastResult(said, -0.2, 0.01)), said


def rss_growth_over_new_lengths(passes: int) -> float:
    """MB of resident memory a fresh Whisper engine gains over `passes` transcriptions, each of
    an input length it has not seen (a turn's trimmed window, 10 ms longer each time)."""
    from pathlib import Path

    def rss_mb() -> float:
        status = Path("/proc/self/status").read_text().splitlines()
        return int(next(line for line in status if line.startswith("VmRSS:")).split()[1]) / 1024

    engine = WhisperASREngine(ASRConfig())
    engine.load()
    engine.warm_up()
    speech = np.frombuffer(phone_quality("What time do you open on Saturday?"), dtype=np.int16)
    for n in range(passes + 5):
        if n == 5:
            before = rss_mb()
        engine._transcribe_blocking(np.concatenate([speech, np.zeros(160 * n, dtype=np.int16)]).tobytes(), None)
    return rss_mb() - before


@pytest.mark.system
def test_a_new_input_length_every_pass_does_not_grow_memory():
    """Before: oneDNN kept ~1.5 MB of primitives per input length (+60 MB over these 40 passes),
    and nearly every turn is a new length: the soak's growth. In a process of its own: the
    cache's size is fixed when it is built, and RSS is the process's."""
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    run = subprocess.run([sys.executable, "-c", "from tests.test_whisper_engine import rss_growth_over_new_lengths as g; "
                          "print(g(40))"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert float(run.stdout.split()[-1]) < 15.0  # after: ~1.6 MB; before: ~46 MB
