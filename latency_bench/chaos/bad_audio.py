"""Chaos scenario: bad audio on /ws/twilio and /v1/realtime, against a running server
(issue 13, scenario 7). The cases, and what the server owes each, are in latency_bench.chaos.inputs.bad_audio.

Each case is one call: the client sends `bad_seconds` of its bad audio in real time, waits
until the line is quiet (a reply to the bad audio, if one came, has ended), then speaks a good
utterance from the bench's own callers and listens for the reply; "never left mute for the next
good audio" is that reply heard. Silence cases send silence until the server ends the call. The
server's stored call says how it ended. `run` returns the figures; `judge` judges them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import websockets

from latency_bench.callers.audio import mulaw_decode, mulaw_encode
from latency_bench.callers.conversation import PacedLine, PlannedTurn, converse
from latency_bench.callers.listen import ReplyTracker, TurnRecord
from latency_bench.callers.speech import utterance_for
from latency_bench.chaos.admission import connect_admitted
from latency_bench.chaos.inputs.bad_audio import (CASES, CLOSED_BAD_INPUT, ERROR_ANSWERED, IDLE_TIMEOUT, PHONE_RATE,
                                                  REALTIME_RATE, REFUSED, BadAudio, Case, Material)
from latency_bench.chaos.malformed import errors_logged
from latency_bench.chaos.verdict import Verdict
from latency_bench.stats import percentile

CLOSE_POLICY, CLOSE_TRY_LATER = 1008, 1013
CRASH_CODES = frozenset({1006, 1011})  # no close frame (the connection dropped), internal error
SETTLE_MAX_S = 30.0  # a reply to the bad audio still going after this is reported as the good turn's error
CLOSE_WAIT_S = 5.0  # a close the server owes now
IDLE_SLACK_S = 5.0  # an idle call must be ended within the idle timeout plus this
STORED_WAIT_S = 10.0  # for the server to store a call as ended after its socket closed
RETRY_FULL_S, MAX_REFUSALS = 0.2, 100  # a call refused as full (a slot still ending) tries again


@dataclass(frozen=True)
class CallPlan:
    good: PlannedTurn  # spoken once the bad audio is over and the line is quiet
    # The server's limits.idle_timeout_seconds: silence cases send silence this long (plus slack).
    idle_timeout_s: float
    # No reply audio for this long after the bad audio: the line is quiet. Longer than the server's
    # TTFS, or a late reply to the bad audio would be heard as the good utterance's.
    quiet_s: float


@dataclass
class CaseRun:
    """What one case's call saw, from the client's side."""

    case: Case
    closed_by_server: bool = False
    close_code: int | None = None
    close_reason: str = ""
    closed_after_s: float | None = None  # from the first bad payload
    error_events: list[str] = field(default_factory=list)  # Realtime `error` events: code: message
    speech_started: int = 0  # Realtime: input_audio_buffer.speech_started during the bad audio
    bad_turn: TurnRecord | None = None
    good_turn: TurnRecord | None = None
    call_id: str | None = None  # the server's (Realtime) or the caller's (Twilio callSid) id
    stored: dict | None = None

    def figures(self) -> dict:
        bad, good = self.bad_turn, self.good_turn
        outcome = ("crashed" if self.close_code in CRASH_CODES or (self.stored or {}).get("end_reason") == "error"
                   else "closed" if self.closed_by_server else "handled")
        return {
            "case": self.case.key, "owed": self.case.owed, "what": self.case.what, "outcome": outcome,
            "close_code": self.close_code if self.closed_by_server else None,
            "close_reason": self.close_reason if self.closed_by_server else None,
            "closed_after_s": self.closed_after_s, "error_events": len(self.error_events),
            "first_error": self.error_events[0] if self.error_events else None,
            # Realtime only: the phone protocol does not say when the server heard speech.
            "speech_started_in_bad_audio": self.speech_started if self.case.transport == "realtime" else None,
            "bad_audio_answered": bad is not None and bad.first_audible_at is not None,
            "garbage": self.case.garbage,
            # A "reply" heard before the utterance ended was the bad audio's, late: not an answer.
            "good_answered": None if good is None else (good.ttfs_ms or 0) > 0,
            "good_ttfs_ms": None if good is None or good.ttfs_ms is None else round(good.ttfs_ms),
            "good_error": None if good is None else good.error,
            "stored": None if self.stored is None else {
                "end_reason": self.stored.get("end_reason"),
                "user_texts": [(t.get("user_text") or "")[:80] for t in self.stored.get("turns", [])]},
        }


# --- lines: bad payloads as they are, good speech encoded ----------------------------------------

class _PhoneLine(PacedLine):
    rate = PHONE_RATE

    def __init__(self, ws, stream_sid: str) -> None:
        super().__init__()
        self._ws, self._stream_sid = ws, stream_sid

    async def _send(self, frame: np.ndarray | bytes) -> None:
        payload = frame if isinstance(frame, bytes) else mulaw_encode(frame)
        await self._ws.send(json.dumps({"event": "media", "streamSid": self._stream_sid,
                                        "media": {"payload": base64.b64encode(payload).decode()}}))


class _AppendLine(PacedLine):
    def __init__(self, ws, audio_format: str = "pcm16") -> None:
        # Set first: PacedLine sizes its frames by the rate.
        self.rate = REALTIME_RATE if audio_format == "pcm16" else PHONE_RATE
        self._ws, self._format = ws, audio_format
        super().__init__()

    async def _send(self, frame: np.ndarray | bytes) -> None:
        if isinstance(frame, np.ndarray):
            frame = mulaw_encode(frame) if self._format == "pcmu" else frame.astype("<i2").tobytes()
        audio = base64.b64encode(frame).decode()
        await self._ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))


# --- one case ------------------------------------------------------------------------------------

async def _send_bad(line: PacedLine, ws, bad: BadAudio, tracker: ReplyTracker, run: CaseRun,
                    idle_timeout_s: float) -> None:
    """The bad audio as the caller's first 'turn', so that a reply to it is heard as one."""
    run.bad_turn = TurnRecord(0, -1, "(bad audio)", "bad", 0.0)
    tracker.begin(run.bad_turn, time.time(), barging_in=False)
    started = time.monotonic()
    try:
        if bad.until_closed:
            while time.monotonic() - started < idle_timeout_s + IDLE_SLACK_S:
                await line.send_frame(bad.payloads[0])
        else:
            for payload in bad.payloads:
                await line.send_frame(payload)
    except websockets.ConnectionClosed:
        pass
    if ws.close_code is None and bad.until_closed:
        await _wait_closed(ws, CLOSE_WAIT_S)
    if ws.close_code is not None:
        run.closed_by_server = True
        run.close_code, run.close_reason = ws.close_code, ws.close_reason or ""
        run.closed_after_s = round(time.monotonic() - started, 2)
    tracker.speech_ended(run.bad_turn, time.time())


