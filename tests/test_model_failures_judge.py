"""How `chaos model-failures` judges each fault case, on made-up figures."""

from __future__ import annotations

from datetime import datetime

import pytest

from latency_bench.callers.listen import TurnRecord
from latency_bench.chaos.model_failures import _known_at, judge, stalls_logged


def figures(*cases: dict, baseline_p95_ms: float = 3000.0, baseline_turns: int = 6) -> dict:
    return {"faults": [{"fault": "asr killed", "answered": True, "back_after_s": 3.0, "next_turn_answered": True,
                        **case} for case in cases],
            "clean_caller": {"baseline_p95_ms": baseline_p95_ms, "during_p95_ms": baseline_p95_ms,
                             "during_unanswered": 0, "baseline_turns": baseline_turns}}


def test_an_apology_must_come_within_two_seconds_of_the_failure_being_known():
    assert judge(figures({"answer_after_known_ms": 1900, "apology": True, "ttfs_ms": 1900})).passed
    assert not judge(figures({"answer_after_known_ms": 2100, "apology": True, "ttfs_ms": 2100})).passed


def test_a_real_reply_passes_when_the_caller_could_not_tell_the_fault_from_a_healthy_turn():
    masked = {"answer_after_known_ms": 2800, "apology": False, "ttfs_ms": 2800}
    assert judge(figures(masked, baseline_p95_ms=3000)).passed
    verdict = judge(figures(masked, baseline_p95_ms=2500))  # later than a healthy turn, and past 2 s
    assert not verdict.passed and "reply, TTFS 2800 ms" in verdict.measured


def test_an_unheard_turn_fails_whatever_else_holds():
    assert not judge(figures({"answer_after_known_ms": None, "answered": False, "apology": False,
                              "ttfs_ms": None})).passed


LOG = """\
2026-12-05 10:41:18.500 | INFO     | agent.calls:... call started
2026-12-05 10:41:24.840 | ERROR    | pipecat.processors.frame_processor:push_error_frame:1023 - EngineLLMService#1 \
exception (/work/main/models/stalls.py:51): LLM unavailable: LLM reply: no first answer within 9.3 s
2026-12-05 10:41:26,100 ERROR pipelines.llm: LLM reply: no first answer within 6.0 s
2026-12-05 10:41:21,700 WARNING pipelines.stt: transcript lost, the caller hears an apology: no transcript within 5.4 s
2026-12-05 10:41:40,000 WARNING pipelines.stt: transcript lost, the caller hears an apology: no transcript within 4.0 s
2026-12-05 10:41:52,200 WARNING models.remote: asr worker at http://127.0.0.1:8201 went silent: no answer 1.6 s into \
a request, none to its health probe within 1.0 s; passed over for 30 s
"""


