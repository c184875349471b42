"""Bad audio on /ws/twilio and /v1/realtime (issue 13, scenario 7): the chaos bench's own cases
(latency_bench/chaos/inputs/bad_audio.py) on fake engines. The VAD is the real Silero, so the good utterance
after each case is real speech, as the bench's callers speak it (espeak-ng). Each case is handled
(the call goes on and answers the good utterance) or closed with a reason and stored so; nothing
crashes, and nothing is logged as an error."""

from __future__ import annotations

from dataclasses import replace

import pytest

from latency_bench.chaos import bad_audio
from latency_bench.chaos.inputs.bad_audio import ANSWERED, CASES, ERROR_ANSWERED, IDLE_TIMEOUT
from pipelines.voice import Engines
from tests.conftest import TEST_MAX_CALLS, running_server
from tests.fakes import HashingEmbedder, ScriptedASR, ScriptedLLM, ToneTTS
from tests.test_bad_input import server_errors  # noqa: F401 - a fixture

BAD_SECONDS = 1.5
IDLE_TIMEOUT_S = 2.0
QUIET_S = 1.0  # the fakes answer within ~0.5 s
ASKED = "When do you open?"  # what the scripted ASR hears in any turn
SILENCE = tuple(c for c in CASES if c.owed == IDLE_TIMEOUT)
NOT_SILENCE = tuple(c for c in CASES if c.owed != IDLE_TIMEOUT)


def fake_engines() -> Engines:
    return Engines(asr=ScriptedASR(ASKED), llm=ScriptedLLM(["We open at eight."]),
                   tts=ToneTTS(chunks=4), embedder=HashingEmbedder())


def by_case(figures: dict) -> dict[str, dict]:
    return {f["case"]: f for f in figures["cases"]}


def assert_owed(figures: dict) -> None:
    short = {f["case"]: s for f in figures["cases"]
             if (s := bad_audio.shortfalls(f, idle_timeout_s=figures["idle_timeout_s"]))}
    assert short == {}
    assert figures["server_healthy_after"]


@pytest.mark.slow
async def test_bad_audio_is_survived_and_the_next_good_audio_answered(server_config, server_errors):
    with running_server(server_config, fake_engines()) as server:
        figures = await bad_audio.run(server.base_url, bad_seconds=BAD_SECONDS, quiet_s=QUIET_S,
                                      cases=NOT_SILENCE, concurrency=TEST_MAX_CALLS)
    assert_owed(figures)
    cases = by_case(figures)
    assert "only audio/x-mulaw@8000" in cases["twilio/start_declares_16khz"]["close_reason"]
    # Noise, floats, Opus and mis-read bytes are not speech to the VAD: no turn starts; the one
    # turn stored is the good utterance's.
    for case in NOT_SILENCE:
        if case.garbage and case.owed in (ANSWERED, ERROR_ANSWERED):
            assert cases[case.key]["stored"]["user_texts"] == [ASKED], case.key
            assert cases[case.key]["speech_started_in_bad_audio"] in (0, None), case.key
    assert cases["realtime/session_declares_16khz"]["first_error"].startswith("unsupported: audio/pcm is served at")
    # An odd-length append is refused each time; past the budget the session is closed, saying why.
    odd = cases["realtime/odd_lengths"]
    assert "whole 16-bit samples" in odd["first_error"] and "whole 16-bit samples" in odd["close_reason"]
    assert server_errors == []


@pytest.mark.slow
async def test_silence_is_hung_up_at_the_idle_timeout_and_told_why(server_config, server_errors):
    """Found by this scenario: the idle close was a bare 1000, read by the client as a normal end."""
    config = replace(server_config, limits=replace(server_config.limits, idle_timeout_seconds=IDLE_TIMEOUT_S))
    with running_server(config, fake_engines()) as server:
        figures = await bad_audio.run(server.base_url, cases=SILENCE, idle_timeout_s=IDLE_TIMEOUT_S)
    assert_owed(figures)
    for case in figures["cases"]:
        assert (case["close_code"], case["close_reason"]) == (1000, "idle timeout: nobody spoke for 2 s")
    assert server_errors == []


@pytest.mark.parametrize("owed", sorted({c.owed for c in CASES}))
def test_every_kind_of_answer_owed_is_judged(owed):
    """A case's figures that show nothing at all fall short of whatever it is owed."""
    nothing = {"case": "x", "owed": owed, "outcome": "crashed", "close_code": 1006, "close_reason": "",
               "closed_after_s": None, "error_events": 0, "first_error": None, "bad_audio_answered": True,
               "garbage": True, "good_answered": False, "good_error": "no reply", "stored": None}
    assert bad_audio.shortfalls(nothing, idle_timeout_s=1.0)
