"""How `chaos model-failures` judges each fault case, on made-up figures."""

from __future__ import annotations

from latency_bench.chaos_model_failures import judge


def figures(*cases: dict, baseline_p95_ms: float = 3000.0) -> dict:
    return {"faults": [{"fault": "asr killed", "answered": True, "back_after_s": 3.0, "next_turn_answered": True,
                        **case} for case in cases],
            "clean_caller": {"baseline_p95_ms": baseline_p95_ms, "during_p95_ms": baseline_p95_ms,
                             "during_unanswered": 0}}


def test_an_apology_must_come_within_two_seconds_of_the_failure_being_known():
    assert judge(figures({"answer_after_known_ms": 1900, "apology": True, "ttfs_ms": 1900}))["passed"]
    assert not judge(figures({"answer_after_known_ms": 2100, "apology": True, "ttfs_ms": 2100}))["passed"]


def test_a_real_reply_passes_when_the_caller_could_not_tell_the_fault_from_a_healthy_turn():
    masked = {"answer_after_known_ms": 2800, "apology": False, "ttfs_ms": 2800}
    assert judge(figures(masked, baseline_p95_ms=3000))["passed"]
    verdict = judge(figures(masked, baseline_p95_ms=2500))  # later than a healthy turn, and past 2 s
    assert not verdict["passed"] and "reply, TTFS 2800 ms" in verdict["measured"]


def test_an_unheard_turn_fails_whatever_else_holds():
    assert not judge(figures({"answer_after_known_ms": None, "answered": False, "apology": False,
                              "ttfs_ms": None}))["passed"]