def _at(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f").timestamp()


def test_the_llm_deadline_the_server_logged_is_read_with_its_time():
    assert stalls_logged(LOG, "llm") == [(_at("2026-12-05 10:41:24.840"), 9.3), (_at("2026-12-05 10:41:26.100"), 6.0)]
    assert stalls_logged(LOG, "asr") == [(_at("2026-12-05 10:41:21.700"), 5.4), (_at("2026-12-05 10:41:40.000"), 4.0),
                                         (_at("2026-12-05 10:41:52.200"), 1.6)]


def test_a_stopped_llm_is_known_when_the_server_gave_up_on_that_turn():
    deadlines = {"llm": lambda seconds: 6.0, "asr": lambda seconds: 3.0 + 0.5 * seconds}
    turn = TurnRecord(caller=0, index=0, text="hours?", voice="en", utterance_seconds=2.0)
    turn.speech_end_at = _at("2026-12-05 10:41:15.500")
    case = {"role": "llm", "kind": "stopped", "fault_at": turn.speech_end_at - 1.0}
    stalls = {role: stalls_logged(LOG, role) for role in ("llm", "asr")}
    # The 9.3 s stall fits this turn (15.5 + 9.3 = 24.8); the 6.0 s one at 26.1 belongs to another turn.
    assert _known_at(case, turn, deadlines, stalls) == pytest.approx(_at("2026-12-05 10:41:24.840"))
    assert _known_at(case, turn, deadlines, {}) == pytest.approx(turn.speech_end_at + 6.0)  # none logged: the base
    killed = dict(case, kind="killed")
    assert _known_at(killed, turn, deadlines, stalls) == turn.speech_end_at
    asr = dict(case, role="asr")
    assert _known_at(asr, turn, deadlines, {}) == pytest.approx(turn.speech_end_at + 4.0)  # none logged


def test_a_stopped_asr_is_known_when_the_server_gave_up_on_the_transcript_begun_after_that_turn_ended():
    deadlines = {"asr": lambda seconds: 3.0 + 0.5 * seconds}
    turn = TurnRecord(caller=0, index=0, text="hours?", voice="en", utterance_seconds=2.0)
    turn.speech_end_at = _at("2026-12-05 10:41:15.500")
    case = {"role": "asr", "kind": "stopped", "fault_at": turn.speech_end_at - 1.0}
    stalls = {"asr": stalls_logged(LOG, "asr")}
    # The 5.4 s stall's request began at 16.3, 0.8 s after the end of speech (the VAD's wait):
    # known then, 1.4 s past the configured deadline counted from the end of speech (15.5 + 4.0).
    # The 4.0 s one began at 36.0, another turn's.
    assert _known_at(case, turn, deadlines, stalls) == pytest.approx(_at("2026-12-05 10:41:21.700"))
    stuck = TurnRecord(caller=0, index=2, text="lunch?", voice="en", utterance_seconds=2.0)
    stuck.speech_end_at = _at("2026-12-05 10:41:50.000")  # its worker found silent by its probe 1.6 s into the request
    assert _known_at(dict(case, fault_at=stuck.speech_end_at), stuck, deadlines, stalls) == \
        pytest.approx(_at("2026-12-05 10:41:52.200"))
    later = TurnRecord(caller=0, index=1, text="parking?", voice="en", utterance_seconds=2.0)
    later.speech_end_at = _at("2026-12-05 10:41:25.000")  # no logged request began within its wait
    assert _known_at(dict(case, fault_at=later.speech_end_at), later, deadlines, stalls) == \
        pytest.approx(later.speech_end_at + 4.0)


def test_of_several_replicas_the_fault_goes_to_the_one_serving_the_turn_and_waits_while_that_is_unclear():
    from latency_bench.chaos.model_failures import Worker, serving_replica

    workers = {"asr": Worker("asr", 10, "http://127.0.0.1:1"), "llm-0": Worker("llm-0", 11, "http://127.0.0.1:2"),
               "llm-1": Worker("llm-1", 12, "http://127.0.0.1:3")}

    def health(*in_flight: int) -> dict:
        urls = ("http://127.0.0.1:2", "http://127.0.0.1:3")
        return {"engines": {"llm": {"replicas": [{"url": url, "in_flight": n} for url, n in zip(urls, in_flight)]}}}

    assert serving_replica(health(0, 1), "llm", workers) == workers["llm-1"]
    assert serving_replica(health(2, 0), "llm", workers) == workers["llm-0"]  # both callers' replies there
    assert serving_replica(health(1, 1), "llm", workers) is None  # which is the faulted turn's: unknown yet
    assert serving_replica(health(0, 0), "llm", workers) is None
    assert serving_replica({"engines": {}}, "llm", workers) is None


def test_a_baseline_of_too_few_healthy_turns_judges_nothing():
    healthy = {"answer_after_known_ms": 500, "apology": True, "ttfs_ms": 900}
    assert judge(figures(healthy, baseline_turns=4)).passed
    verdict = judge(figures(healthy, baseline_turns=3))
    assert not verdict.passed and "baseline only 3 turns" in verdict.measured