async def _settle(line: PacedLine, turn: TurnRecord, quiet_s: float) -> None:
    """Silence until no reply audio has come for `quiet_s` (a reply to the bad audio has ended)."""
    started = time.time()
    while time.time() - started < SETTLE_MAX_S:
        if time.time() - max(started, turn.last_packet_at or 0.0) >= quiet_s:
            return
        await line.pause(0.02)


async def _speak_good(line: PacedLine, tracker: ReplyTracker, run: CaseRun, plan: CallPlan) -> None:
    try:
        await _settle(line, run.bad_turn, plan.quiet_s)
        run.good_turn = (await converse(line, tracker, [plan.good], reply_quiet_s=0.5, reply_timeout_s=15.0))[-1]
    except websockets.ConnectionClosed as exc:
        run.closed_by_server = True
        run.close_code = exc.rcvd.code if exc.rcvd else 1006
        run.close_reason = exc.rcvd.reason if exc.rcvd else ""


async def _closed_within(ws, seconds: float) -> None:
    """Reads until the server closes (for a socket no receiver task reads)."""
    with contextlib.suppress(TimeoutError, websockets.ConnectionClosed):
        async with asyncio.timeout(seconds):
            async for _ in ws:
                pass


async def _wait_closed(ws, seconds: float) -> None:
    """Waits for the close that the receiver task, reading, will see."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await ws.wait_closed()


async def _twilio_case(base_url: str, case: Case, bad: BadAudio, plan: CallPlan) -> CaseRun:
    run = CaseRun(case, call_id="CA" + uuid.uuid4().hex)
    stream_sid = "MZ" + uuid.uuid4().hex
    ws = await connect_admitted(base_url, "/ws/twilio")
    tracker = ReplyTracker()
    media_format = bad.media_format or {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}
    with contextlib.suppress(websockets.ConnectionClosed):
        await ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
        await ws.send(json.dumps({"event": "start", "streamSid": stream_sid, "start": {
            "streamSid": stream_sid, "callSid": run.call_id, "mediaFormat": media_format, "customParameters": {}}}))
    if case.owed == REFUSED:
        await _closed_within(ws, CLOSE_WAIT_S)
        run.closed_by_server = ws.close_code is not None
        run.close_code, run.close_reason = ws.close_code, ws.close_reason or ""
        return run
    receiver = asyncio.create_task(_hear_phone(ws, tracker))
    line = _PhoneLine(ws, stream_sid)
    try:
        await _send_bad(line, ws, bad, tracker, run, plan.idle_timeout_s)
        if not run.closed_by_server:
            await _speak_good(line, tracker, run, plan)
        if not run.closed_by_server:
            with contextlib.suppress(websockets.ConnectionClosed):
                await ws.send(json.dumps({"event": "stop", "streamSid": stream_sid}))
            await _wait_closed(ws, CLOSE_WAIT_S)
    finally:
        receiver.cancel()
        await asyncio.gather(receiver, return_exceptions=True)
        await ws.close()
    return run


async def _hear_phone(ws, tracker: ReplyTracker) -> None:
    with contextlib.suppress(websockets.ConnectionClosed):
        async for message in ws:
            event = json.loads(message)
            if event.get("event") == "media":
                tracker.hear(time.time(), mulaw_decode(base64.b64decode(event["media"]["payload"])), PHONE_RATE)
            elif event.get("event") == "clear":
                tracker.clear(time.time())


async def _realtime_case(base_url: str, case: Case, bad: BadAudio, plan: CallPlan) -> CaseRun:
    run = CaseRun(case)
    ws = await connect_admitted(base_url, "/v1/realtime")
    tracker = ReplyTracker()
    created = json.loads(await ws.recv())
    run.call_id = str(created.get("session", {}).get("id", "")).removeprefix("sess_") or None
    heard = _RealtimeEar(tracker, run)
    receiver = asyncio.create_task(heard.listen(ws))
    try:
        for event in bad.before:
            await ws.send(json.dumps(event))
        await _send_bad(_AppendLine(ws), ws, bad, tracker, run, plan.idle_timeout_s)
        heard.bad_audio_over = True
        if not run.closed_by_server:
            await _speak_good(_AppendLine(ws, bad.good_format), tracker, run, plan)
    finally:
        with contextlib.suppress(websockets.ConnectionClosed):
            await ws.close()  # a Realtime client hangs up by closing
        receiver.cancel()
        await asyncio.gather(receiver, return_exceptions=True)
    return run


class _RealtimeEar:
    """Server events: reply audio (in the session's current format), errors, speech starts."""

    def __init__(self, tracker: ReplyTracker, run: CaseRun) -> None:
        self._tracker, self._run = tracker, run
        self._format = "pcm16"
        self.bad_audio_over = False

    async def listen(self, ws) -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            async for message in ws:
                self._on(json.loads(message))

    def _on(self, event: dict) -> None:
        kind, now = event.get("type"), time.time()
        if kind == "response.output_audio.delta":
            audio = base64.b64decode(event["delta"])
            samples = mulaw_decode(audio) if self._format == "pcmu" else np.frombuffer(audio, dtype="<i2")
            self._tracker.hear(now, samples, PHONE_RATE if self._format == "pcmu" else REALTIME_RATE)
        elif kind == "session.updated":
            fmt = event["session"]["audio"]["output"]["format"]["type"]
            self._format = "pcmu" if fmt == "audio/pcmu" else "pcm16"
        elif kind == "error":
            self._run.error_events.append(f"{event['error'].get('code')}: {event['error'].get('message')}")
        elif kind == "input_audio_buffer.speech_started" and not self.bad_audio_over:
            self._run.speech_started += 1
        elif kind == "response.done" and event["response"].get("status") == "cancelled":
            self._tracker.clear(now)


async def _stored(base_url: str, run: CaseRun) -> dict | None:
    """The server's record of the call, once it has ended; None if it never admitted one."""
    if run.call_id is None:
        return None
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as http:
        call_id = run.call_id
        if run.case.transport == "twilio":
            found = (await http.get("/api/calls", params={"external_id": run.call_id})).json()["calls"]
            if not found:
                return None
            call_id = found[0]["id"]
        deadline = time.monotonic() + STORED_WAIT_S
        while True:
            response = await http.get(f"/api/calls/{call_id}")
            if response.status_code == 404:
                return None
            call = response.json()
            if not call["live"] or time.monotonic() > deadline:
                return call
            await asyncio.sleep(0.1)


async def run_case(base_url: str, case: Case, material: Material, plan: CallPlan) -> dict:
    """One case's call, retried while the server refuses it as full (a slot still ending)."""
    bad = case.make(material)
    attempt = _twilio_case if case.transport == "twilio" else _realtime_case
    for _ in range(MAX_REFUSALS):
        run = await attempt(base_url, case, bad, plan)
        if run.close_code != CLOSE_TRY_LATER:
            break
        await asyncio.sleep(RETRY_FULL_S)
    run.stored = await _stored(base_url, run)
    return run.figures()


# --- the scenario ----------------------------------------------------------------------------------

async def run(base_url: str, *, bad_seconds: float = 3.0, idle_timeout_s: float = 120.0, quiet_s: float = 4.0,
              cases: tuple[Case, ...] = CASES, concurrency: int = 1, seed: int = 0, log: Path | None = None) -> dict:
    """Every case once. Silence cases (each waits out the idle timeout, `idle_timeout_s`, as the
    server is configured) run alongside the rest, which run `concurrency` at a time. `quiet_s`:
    see CallPlan (4 s: over the TTFS of real models on 2 cores; fakes answer within 1 s)."""
    good, other = utterance_for(0, 0), utterance_for(0, 1)
    material = Material(other.samples, other.rate, bad_seconds, seed)
    plan = CallPlan(PlannedTurn(good, pause_before_s=0.6), idle_timeout_s, quiet_s)
    log_from = log.stat().st_size if log is not None and log.exists() else 0
    gate = asyncio.Semaphore(concurrency)

    async def one(case: Case) -> dict:
        if case.owed == IDLE_TIMEOUT:
            return await run_case(base_url, case, material, plan)
        async with gate:
            return await run_case(base_url, case, material, plan)

    started = time.monotonic()
    results = await asyncio.gather(*(one(c) for c in cases))
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as http:
        healthy = (await http.get("/healthz")).status_code == 200
    return {"bad_seconds": bad_seconds, "idle_timeout_s": idle_timeout_s, "quiet_s": quiet_s,
            "good_utterance": good.text, "seconds": round(time.monotonic() - started, 1), "cases": results,
            "server_healthy_after": healthy, "errors_logged": errors_logged(log, log_from)}


def shortfalls(f: dict, *, idle_timeout_s: float) -> list[str]:
    """How one case's figures fall short of what the server owes it; [] when they do not."""
    owed, stored = f["owed"], f["stored"] or {}
    short = []
    if f["outcome"] == "crashed":
        short.append(f"crashed (close {f['close_code']}, stored {stored.get('end_reason')})")
    if owed in ("answered", ERROR_ANSWERED):
        if f["outcome"] != "handled":
            short.append(f"closed {f['close_code']} {f['close_reason']!r} instead of going on")
        if not f["good_answered"]:
            short.append(f"the good utterance after it was not answered ({f['good_error']})")
        if f["garbage"] and f["bad_audio_answered"]:
            short.append("the bad audio itself was answered (a hallucination)")
        # Audio sent faster than it is spoken is refused past limits.max_audio_ahead_seconds
        # (rate_limited): an answer, not a fault, where a case sends more audio than real time.
        limited = owed == "answered" and (f["first_error"] or "").startswith("rate_limited")
        if (owed == ERROR_ANSWERED) != (f["error_events"] > 0) and not limited:
            short.append(f"{f['error_events']} error events ({f['first_error']})")
        if stored.get("end_reason") != "caller_hung_up":
            short.append(f"stored as {stored.get('end_reason')}, not caller_hung_up")
    elif owed in (REFUSED, CLOSED_BAD_INPUT, IDLE_TIMEOUT):
        if f["outcome"] != "closed" or not f["close_reason"]:
            short.append(f"not closed with a reason ({f['outcome']}, {f['close_code']} {f['close_reason']!r})")
        if owed != IDLE_TIMEOUT and f["close_code"] != CLOSE_POLICY:
            short.append(f"closed {f['close_code']}, not {CLOSE_POLICY}")
        wanted = {REFUSED: None, CLOSED_BAD_INPUT: "bad_input", IDLE_TIMEOUT: "idle_timeout"}[owed]
        if stored.get("end_reason") != wanted:
            short.append(f"stored as {stored.get('end_reason')}, not {wanted}")
        if owed == IDLE_TIMEOUT and (f["closed_after_s"] or 1e9) > idle_timeout_s + IDLE_SLACK_S:
            short.append(f"ended after {f['closed_after_s']} s, over the {idle_timeout_s} s idle timeout")
    return short


def judge(figures: dict) -> Verdict:
    cases = figures["cases"]
    short = {f["case"]: s for f in cases if (s := shortfalls(f, idle_timeout_s=figures["idle_timeout_s"]))}
    outcomes = {o: sum(f["outcome"] == o for f in cases) for o in ("handled", "closed", "crashed")}
    codes = sorted({f["close_code"] for f in cases if f["close_code"] is not None})
    ttfs = sorted(f["good_ttfs_ms"] for f in cases if f["good_ttfs_ms"] is not None)
    answered_after = sum(bool(f["good_answered"]) for f in cases)
    went_on = sum(f["good_answered"] is not None for f in cases)
    hallucinated = sum(f["garbage"] and f["bad_audio_answered"] for f in cases)
    passed = not short and not figures["errors_logged"] and figures["server_healthy_after"]
    measured = (f"{len(cases)} cases: {outcomes['handled']} handled, {outcomes['closed']} closed {codes}, "
                f"{outcomes['crashed']} crashed; the good utterance after answered in {answered_after} of "
                f"{went_on} (TTFS p50 {percentile(ttfs, 50)} ms, max {ttfs[-1] if ttfs else None} ms); "
                f"garbage answered {hallucinated} times; {len(figures['errors_logged'])} errors logged")
    if short:
        measured += "; short: " + "; ".join(f"{k}: {', '.join(v)}" for k, v in short.items())
    return Verdict("bad-audio", "wrong rate or encoding declared, odd byte lengths, NaN/Inf floats, full-scale "
                                "noise, Opus as PCM, a format switch, silence: 0 crashes, each case handled "
                                "(the good utterance after it answered) or closed with a reason and stored so",
                   measured, passed, figures)
