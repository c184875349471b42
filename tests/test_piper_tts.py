"""The Piper voice on its real packaged weights."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from agent.config import load_config
from models.piper_tts import PiperTTSEngine
from tests.conftest import DEFAULT_CONFIG, REPO_ROOT

pytestmark = pytest.mark.slow

WORDS = "the clinic opens at nine on saturday and closes at noon while parking is behind the building".split()


def sentence(words: int) -> str:
    return " ".join((WORDS * 4)[:words]) + "."


def rss_mb() -> float:
    status = Path("/proc/self/status").read_text().splitlines()
    return int(next(line for line in status if line.startswith("VmRSS:")).split()[1]) / 1024


def rss_growth_over_new_lengths(sentences: int) -> float:
    """MB of resident memory a fresh voice gains over `sentences` sentences of 5-40 words, after
    one of 40 (its largest working memory is then reached: what is left is per length). Each
    sentence is said in one run (pieces would not be ordered by length as the sentences are)."""
    engine = PiperTTSEngine(replace(load_config(DEFAULT_CONFIG).tts, max_run_chars=1000))
    engine.load()
    lengths = random.Random(1).choices(range(5, 41), k=sentences)
    for n, words in enumerate([40, 40, *lengths]):
        if n == 2:
            before = rss_mb()
        for _ in engine._synthesize_blocking(sentence(words), threading.Event()):
            pass
    return rss_mb() - before


async def test_the_voice_speaks_a_sentence_in_chunks():
    engine = PiperTTSEngine(load_config(DEFAULT_CONFIG).tts)
    engine.load()
    chunks = [chunk async for chunk in engine.synthesize("The clinic opens at nine.")]
    assert engine.sample_rate == 22_050 and len(chunks) > 3
    assert sum(len(c) for c in chunks) / 2 / engine.sample_rate > 1.0  # over a second of speech
    await engine.close()


async def test_a_run_on_sentence_is_said_in_pieces_no_longer_than_the_configured_run():
    """Piper says a whole run before any of it plays, and the arena keeps the longest run's
    workspace: a 55-word sentence said whole had its first audio after ~0.9 s and left +310 MB,
    in pieces of 120 characters ~0.34 s and +115 MB (python -m latency_bench tts-memory)."""
    from latency_bench.components.tts_memory import LONG

    engine = PiperTTSEngine(load_config(DEFAULT_CONFIG).tts)
    engine.load()
    said: list[str] = []
    synthesize = engine._voice.synthesize
    engine._voice.synthesize = lambda text, **kwargs: (said.append(text), synthesize(text, **kwargs))[1]
    audio = b"".join([chunk async for chunk in engine.synthesize(LONG)])
    await engine.close()
    assert len(said) > 1 and all(len(text) <= engine._config.max_run_chars for text in said), said
    assert " ".join(said) == LONG
    assert len(audio) / 2 / engine.sample_rate > 10  # the whole sentence is spoken: ~20 s


@pytest.mark.system
def test_sentences_of_new_lengths_do_not_grow_memory():
    """Before: ONNX Runtime kept a memory plan and its blocks for every phoneme count the voice
    met (+29 to +163 MB over these 50 sentences, run to run), and every reply sentence is a new one.
    In a process of its own: RSS is the process's."""
    run = subprocess.run([sys.executable, "-c", "from tests.test_piper_tts import rss_growth_over_new_lengths as g; "
                          "print(g(50))"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-2000:]
    assert float(run.stdout.split()[-1]) < 20.0  # after: 8-9 MB (12 over 100); before: 29-163 MB
