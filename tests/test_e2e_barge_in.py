"""Barge-in over the phone protocol: the caller talks over a reply; the reply stops, the
phone is told to drop buffered audio (`clear`), and the agent remembers only what it said."""

from __future__ import annotations

import asyncio

import pytest

from latency_bench.callers import twilio_caller
from latency_bench.callers.audio import speak
from latency_bench.callers.conversation import PlannedTurn
from tests.conftest import finished_call

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

LONG_REPLY_QUESTION = "Please tell me a long story about a dragon who lived in a castle by the sea."
BARGE_IN = "Stop please. What is two plus two?"
# Long enough for the reply's first phrase to be played (and so recorded as spoken) first.
BARGE_IN_AFTER_S = 1.0


def question(text: str, *, barge_in_after_s: float | None = None) -> PlannedTurn:
    samples, rate = speak(text)
    return PlannedTurn.of(samples, rate, text, barge_in_after_s=barge_in_after_s)


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
            f"{server.ws_url}/ws/twilio", [question(LONG_REPLY_QUESTION), question(BARGE_IN, barge_in_after_s=BARGE_IN_AFTER_S)])
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)

    first, second = result.turns
    assert first.first_audible_at is not None, "no reply to barge in on"
    assert first.clear_events >= 1 and first.reply_stopped_at is not None, "no clear after the caller barged in"
    assert first.barge_in_stop_ms < 1500  # VAD start + interruption
    # Audio the server had already sent may still trickle in; it must not keep flowing.
    assert first.late_reply_seconds <= 0.5
    assert second.first_audible_at is not None, "the agent did not answer the barge-in"

    call = await finished_call(server.base_url, result.call_sid)
    interrupted = call["turns"][0]
    assert interrupted["interrupted"] is True
    # What was spoken before the barge-in: a phrase or, if the first phrase was still playing,
    # nothing. Either way the LLM context's reply for that turn is exactly that, not the
    # long story the LLM generated.
    spoken = interrupted["reply_text"] or ""

    final = contexts[-1]
    users = [i for i, m in enumerate(final) if m["role"] == "user"]
    assert len(users) >= 2, final
    first_reply = " ".join(m["content"] for m in final[users[0] + 1 : users[1]] if m["role"] == "assistant")
    assert _words(first_reply) == _words(spoken), (first_reply, spoken)
    heard_seconds = first.reply_audio_seconds
    assert heard_seconds < BARGE_IN_AFTER_S + 1.5 + 0.5, f"{heard_seconds:.1f} s of reply played after the barge-in"


def _words(text: str) -> list[str]:
    return "".join(c.lower() if c.isalnum() or c.isspace() else " " for c in text).split()
