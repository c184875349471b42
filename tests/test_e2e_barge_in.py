"""Barge-in over the phone protocol: the caller talks over a reply; the reply stops, the
phone is told to drop buffered audio (`clear`), and the agent remembers only what it said."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from latency_bench import twilio_caller
from latency_bench.audio import resample, speak

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

LONG_REPLY_QUESTION = "Please tell me a long story about a dragon who lived in a castle by the sea."
BARGE_IN = "Stop please. What is two plus two?"


def phone_audio(text: str):
    samples, rate = speak(text)
    return resample(samples, rate, twilio_caller.PHONE_RATE)


async def test_caller_speech_stops_the_reply_and_the_context_keeps_only_what_was_said(server):
    manager = server.app.state.manager
    contexts: list[list[dict]] = []

    async def watch_context():
        # The server's own record of the conversation, as the LLM will see it next turn.
        while True:
            for call in list(manager._active.values()):
                if call.voice is not None:
                    contexts.append([dict(m) for m in call.voice.context.get_messages()])
            await asyncio.sleep(0.1)

    watcher = asyncio.create_task(watch_context())
    try:
        result = await twilio_caller.call(
            f"{server.ws_url}/ws/twilio", [phone_audio(LONG_REPLY_QUESTION), phone_audio(BARGE_IN)],
            barge_in_after_s=1.0,
        )
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)

    first, second = result.turns
    assert first.first_reply_at is not None, "no reply to barge in on"
    assert first.cleared_at is not None, "no clear event after the caller barged in"
    assert first.cleared_at - first.barge_in_started_at < 1.5  # VAD start + interruption
    # Audio the server had already sent may still trickle in; it must not keep flowing.
    assert first.late_reply_bytes <= twilio_caller.PHONE_RATE // 2  # under 0.5 s of audio
    assert second.first_reply_at is not None, "the agent did not answer the barge-in"

    async with httpx.AsyncClient(base_url=server.base_url) as http:
        call_id = (await http.get("/api/calls", params={"external_id": result.call_sid})).json()["calls"][0]["id"]
        for _ in range(50):
            call = (await http.get(f"/api/calls/{call_id}")).json()
            if not call["live"]:
                break
            await asyncio.sleep(0.1)
    interrupted = call["turns"][0]
    assert interrupted["interrupted"] is True
    spoken = interrupted["reply_text"]
    assert spoken, "nothing recorded as spoken before the barge-in"

    # The LLM context's reply for that turn is what was spoken, not what was generated.
    final = contexts[-1]
    assistant_replies = [m["content"] for m in final if m["role"] == "assistant"]
    assert assistant_replies, final
    assert _words(assistant_replies[0]) == _words(spoken)
    heard_seconds = first.reply_seconds
    assert heard_seconds < 1.0 + 1.5 + 0.5, f"{heard_seconds:.1f} s of reply played after the barge-in"


def _words(text: str) -> list[str]:
    return "".join(c.lower() if c.isalnum() or c.isspace() else " " for c in text).split()
