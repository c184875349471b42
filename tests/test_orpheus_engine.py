"""The Orpheus voice as a TTS engine: in-process token source (tiny random Llama with the
Orpheus vocabulary), request splitting, fallback to the CPU voice, and a whole phone call."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import numpy as np
import pytest

from agent.config import OrpheusConfig, TTSConfig
from agent.errors import CadenceError
from latency_bench.callers import twilio_caller
from latency_bench.callers.audio import speak
from latency_bench.callers.conversation import PlannedTurn
from models.base import TTSEngine
from models.fallback_voice import FallbackTTSEngine
from models.orpheus.build import build_orpheus, byte_tokenizer
from models.long_text import split_long_text
from models.orpheus.engine import MAX_REQUEST_CHARS
from models.orpheus.prompt import prompt_ids
from models.orpheus.tiny_llama import InProcessTokenSource
from models.orpheus.token_source import OrpheusSampling
from models.orpheus.tokens import END_OF_SPEECH, FrameAssembler, SAMPLE_RATE
from pipelines.voice import Engines
from tests.conftest import finished_call, running_server


def test_long_sentences_are_split_at_clause_breaks_under_the_request_limit():
    text = ("This is a clause, " * 40).strip()
    parts = split_long_text(text, MAX_REQUEST_CHARS)
    assert len(parts) > 1 and all(len(p) <= MAX_REQUEST_CHARS for p in parts)
    assert " ".join(parts) == " ".join(text.split())
    assert all(p.endswith(",") or p == parts[-1] for p in parts)
    assert split_long_text("Short.", MAX_REQUEST_CHARS) == ["Short."]
    assert split_long_text("x" * 700, MAX_REQUEST_CHARS) == ["x" * 300, "x" * 300, "x" * 100]  # no space at all


@pytest.mark.slow
async def test_the_in_process_source_speaks_well_formed_frames_and_stops():
    source = InProcessTokenSource(seed=1)
    ids = prompt_ids(byte_tokenizer, "tara", "Hello there, how are you today?")
    assembler, tokens = FrameAssembler(), []
    async for chunk in source.stream(ids, OrpheusSampling()):
        tokens += chunk
        assembler.push(chunk)
    await source.close()
    assert tokens[-1] == END_OF_SPEECH and assembler.ended and assembler.partial_tokens == 0
    assert assembler.frames == source.frames_for(ids) and assembler.frames > 10
    assert len(set(tokens)) > len(tokens) // 2  # sampled, not one token repeated


class _FailingVoice(TTSEngine):
    sample_rate = SAMPLE_RATE

    def __init__(self, after_chunks: int) -> None:
        self.after_chunks = after_chunks

    def load(self) -> None:
        pass

    async def synthesize(self, text):
        for _ in range(self.after_chunks):
            yield b"\x01\x00" * 480
        raise CadenceError("token server unreachable")


class _ToneVoice(TTSEngine):
    sample_rate = 22_050

    def load(self) -> None:
        pass

    async def synthesize(self, text):
        for _ in range(5):
            yield (np.sin(np.arange(2205) / 5) * 8000).astype(np.int16).tobytes()


async def test_a_sentence_the_primary_voice_cannot_start_is_said_by_the_fallback_at_its_rate():
    engine = FallbackTTSEngine(_FailingVoice(after_chunks=0), _ToneVoice())
    audio = b"".join([c async for c in engine.synthesize("Hello.")])
    assert engine.fallbacks == 1
    assert abs(len(audio) // 2 - SAMPLE_RATE * 0.5) < 50  # 0.5 s of 22.05 kHz audio, now at 24 kHz


async def test_a_voice_failing_mid_sentence_is_not_patched_with_another_voice():
    engine = FallbackTTSEngine(_FailingVoice(after_chunks=2), _ToneVoice())
    with pytest.raises(CadenceError):
        async for _ in engine.synthesize("Hello."):
            pass


@pytest.mark.slow
@pytest.mark.e2e
async def test_a_phone_call_is_answered_in_the_orpheus_voice(embedded_engines, server_config):
    config = replace(server_config, tts=replace(TTSConfig(), engine="orpheus",
                                                orpheus=OrpheusConfig(fallback_to_piper=False)))
    orpheus = build_orpheus(config.tts.orpheus)
    await asyncio.to_thread(orpheus.load)
    await asyncio.to_thread(orpheus.warm_up)
    engines = Engines(asr=embedded_engines.asr, llm=embedded_engines.llm, tts=orpheus)
    samples, rate = speak("Hello. What is the capital of France?")
    try:
        with running_server(config, engines) as server:
            result = await twilio_caller.call(f"{server.ws_url}/ws/twilio", [PlannedTurn.of(samples, rate)],
                                              keep_audio=True)
            call = await finished_call(server.base_url, result.call_sid)
    finally:
        await orpheus.close()
    stored, = call["turns"]
    # Every reply sentence has its own TTS latency; the first is inside the turn's TTFS.
    assert stored["sentence_ttfb_ms"] and 0 < stored["sentence_ttfb_ms"][0] < stored["ttfs_ms"]
    turn, = result.turns
    # Random weights say nothing intelligible: check that audio came, in time, and lasted.
    assert turn.error is None, turn.error
    assert 0 < turn.ttfs_ms < 10_000
    assert turn.reply_audio_seconds > 1.0
    # On 2 shared cores the CPU stand-in (tokens, SNAC, ASR and LLM on the same cores) may
    # leave a short hole or two; a decoder slower than real time would leave many.
    assert turn.underrun_seconds < 0.1 * turn.reply_audio_seconds, \
        f"{turn.underruns} holes, {turn.underrun_seconds:.2f} s of {turn.reply_audio_seconds:.1f} s"
