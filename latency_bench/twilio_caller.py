"""A synthetic phone caller speaking the Twilio Media Streams protocol.

It behaves like a phone line: one 20 ms mu-law frame every 20 ms, paced by the clock,
speech when the caller talks and silence otherwise. It measures from the caller's side:
TTFS is the time from sending the frame that holds the caller's last voiced sample to
receiving the first reply audio.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from dataclasses import dataclass, field

import numpy as np
import websockets

from latency_bench.audio import last_voiced_sample, mulaw_encode

PHONE_RATE = 8000
FRAME_SECONDS = 0.02
FRAME_SAMPLES = int(PHONE_RATE * FRAME_SECONDS)
SILENCE_FRAME = mulaw_encode(np.zeros(FRAME_SAMPLES, dtype=np.int16))


@dataclass
class TurnResult:
    utterance_seconds: float
    speech_end_sent_at: float = 0.0  # wall clock
    first_reply_at: float | None = None
    last_reply_at: float | None = None
    reply_mulaw: bytearray = field(default_factory=bytearray)
    clear_events: int = 0
    barge_in_started_at: float | None = None
    cleared_at: float | None = None
    late_reply_bytes: int = 0  # reply audio still arriving after the `clear` (should be ~0)

    @property
    def ttfs_seconds(self) -> float | None:
        return None if self.first_reply_at is None else self.first_reply_at - self.speech_end_sent_at

    @property
    def reply_seconds(self) -> float:
        return len(self.reply_mulaw) / PHONE_RATE


@dataclass
class CallResult:
    stream_sid: str
    call_sid: str
    turns: list[TurnResult]
    close_code: int | None = None


class _Line:
    """Sends one frame per 20 ms on an absolute schedule, so slow sends don't drift."""

    def __init__(self, ws) -> None:
        self._ws = ws
        self._stream_sid = ""
        self._next_at = time.monotonic()

    def start(self, stream_sid: str) -> None:
        self._stream_sid = stream_sid
        self._next_at = time.monotonic()

    async def send_frame(self, mulaw: bytes) -> float:
        delay = self._next_at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        elif delay < -0.1:  # fell far behind (loaded machine): restart the schedule
            self._next_at = time.monotonic()
        await self._ws.send(json.dumps({"event": "media", "streamSid": self._stream_sid,
                                        "media": {"payload": base64.b64encode(mulaw).decode()}}))
        self._next_at += FRAME_SECONDS
        return time.time()

    async def send_audio(self, samples: np.ndarray) -> float:
        """Sends samples paced; returns when the frame with the last voiced sample went out."""
        end_index = last_voiced_sample(samples, PHONE_RATE)
        sent_voiced_at = time.time()
        for start in range(0, len(samples), FRAME_SAMPLES):
            frame = samples[start : start + FRAME_SAMPLES]
            if len(frame) < FRAME_SAMPLES:
                frame = np.pad(frame, (0, FRAME_SAMPLES - len(frame)))
            sent_at = await self.send_frame(mulaw_encode(frame))
            if start < end_index:
                sent_voiced_at = sent_at
        return sent_voiced_at

    async def silence(self, seconds: float) -> None:
        for _ in range(int(seconds / FRAME_SECONDS)):
            await self.send_frame(SILENCE_FRAME)


