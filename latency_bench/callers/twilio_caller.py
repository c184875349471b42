"""A synthetic phone caller speaking the Twilio Media Streams protocol.

It behaves like a phone line: one 20 ms mu-law frame every 20 ms on an absolute
schedule, speech when the caller talks and silence otherwise. What it hears (media
events, `clear`) goes to a `ReplyTracker`, which measures TTFS and the rest.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import websockets

from latency_bench.callers.audio import mulaw_decode, mulaw_encode
from latency_bench.callers.conversation import PacedLine, PlannedTurn, converse
from latency_bench.callers.listen import ReplyTracker, TurnRecord

PHONE_RATE = 8000
FRAME_SECONDS = 0.02
FRAME_SAMPLES = int(PHONE_RATE * FRAME_SECONDS)
SILENCE_FRAME = mulaw_encode(np.zeros(FRAME_SAMPLES, dtype=np.int16))


@dataclass
class CallResult:
    stream_sid: str
    call_sid: str
    turns: list[TurnRecord]
    close_code: int | None = None
    error: str | None = None


class PhoneLine(PacedLine):
    """20 ms mu-law `media` events on the call's stream."""

    rate = PHONE_RATE

    def __init__(self, ws, stream_sid: str, clock_rate: float = 1.0) -> None:
        super().__init__(clock_rate)
        self._ws = ws
        self._stream_sid = stream_sid

    async def _send(self, frame: np.ndarray) -> None:
        await self._ws.send(json.dumps({"event": "media", "streamSid": self._stream_sid,
                                        "media": {"payload": base64.b64encode(mulaw_encode(frame)).decode()}}))


async def call(
    url: str,
    plan: list[PlannedTurn],
    *,
    caller: int = 0,
    keep_audio: bool = False,
    reply_timeout_s: float = 20.0,
    reply_quiet_s: float = 1.5,
    on_turn: Callable[[TurnRecord], None] | None = None,
    agent: str | None = None,
    call_sid: str | None = None,
    clock_rate: float = 1.0,
    stop_when: Callable[[], bool] = lambda: False,
) -> CallResult:
    """One phone call to `url` (the server's /ws/twilio) that goes through `plan`, with
    `agent` (None: the server's default) named in the start event's customParameters.
    `call_sid`: the call's id at the "provider" (default: a new one), to find it on the server.
    `clock_rate`: the caller's clock against true time (it sends and plays audio that much
    faster). `stop_when()`: checked before each turn; true ends the call there."""
    stream_sid, call_sid = "MZ" + uuid.uuid4().hex, call_sid or "CA" + uuid.uuid4().hex
    tracker = ReplyTracker(keep_audio=keep_audio, clock_rate=clock_rate)
    error = None
    async with websockets.connect(url, max_size=2**20, open_timeout=10) as ws:
        receiver = asyncio.create_task(_receive(ws, tracker))
        try:
            await ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
            await ws.send(json.dumps({"event": "start", "sequenceNumber": "1", "streamSid": stream_sid, "start": {
                "streamSid": stream_sid, "callSid": call_sid, "accountSid": "AC" + "0" * 32, "tracks": ["inbound"],
                "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
                "customParameters": {"agent": agent} if agent else {}}}))
            await converse(PhoneLine(ws, stream_sid, clock_rate), tracker, plan, caller=caller, transport="twilio",
                           reply_timeout_s=reply_timeout_s, reply_quiet_s=reply_quiet_s, on_turn=on_turn,
                           stop_when=stop_when)
            await ws.send(json.dumps({"event": "stop", "streamSid": stream_sid}))
        except websockets.ConnectionClosed as exc:
            error = f"server closed the call: {exc.rcvd.code if exc.rcvd else 'no close frame'}"
        finally:
            receiver.cancel()
            await asyncio.gather(receiver, return_exceptions=True)
        return CallResult(stream_sid, call_sid, tracker.turns, ws.close_code, error)


async def _receive(ws, tracker: ReplyTracker) -> None:
    async for message in ws:
        event = json.loads(message)
        now = time.time()
        if event.get("event") == "media":
            tracker.hear(now, mulaw_decode(base64.b64decode(event["media"]["payload"])), PHONE_RATE)
        elif event.get("event") == "clear":
            tracker.clear(now)
