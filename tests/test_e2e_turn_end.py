"""Turn end in real calls: a caller who stops mid-sentence is waited for, and a finished
question ends its turn on the short pause, its reply started at the pause.

Real server, real models (Silero, Whisper, Smart Turn, the LLM, Piper), a phone caller
over the Twilio protocol; the paused sentence is one espeak-ng sentence with a 0.6 s
break, so the words before it sound unfinished as a person's do.
"""

from __future__ import annotations

import httpx
import pytest

from latency_bench.callers import twilio_caller
from latency_bench.callers.conversation import PlannedTurn
from latency_bench.quality.pauses import PAUSED_SENTENCES, longest_silence_s, paused_utterance, plain_utterance
from tests.call_checks import wait_until_ended

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def counter(metrics: str, name: str, label: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(f"{name}{{{label}}}"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def one_turn_call(server, utterance) -> tuple:
    result = await twilio_caller.call(f"{server.ws_url}/ws/twilio", [PlannedTurn(utterance, pause_before_s=0.6)])
    async with httpx.AsyncClient(base_url=server.base_url) as http:
        call_id = (await http.get("/api/calls", params={"external_id": result.call_sid})).json()["calls"][0]["id"]
        call = await wait_until_ended(http, call_id)
        metrics = (await http.get("/metrics")).text
    return result, call, metrics


async def test_a_caller_who_pauses_mid_sentence_gets_no_reply_in_the_pause(server):
    before, after = PAUSED_SENTENCES[0]  # "I need to change the delivery address for" ... "my order from last week."
    utterance = paused_utterance(before, after, 0.6)
    assert longest_silence_s(utterance.samples, utterance.rate) >= 0.55  # the pause is really there
    result, call, metrics = await one_turn_call(server, utterance)

    turn, = result.turns
    assert turn.error is None and turn.first_packet_at is not None, "no reply came at all"
    assert turn.first_packet_at > turn.speech_end_at, "the agent answered inside the caller's pause"
    stored, = call["turns"]  # one turn: the pause did not split it
    assert "address" in stored["user_text"].lower() and "week" in stored["user_text"].lower(), stored["user_text"]
    assert counter(metrics, "cadence_turn_end_verdicts_total", 'reason="words_unfinished"') >= 1


async def test_a_finished_question_ends_on_the_short_pause_with_its_reply_started_at_the_pause(server):
    result, call, metrics = await one_turn_call(server, plain_utterance("Where is my package?"))

    turn, = result.turns
    assert turn.error is None and 0 < turn.ttfs_ms < 10_000
    assert call["turns"][0]["reply_text"]
    # Words and voice both finished: the turn ended after the short pause (0.2 s), not the VAD's 0.4 s...
    assert counter(metrics, "cadence_turn_end_verdicts_total", 'reason="finished"') == 1
    # ...and the reply begun at the pause was the one the caller heard.
    assert counter(metrics, "cadence_eager_replies_total", 'outcome="confirmed"') == 1