class _Turns:
    """Which turn the reply audio now arriving belongs to."""

    def __init__(self) -> None:
        self.all: list[TurnResult] = []
        self.reply_target: TurnResult | None = None
        self.cleared: TurnResult | None = None  # the turn whose reply a `clear` cut off

    def begin(self, turn: TurnResult, *, barging_in: bool) -> None:
        self.all.append(turn)
        if not barging_in:
            self.reply_target = turn

    def speech_ended(self, turn: TurnResult) -> None:
        # A barge-in nobody answered with `clear` still ends here: measure the new turn.
        self.reply_target = turn

    def on_media(self, mulaw: bytes, now: float) -> None:
        turn = self.reply_target
        if turn is None:  # audio of a reply the caller's barge-in cleared, still in flight
            if self.cleared is not None:
                self.cleared.late_reply_bytes += len(mulaw)
            return
        if turn.first_reply_at is None:
            turn.first_reply_at = now
        turn.last_reply_at = now
        turn.reply_mulaw += mulaw

    def on_clear(self, now: float) -> None:
        target = self.reply_target
        if target is None:
            return
        target.clear_events += 1
        if target.barge_in_started_at is None:
            return  # pipecat also clears when any caller turn starts; only a barge-in's clear counts
        if target.cleared_at is None:
            target.cleared_at = now
        # After a clear, audio belongs to the newest turn (whose speech may still be going).
        if self.all and self.all[-1] is not target:
            self.cleared = target
            self.reply_target = None


async def call(
    url: str,
    utterances: list[np.ndarray],
    *,
    leading_silence_s: float = 0.6,
    reply_timeout_s: float = 20.0,
    reply_quiet_s: float = 1.5,
    barge_in_after_s: float | None = None,
) -> CallResult:
    """Speaks each utterance (8 kHz int16) and waits for the reply to finish.

    With `barge_in_after_s`, each utterance after the first starts that long after the
    previous reply's first audio, talking over it, as callers do.
    """
    stream_sid, call_sid = "MZ" + uuid.uuid4().hex, "CA" + uuid.uuid4().hex
    turns = _Turns()
    async with websockets.connect(url, max_size=2**20, open_timeout=10) as ws:
        line = _Line(ws)
        receiver = asyncio.create_task(_receive(ws, turns))
        try:
            await ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
            await ws.send(json.dumps({"event": "start", "sequenceNumber": "1", "streamSid": stream_sid, "start": {
                "streamSid": stream_sid, "callSid": call_sid, "accountSid": "AC" + "0" * 32, "tracks": ["inbound"],
                "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}}))
            line.start(stream_sid)
            await line.silence(leading_silence_s)
            for i, samples in enumerate(utterances):
                barging_in = barge_in_after_s is not None and i > 0
                if barging_in:
                    previous = turns.all[-1]
                    await _wait_for_reply_start(line, previous, reply_timeout_s)
                    await line.silence(barge_in_after_s)
                    previous.barge_in_started_at = time.time()
                turn = TurnResult(utterance_seconds=len(samples) / PHONE_RATE)
                turns.begin(turn, barging_in=barging_in)
                turn.speech_end_sent_at = await line.send_audio(samples)
                turns.speech_ended(turn)
                barge_in_next = barge_in_after_s is not None and i + 1 < len(utterances)
                if not barge_in_next:  # else the next utterance talks over this reply
                    await _wait_for_reply_end(line, turn, reply_timeout_s, reply_quiet_s)
            await ws.send(json.dumps({"event": "stop", "streamSid": stream_sid}))
        except websockets.ConnectionClosed:
            pass
        finally:
            receiver.cancel()
            await asyncio.gather(receiver, return_exceptions=True)
        return CallResult(stream_sid, call_sid, turns.all, ws.close_code)


async def _wait_for_reply_start(line: _Line, turn: TurnResult, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while turn.first_reply_at is None and time.monotonic() < deadline:
        await line.send_frame(SILENCE_FRAME)


async def _wait_for_reply_end(line: _Line, turn: TurnResult, timeout_s: float, quiet_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        await line.send_frame(SILENCE_FRAME)
        if turn.last_reply_at is not None and time.time() - turn.last_reply_at > quiet_s:
            return


async def _receive(ws, turns: _Turns) -> None:
    async for message in ws:
        event = json.loads(message)
        now = time.time()
        if event.get("event") == "media":
            turns.on_media(base64.b64decode(event["media"]["payload"]), now)
        elif event.get("event") == "clear":
            turns.on_clear(now)
