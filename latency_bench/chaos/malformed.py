"""Chaos scenario: malformed messages on /ws/twilio and /v1/realtime, against a running server,
while a clean phone call talks alongside.

What the server owes each fault (latency_bench.chaos.inputs.malformed_messages makes them):
    /v1/realtime  every message-level fault is answered with an `error` event, and the session
                  goes on until limits.max_bad_messages; the one past it is closed 1008.
    /ws/twilio    the protocol has no error event: a fault is dropped and counted (a phone call
                  is not cut for one garbled message), and the connection is closed 1008 at the
                  fault past the budget; during the handshake the first fault closes it (1008).
    both          a frame-level fault is refused by the WebSocket layer at once: 1002 for a
                  protocol error, 1007 for a text frame that is not UTF-8.

The faults are sent by latency_bench.chaos.inputs.malformed_fuzzer, in a low-priority process of its own.
`run` returns the figures; `judge` judges them.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict
from pathlib import Path

import httpx

from latency_bench.callers import twilio_caller
from latency_bench.callers.conversation import plan_caller
from latency_bench.chaos.admission import ws_url
from latency_bench.chaos.inputs.malformed_fuzzer import (CLOSE_NOT_UTF8, CLOSE_POLICY, CLOSE_PROTOCOL_ERROR,
                                                         FUZZ_BURSTS, Outcome, in_child_process)
from latency_bench.chaos.server_figures import LOOP_STALL_S, full_collections, loop_probes_later_than
from latency_bench.chaos.verdict import Verdict
from latency_bench.stats import percentile

# Kinds where a lenient reading may still be a valid event (a bool read as an int, a null for an
# optional field): accepted is an answer there; anywhere else it means a fault went unnoticed.
MAY_BE_VALID = frozenset({"wrong_type", "huge_number"})


def expected_close_codes(outcome: Outcome) -> set[int]:
    if outcome.level == "frame":
        return {CLOSE_NOT_UTF8} if outcome.kind == "invalid_utf8" else {CLOSE_PROTOCOL_ERROR}
    return {CLOSE_POLICY}


def wrong_answers(outcomes: list[Outcome]) -> list[Outcome]:
    """Faults with no answer, a close with the wrong code, or a certain fault taken as valid."""
    return [o for o in outcomes if o.answer == "missing"
            or (o.answer == "closed" and o.code not in expected_close_codes(o))
            or (o.answer == "accepted" and o.kind not in MAY_BE_VALID)]


# --- the scenario ------------------------------------------------------------------------------

async def _clean_call(base_url: str, turns: int, seed: int) -> list[float]:
    result = await twilio_caller.call(f"{ws_url(base_url)}/ws/twilio", plan_caller(0, turns, seed=seed))
    return [t.ttfs_ms for t in result.turns if t.ttfs_ms is not None]


def summarize(outcomes: list[Outcome]) -> dict:
    by_answer: dict[str, int] = {}
    for o in outcomes:
        key = f"{o.protocol}/{o.level}/{o.answer}"
        by_answer[key] = by_answer.get(key, 0) + 1
    answered_ms = sorted(o.ms for o in outcomes if o.ms is not None)
    return {
        "faults": len(outcomes),
        "by_answer": dict(sorted(by_answer.items())),
        "close_codes": {f"{o.protocol}/{o.kind}": o.code for o in outcomes if o.answer == "closed"},
        "codes_seen": sorted({o.code for o in outcomes if o.code is not None}),
        "answer_ms": {"p50": percentile(answered_ms, 50), "p95": percentile(answered_ms, 95),
                      "max": answered_ms[-1] if answered_ms else None},
        "wrong_answers": [asdict(o) for o in wrong_answers(outcomes)],
        "accepted_examples": [asdict(o) for o in outcomes if o.answer == "accepted"][:20],
        "accepted": sum(o.answer == "accepted" for o in outcomes),
        "slow": [asdict(o) for o in outcomes if (o.ms or 0) > 100],
    }


def errors_logged(log: Path | None, since_bytes: int) -> list[str]:
    if log is None or not log.exists():
        return []
    with log.open("rb") as f:
        f.seek(since_bytes)
        lines = f.read().decode(errors="replace").splitlines()
    return [line[:300] for line in lines
            if line.startswith("ERROR:") or " ERROR " in line or "| ERROR" in line or "Traceback" in line]


async def run(base_url: str, *, messages: int, budget: int, turns: int, seed: int = 0,
              log: Path | None = None) -> dict:
    """`messages` faults, half to each path, while a clean caller talks `turns` turns; the same caller
    alone first, for its TTFS without the fuzzing. The faults' connections are spread evenly over
    as long as that first call took, so every turn of the call meets the fuzzing (all of it at once
    takes ~7 s; in four bursts of that, ~1.5 s each, most turns met none)."""
    await _clean_call(base_url, 2, seed + 1)  # warm-up: a fresh server's first turns are slow
    call_started = time.monotonic()
    baseline = await _clean_call(base_url, turns, seed)
    call_s = time.monotonic() - call_started
    log_from = log.stat().st_size if log is not None and log.exists() else 0
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as http:
        stalls_before = await loop_probes_later_than(http, LOOP_STALL_S)
        collections_before = await full_collections(http)
    started = time.monotonic()
    clean = asyncio.create_task(_clean_call(base_url, turns, seed))
    realtime, twilio = await in_child_process(base_url, messages=messages, budget=budget, seed=seed, spread_s=call_s)
    fuzz_s = time.monotonic() - started
    alongside = await clean
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as http:
        healthy = (await http.get("/healthz")).status_code == 200
        loop_stalls = await loop_probes_later_than(http, LOOP_STALL_S) - stalls_before
        collections, slow_collections = (after - before for after, before in
                                         zip(await full_collections(http), collections_before))
    return {"messages": messages, "bursts": FUZZ_BURSTS, "budget": budget, "fuzz_seconds": round(fuzz_s, 1),
            "clean_call_seconds": round(call_s, 1),
            "realtime": summarize(realtime), "twilio": summarize(twilio), "server_healthy_after": healthy,
            "errors_logged": errors_logged(log, log_from),
            # An answer slower than 100 ms with no stall here was held up outside the server's loop.
            "server_loop_stalls_over_100ms": int(loop_stalls),
            # Each holds the GIL, the loop with it (agent/gc_pauses.py).
            "server_full_gc": {"collections": int(collections), "over_50ms": int(slow_collections)},
            "clean_call": {"turns": turns, "baseline_ttfs_ms": baseline, "alongside_ttfs_ms": alongside,
                           "baseline_p95": percentile(baseline, 95), "alongside_p95": percentile(alongside, 95)}}


def judge(f: dict) -> Verdict:
    sides = (f["realtime"], f["twilio"])
    wrong = sum(len(side["wrong_answers"]) for side in sides)
    slowest = max((side["answer_ms"]["max"] or 0) for side in sides)
    answers: dict[str, int] = {}
    for side in sides:
        for key, count in side["by_answer"].items():
            answer = key.rsplit("/", 1)[1]
            answers[answer] = answers.get(answer, 0) + count
    base, along = f["clean_call"]["baseline_p95"], f["clean_call"]["alongside_p95"]
    ttfs_change = (along / base - 1) * 100 if base and along else None
    passed = (f["server_healthy_after"] and not f["errors_logged"] and wrong == 0 and slowest <= 100
              and ttfs_change is not None and ttfs_change <= 10)
    codes = sorted({*f["realtime"]["codes_seen"], *f["twilio"]["codes_seen"]})
    return Verdict("malformed", f"{f['messages']} malformed messages on /ws/twilio and /v1/realtime: 0 crashes, "
                                "each answered (error event, or close 1002/1007/1008) within 100 ms; a clean call "
                                "alongside keeps its TTFS p95 within 10 %",
                   f"{sum(answers.values())} faults: {answers.get('error_event', 0)} error events, "
                   f"{answers.get('closed', 0)} closes {codes}, {answers.get('dropped', 0)} dropped within the "
                   f"budget, {answers.get('accepted', 0)} read as valid (lenient types); {wrong} unanswered or "
                   f"wrong; slowest answer {slowest} ms (server loop stalls over 100 ms meanwhile: "
                   f"{f.get('server_loop_stalls_over_100ms', '?')}); {len(f['errors_logged'])} errors logged; clean call TTFS "
                   f"p95 {base or 0:.0f} -> {along or 0:.0f} ms"
                   + (f" ({ttfs_change:+.0f} %)" if ttfs_change is not None else ""), passed, f)
