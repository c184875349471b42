"""The speech-to-speech adapter (pipeline "openai-realtime", pipecat's OpenAI Realtime service)
against our own /v1/realtime: a cascade behind a cascade. A phone caller over the Twilio
protocol calls an agent whose adapter is a Realtime client of the same server's default
agent; both calls are real, and both are timed and stored like any other."""

from __future__ import annotations

import httpx
import pytest

from latency_bench.callers import twilio_caller
from latency_bench.callers.audio import speak
from latency_bench.callers.conversation import PlannedTurn
from tests.call_checks import wait_until_ended

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


async def test_a_phone_call_through_a_realtime_adapter_is_answered_timed_and_stored(server):
    async with httpx.AsyncClient(base_url=server.base_url) as http:
        relay = await http.post("/api/agents", json={
            "name": "relay", "system_prompt": "You answer questions.", "pipeline": "openai-realtime",
            "speech_to_speech": {"base_url": f"{server.ws_url}/v1/realtime", "model": "default"}})
        assert relay.status_code == 201, relay.text

    samples, rate = speak("Hello. What is the capital of France?")
    result = await twilio_caller.call(f"{server.ws_url}/ws/twilio", [PlannedTurn.of(samples, rate, "capital")],
                                      agent="relay")
    turn, = result.turns
    assert turn.error is None and turn.first_audible_at is not None, "no reply audio came back"
    assert turn.reply_audio_seconds > 0.5

    async with httpx.AsyncClient(base_url=server.base_url) as http:
        calls = {c["transport"]: c for c in (await http.get("/api/calls")).json()["calls"]}
        assert set(calls) == {"twilio", "realtime"}
        outer = await wait_until_ended(http, calls["twilio"]["id"])
        inner = await wait_until_ended(http, calls["realtime"]["id"])
    assert (outer["agent"], inner["agent"]) == ("relay", "default")
    outer_turn, inner_turn = outer["turns"][0], inner["turns"][0]
    # The adapter carries both sides' words and the turn's timing through to the outer call.
    assert "paris" in outer_turn["reply_text"].lower(), outer_turn
    assert outer_turn["reply_text"].strip() == inner_turn["reply_text"].strip()
    assert {"capital", "france"} & set(outer_turn["user_text"].lower().replace("?", " ").split()) or \
        {"capital", "france"} & set(inner_turn["user_text"].lower().replace("?", " ").split())
    assert 0 < inner_turn["ttfs_ms"] < outer_turn["ttfs_ms"] < 15_000  # the hop costs something
    assert "first_audio_sent" in outer_turn["stage_ms"]
