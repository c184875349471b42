"""A real phone-style call over the Twilio Media Streams protocol, end to end.

The caller's question is spoken by espeak-ng at test time, streamed in real time as
20 ms mu-law frames, followed by line silence; the reply audio that comes back is
transcribed with the project's own ASR and must hold real English words.
"""

from __future__ import annotations

import re

import httpx
import numpy as np
import pytest
from loguru import logger

from tests.call_checks import assert_answered_capital_question, wait_until_ended
from latency_bench.callers import twilio_caller
from latency_bench.callers.audio import resample, speak
from latency_bench.callers.conversation import PlannedTurn

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

QUESTION = "Hello. What is the capital of France?"


def spoken(text: str) -> PlannedTurn:
    samples, rate = speak(text)
    return PlannedTurn.of(samples, rate, text)


async def transcribe_reply(engines, phone_audio: np.ndarray) -> str:
    pcm16 = resample(phone_audio, twilio_caller.PHONE_RATE, engines.asr.sample_rate)
    return (await engines.asr.transcribe(pcm16.tobytes())).text


async def test_phone_call_gets_a_spoken_english_reply(server, embedded_engines):
    warnings: list[str] = []
    sink = logger.add(lambda message: warnings.append(str(message)), level="WARNING")
    try:
        result = await twilio_caller.call(f"{server.ws_url}/ws/twilio", [spoken(QUESTION)], keep_audio=True)
    finally:
        logger.remove(sink)
    # pipecat's STT p99 warnings (not set; the wait collapsed) were two WARNING lines per call.
    assert not [line for line in warnings if "ttfs_p99_latency not set" in line or "collapsed" in line], warnings

    turn, = result.turns
    assert turn.error is None and turn.first_audible_at is not None, "no reply audio came back"
    assert turn.reply_audio_seconds > 0.5
    assert 0 < turn.ttfb_ms <= turn.ttfs_ms < 10_000, f"caller-side TTFB {turn.ttfb_ms} ms, TTFS {turn.ttfs_ms} ms"
    assert turn.underruns == 0, f"the reply had {turn.underruns} audible holes on an idle server"
    heard = await transcribe_reply(embedded_engines, turn.reply_audio())
    words = re.findall(r"[a-zA-Z']{2,}", heard)
    assert len(words) >= 2, f"reply did not sound like English: {heard!r}"

    async with httpx.AsyncClient(base_url=server.base_url) as http:
        calls = (await http.get("/api/calls")).json()["calls"]
        assert len(calls) == 1 and calls[0]["transport"] == "twilio"
        call = await wait_until_ended(http, calls[0]["id"])
    assert_answered_capital_question(call)

    metrics = (await httpx.AsyncClient(base_url=server.base_url).get("/metrics")).text
    assert 'cadence_ttfs_seconds_count{transport="twilio"} 1.0' in metrics
