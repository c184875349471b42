"""The malformed-message fuzzer of chaos malformed: sends latency_bench.chaos.inputs.malformed_messages' faults
to /ws/twilio and /v1/realtime and records how each was answered (an `Outcome`).

It runs in a process of its own at a low priority (`in_child_process`): on a machine that also
runs the server, a fuzzer sharing the bench's process and priority takes CPU the server would
otherwise have, and the clean call alongside then measures the fuzzer rather than the server.
An attacker's CPU is not the server's. Its answer times are measured here, in the low-priority
process, so they are if anything later than the server's.

A Realtime fault's answer is told from acceptance by a probe sent right after it
(`input_audio_buffer.clear`, answered `input_audio_buffer.cleared`): events leave in order, so an
`error` before the probe's answer is the fault's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from dataclasses import asdict, dataclass

import websockets

from latency_bench.chaos.admission import REFUSED_RETRIES, REFUSED_RETRY_S, connect_admitted, start_event
from latency_bench.chaos.inputs.malformed_messages import Fault, faults

CLOSE_PROTOCOL_ERROR, CLOSE_NOT_UTF8, CLOSE_POLICY, CLOSE_TRY_LATER = 1002, 1007, 1008, 1013
CLOSE_WAIT_S = 2.0  # a close expected now that has not come by then is reported as missing
ANSWER_WAIT_S = 5.0
# The faults are sent in this many bursts, one after another over the clean call. Each burst
# still holds more message faults per path (1,000 / 2 / 4 = 125) than limits.max_bad_messages
# (50), so the close at the budget is reached in every one.
FUZZ_BURSTS = 4
FUZZER_NICE = 19


@dataclass(frozen=True)
class Outcome:
    protocol: str
    kind: str
    level: str
    answer: str  # error_event | closed | accepted | dropped | missing
    code: int | None = None
    ms: float | None = None
    example: str | None = None  # the fault, cut short, where the answer is worth a look


class Spread:
    """Starts `units` pieces of work evenly over `seconds` (0: back to back), so the fuzzing runs
    alongside a whole call at a steady rate instead of in bursts a second long between its turns."""

    def __init__(self, seconds: float, units: int, *, clock=time.monotonic, sleep=asyncio.sleep) -> None:
        self._clock, self._sleep = clock, sleep
        self._start = clock()
        self._gap = seconds / max(1, units)
        self._started = 0

    async def next(self) -> None:
        await self._sleep(max(0.0, self._start + self._started * self._gap - self._clock()))
        self._started += 1


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


async def fuzz_realtime(base_url: str, batch: list[Fault], *, budget: int, spread_s: float = 0.0) -> list[Outcome]:
    """Each frame fault gets a session of its own; the message faults share one, back to back,
    until it is closed at the budget (a session left waiting is closed for its silence). The
    sessions start evenly over `spread_s`."""
    outcomes: list[Outcome] = []
    frames = [f for f in batch if f.level == "frame"]
    messages = [f for f in batch if f.level == "message"]
    spread = Spread(spread_s, len(frames) + -(-len(messages) // (budget + 1)))
    for fault in frames:
        await spread.next()
        outcomes.append(await _send_frame_fault(await _realtime_session(base_url), fault, "realtime"))
    ws = None
    for fault in messages:
        if ws is None:
            await spread.next()
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


async def fuzz_twilio(base_url: str, batch: list[Fault], *, budget: int, handshake_every: int = 10,
                      spread_s: float = 0.0) -> list[Outcome]:
    """Frame faults each on a call of their own; every `handshake_every`-th message fault is the first
    message after `connected` (closed at once; 0: none); the rest go to calls, `budget` + a few per call.
    The connections start evenly over `spread_s` (a call's own faults go at once: a call that
    dawdled would be hung up for silence)."""
    outcomes: list[Outcome] = []
    messages = [f for f in batch if f.level == "message"]
    frames = [f for f in batch if f.level == "frame"]
    in_handshake = messages[::handshake_every] if handshake_every else []
    in_calls = [f for i, f in enumerate(messages) if not handshake_every or i % handshake_every]
    per_call = budget + 5  # a few spare: a fault the server accepts moves the close one on
    spread = Spread(spread_s, len(frames) + len(in_handshake) + -(-len(in_calls) // per_call))
    for n, fault in enumerate(frames):
        await spread.next()
        outcomes += await _until_admitted(lambda: _twilio_frame(base_url, fault, 10_000 + n))
    for fault in in_handshake:
        await spread.next()
        outcomes += await _until_admitted(lambda: _twilio_handshake(base_url, fault))
    for n, first in enumerate(range(0, len(in_calls), per_call)):
        chunk = in_calls[first:first + per_call]
        await spread.next()
        outcomes += await _until_admitted(lambda: _twilio_call(base_url, chunk, budget, 20_000 + n))
    return outcomes


# --- bursts, in a process of their own ----------------------------------------------------------

async def fuzz_in_bursts(base_url: str, *, messages: int, budget: int, seed: int,
                         spread_s: float) -> tuple[list[Outcome], list[Outcome]]:
    """`messages` faults, half to each path, in FUZZ_BURSTS bursts one after another over
    `spread_s`, each burst's connections spread evenly over its share (half of it to each path).
    One fuzzer at a time: with the clean call and a call still ending, that fits a cap of 4."""
    started = time.monotonic()
    share = spread_s / FUZZ_BURSTS
    realtime_faults = faults("realtime", messages // 2, seed=seed)
    twilio_faults = faults("twilio", messages - messages // 2, seed=seed)
    realtime: list[Outcome] = []
    twilio: list[Outcome] = []
    for burst in range(FUZZ_BURSTS):
        await asyncio.sleep(max(0.0, started + burst * share - time.monotonic()))
        realtime += await fuzz_realtime(base_url, realtime_faults[burst::FUZZ_BURSTS], budget=budget,
                                        spread_s=share / 2)
        twilio += await fuzz_twilio(base_url, twilio_faults[burst::FUZZ_BURSTS], budget=budget, spread_s=share / 2)
    return realtime, twilio


async def in_child_process(base_url: str, *, messages: int, budget: int, seed: int, spread_s: float,
                           nice: int = FUZZER_NICE) -> tuple[list[Outcome], list[Outcome]]:
    """`fuzz_in_bursts` in a child process at `nice`; its outcomes come back as JSON on its stdout."""
    child = await asyncio.create_subprocess_exec(
        "nice", "-n", str(nice), sys.executable, "-m", "latency_bench", "malformed-fuzzer", base_url,
        "--messages", str(messages), "--budget", str(budget), "--seed", str(seed), "--spread-s", str(spread_s),
        stdout=asyncio.subprocess.PIPE)
    try:
        out, _ = await child.communicate()
    finally:
        if child.returncode is None:  # cancelled: the fuzzer stops with the scenario
            child.kill()
            await child.wait()
    if child.returncode != 0:
        raise RuntimeError(f"the fuzzer's process failed (exit {child.returncode}); its stderr is above")
    sides = json.loads(out)
    return [Outcome(**o) for o in sides["realtime"]], [Outcome(**o) for o in sides["twilio"]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m latency_bench malformed-fuzzer", description=__doc__.split("\n\n")[0])
    parser.add_argument("base_url")
    parser.add_argument("--messages", type=int, required=True)
    parser.add_argument("--budget", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--spread-s", type=float, default=0.0)
    args = parser.parse_args(argv)
    realtime, twilio = asyncio.run(fuzz_in_bursts(args.base_url, messages=args.messages, budget=args.budget,
                                                  seed=args.seed, spread_s=args.spread_s))
    json.dump({"realtime": [asdict(o) for o in realtime], "twilio": [asdict(o) for o in twilio]}, sys.stdout)
    return 0
