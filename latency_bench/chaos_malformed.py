"""Chaos scenario: malformed messages on /ws/twilio and /v1/realtime, against a running server,
while a clean phone call talks alongside.

What the server owes each fault (latency_bench.malformed_messages makes them):
    /v1/realtime  every message-level fault is answered with an `error` event, and the session
                  goes on until limits.max_bad_messages; the one past it is closed 1008.
    /ws/twilio    the protocol has no error event: a fault is dropped and counted (a phone call
                  is not cut for one garbled message), and the connection is closed 1008 at the
                  fault past the budget; during the handshake the first fault closes it (1008).
    both          a frame-level fault is refused by the WebSocket layer at once: 1002 for a
                  protocol error, 1007 for a text frame that is not UTF-8.

A Realtime fault's answer is told from acceptance by a probe sent right after it
(`input_audio_buffer.clear`, answered `input_audio_buffer.cleared`): events leave in order, so an
`error` before the probe's answer is the fault's. `run` returns the figures; chaos.py judges.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import websockets

from latency_bench import twilio_caller
from latency_bench.chaos_admission import REFUSED_RETRIES, REFUSED_RETRY_S, connect_admitted, start_event, ws_url
from latency_bench.conversation import plan_caller
from latency_bench.malformed_messages import Fault, faults
from latency_bench.server_figures import LOOP_STALL_S, full_collections, loop_probes_later_than
from latency_bench.stats import percentile

CLOSE_PROTOCOL_ERROR, CLOSE_NOT_UTF8, CLOSE_POLICY, CLOSE_TRY_LATER = 1002, 1007, 1008, 1013
# Kinds where a lenient reading may still be a valid event (a bool read as an int, a null for an
# optional field): accepted is an answer there; anywhere else it means a fault went unnoticed.
MAY_BE_VALID = frozenset({"wrong_type", "huge_number"})
CLOSE_WAIT_S = 2.0  # a close expected now that has not come by then is reported as missing
ANSWER_WAIT_S = 5.0
# The faults are sent in this many bursts spread over the clean call. Each burst still holds
# more message faults per path (1,000 / 2 / 4 = 125) than limits.max_bad_messages (50), so the
# close at the budget is reached in every one.
FUZZ_BURSTS = 4


@dataclass(frozen=True)
class Outcome:
    protocol: str
    kind: str
    level: str
    answer: str  # error_event | closed | accepted | dropped | missing
    code: int | None = None
    ms: float | None = None
    example: str | None = None  # the fault, cut short, where the answer is worth a look


def expected_close_codes(outcome: Outcome) -> set[int]:
    if outcome.level == "frame":
        return {CLOSE_NOT_UTF8} if outcome.kind == "invalid_utf8" else {CLOSE_PROTOCOL_ERROR}
    return {CLOSE_POLICY}


def wrong_answers(outcomes: list[Outcome]) -> list[Outcome]:
    """Faults with no answer, a close with the wrong code, or a certain fault taken as valid."""
    return [o for o in outcomes if o.answer == "missing"
            or (o.answer == "closed" and o.code not in expected_close_codes(o))
            or (o.answer == "accepted" and o.kind not in MAY_BE_VALID)]


def _short(data: str | bytes) -> str:
    return repr(data[:160])


async def _closed_within(ws, seconds: float) -> bool:
    try:
        async with asyncio.timeout(seconds):
            async for _ in ws:
                pass
    except (TimeoutError, websockets.ConnectionClosed):
        pass
    return ws.close_code is not None


async def _send_frame_fault(ws, fault: Fault, protocol: str) -> Outcome:
    sent = time.monotonic()
    ws.transport.write(fault.data)  # below the client library: it would never send such a frame
    closed = await _closed_within(ws, CLOSE_WAIT_S)
    ms = round((time.monotonic() - sent) * 1000, 1)
    await ws.close()
    if not closed:
        return Outcome(protocol, fault.kind, "frame", "missing", example=_short(fault.data))
    return Outcome(protocol, fault.kind, "frame", "closed", ws.close_code, ms)


# --- /v1/realtime -----------------------------------------------------------------------------

async def _realtime_session(base_url: str):
    ws = await connect_admitted(base_url, "/v1/realtime")
    async with asyncio.timeout(ANSWER_WAIT_S):
        while json.loads(await ws.recv()).get("type") != "session.created":
            pass
    return ws


async def _realtime_answer(ws, fault: Fault) -> Outcome:
    sent = time.monotonic()
    try:
        await ws.send(fault.data)
        await ws.send(json.dumps({"type": "input_audio_buffer.clear", "event_id": "probe"}))
        answered_ms = None
        async with asyncio.timeout(ANSWER_WAIT_S):
            while True:  # read through to the probe's answer, so the next fault starts clean
                event = json.loads(await ws.recv())
                if event.get("type") == "error" and answered_ms is None:
                    answered_ms = round((time.monotonic() - sent) * 1000, 1)
                if event.get("type") == "input_audio_buffer.cleared":
                    break
        if answered_ms is None:
            return Outcome("realtime", fault.kind, "message", "accepted", example=_short(fault.data))
        return Outcome("realtime", fault.kind, "message", "error_event", ms=answered_ms)
    except websockets.ConnectionClosed:
        return Outcome("realtime", fault.kind, "message", "closed", ws.close_code,
                       round((time.monotonic() - sent) * 1000, 1))
    except TimeoutError:
        return Outcome("realtime", fault.kind, "message", "missing", example=_short(fault.data))


async def fuzz_realtime(base_url: str, batch: list[Fault], *, budget: int) -> list[Outcome]:
    """Message faults share a session until it is closed at the budget; each frame fault gets its own."""
    outcomes: list[Outcome] = []
    ws = None
    for fault in batch:
        if fault.level == "frame":
            outcomes.append(await _send_frame_fault(await _realtime_session(base_url), fault, "realtime"))
            continue
        if ws is None:
            ws, errors = await _realtime_session(base_url), 0
        outcome = await _realtime_answer(ws, fault)
        errors += outcome.answer == "error_event"
        if outcome.answer == "error_event" and errors > budget:
            # The fault past the budget: its error, then the close (1008).
            closed = await _closed_within(ws, CLOSE_WAIT_S)
            outcome = Outcome("realtime", fault.kind, "message", "closed" if closed else "missing", ws.close_code,
                              outcome.ms)
        outcomes.append(outcome)
        if ws.close_code is not None:
            ws = None
    if ws is not None:
        await ws.close()
    return outcomes


# --- /ws/twilio -------------------------------------------------------------------------------

async def _phone_call(base_url: str, n: int, *, start: bool = True):
    ws = await connect_admitted(base_url, "/ws/twilio")
    await ws.send(json.dumps({"event": "connected"}))
    if start:
        await ws.send(start_event(n))
    return ws


async def _twilio_past_budget(ws, faults_in_call: list[Fault], budget: int) -> list[Outcome]:
    """Faults on a live call: the first `budget` are dropped (the call must stay up); the ones after
    are sent one at a time until the server closes, each given `CLOSE_WAIT_S / 10` to do it."""
    outcomes = []
    for fault in faults_in_call[:budget]:
        await ws.send(fault.data)
        outcomes.append(Outcome("twilio", fault.kind, "message", "dropped"))
    for fault in faults_in_call[budget:]:
        sent = time.monotonic()
        with contextlib.suppress(websockets.ConnectionClosed):
            await ws.send(fault.data)
        if await _closed_within(ws, CLOSE_WAIT_S / 10):
            outcomes.append(Outcome("twilio", fault.kind, "message", "closed", ws.close_code,
                                    round((time.monotonic() - sent) * 1000, 1)))
            return outcomes
        outcomes.append(Outcome("twilio", fault.kind, "message", "accepted", example=_short(fault.data)))
    return outcomes


async def _until_admitted(attempt):
    """`attempt()` again while the server refuses it as full (1013): a phone socket is accepted
    first and refused after, and the slot of a call just closed is free only once it has ended."""
    for _ in range(REFUSED_RETRIES):
        try:
            outcome = await attempt()
        except websockets.ConnectionClosed as exc:  # refused before the fault was even sent
            if exc.rcvd is None or exc.rcvd.code != CLOSE_TRY_LATER:
                raise
        else:
            if not any(o.code == CLOSE_TRY_LATER for o in outcome):
                return outcome
        await asyncio.sleep(REFUSED_RETRY_S)
    raise RuntimeError(f"/ws/twilio: still refused after {REFUSED_RETRIES} tries")


async def _twilio_frame(base_url: str, fault: Fault, n: int) -> list[Outcome]:
    return [await _send_frame_fault(await _phone_call(base_url, n), fault, "twilio")]


async def _twilio_handshake(base_url: str, fault: Fault) -> list[Outcome]:
    ws = await _phone_call(base_url, 0, start=False)
    sent = time.monotonic()
    with contextlib.suppress(websockets.ConnectionClosed):
        await ws.send(fault.data)
    closed = await _closed_within(ws, CLOSE_WAIT_S)
    await ws.close()
    return [Outcome("twilio", fault.kind, "handshake", "closed" if closed else "missing", ws.close_code,
                    round((time.monotonic() - sent) * 1000, 1))]


async def _twilio_call(base_url: str, chunk: list[Fault], budget: int, n: int) -> list[Outcome]:
    ws = await _phone_call(base_url, n)
    if len(chunk) > budget:
        outcomes = await _twilio_past_budget(ws, chunk, budget)
    else:
        for fault in chunk:
            await ws.send(fault.data)
        outcomes = [Outcome("twilio", f.kind, "message", "dropped") for f in chunk]
    if ws.close_code is None:
        with contextlib.suppress(websockets.ConnectionClosed):
            await ws.send(json.dumps({"event": "stop"}))
        await _closed_within(ws, CLOSE_WAIT_S)
        if ws.close_code == CLOSE_TRY_LATER:  # refused, not hung up: the caller tries again
            return [Outcome("twilio", "refused", "message", "closed", CLOSE_TRY_LATER)]
    await ws.close()
    return outcomes


async def fuzz_twilio(base_url: str, batch: list[Fault], *, budget: int, handshake_every: int = 10) -> list[Outcome]:
    """Frame faults each on a call of their own; every `handshake_every`-th message fault is the first
    message after `connected` (closed at once; 0: none); the rest go to calls, `budget` + a few per call."""
    outcomes: list[Outcome] = []
    messages = [f for f in batch if f.level == "message"]
    in_handshake = messages[::handshake_every] if handshake_every else []
    in_calls = [f for i, f in enumerate(messages) if not handshake_every or i % handshake_every]
    for n, fault in enumerate(f for f in batch if f.level == "frame"):
        outcomes += await _until_admitted(lambda: _twilio_frame(base_url, fault, 10_000 + n))
    for fault in in_handshake:
        outcomes += await _until_admitted(lambda: _twilio_handshake(base_url, fault))
    per_call = budget + 5  # a few spare: a fault the server accepts moves the close one on
    for n, first in enumerate(range(0, len(in_calls), per_call)):
        chunk = in_calls[first:first + per_call]
        outcomes += await _until_admitted(lambda: _twilio_call(base_url, chunk, budget, 20_000 + n))
    return outcomes


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
    alone first, for its TTFS without the fuzzing. The faults go in FUZZ_BURSTS bursts spread over
    as long as that first call took, so the fuzzing runs alongside the whole call, not only its
    first turn (all of it at once takes ~7 s)."""
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
    realtime_faults = faults("realtime", messages // 2, seed=seed)
    twilio_faults = faults("twilio", messages - messages // 2, seed=seed)
    realtime: list[Outcome] = []
    twilio: list[Outcome] = []
    for burst in range(FUZZ_BURSTS):
        await asyncio.sleep(max(0.0, started + burst * call_s / FUZZ_BURSTS - time.monotonic()))
        # One fuzzer at a time: with the clean call and a call still ending, that fits a cap of 4.
        realtime += await fuzz_realtime(base_url, realtime_faults[burst::FUZZ_BURSTS], budget=budget)
        twilio += await fuzz_twilio(base_url, twilio_faults[burst::FUZZ_BURSTS], budget=budget)
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
