"""A synthetic caller speaking OpenAI's Realtime protocol to /v1/realtime.

Like the phone caller, it sends 20 ms of audio every 20 ms on an absolute schedule (PCM16
24 kHz, `input_audio_buffer.append`), and the server's VAD decides turns. What it hears
(`response.output_audio.delta`) goes to the same `ReplyTracker`, so TTFS means the same:
the caller's last voiced audio to the first audible reply audio received.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import websockets

from latency_bench.callers.conversation import PacedLine, PlannedTurn, converse
from latency_bench.callers.listen import ReplyTracker, TurnRecord

RATE = 24_000


@dataclass
class CallResult:
    call_id: str | None  # the server's call id (from the session's id)
    turns: list[TurnRecord]
    close_code: int | None = None
    error: str | None = None


class RealtimeLine(PacedLine):
    """20 ms `input_audio_buffer.append` events of PCM16 24 kHz."""

    rate = RATE

    def __init__(self, ws) -> None:
        super().__init__()
        self._ws = ws

    async def _send(self, frame: np.ndarray) -> None:
        audio = base64.b64encode(frame.astype("<i2").tobytes()).decode()
        await self._ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))


async def call(url: str, plan: list[PlannedTurn], *, caller: int = 0, keep_audio: bool = False,
               reply_timeout_s: float = 20.0, reply_quiet_s: float = 1.5,
               on_turn: Callable[[TurnRecord], None] | None = None, agent: str | None = None,
               api_key: str | None = None) -> CallResult:
    """One session with `url` (ws://host:port/v1/realtime) that goes through `plan`."""
    tracker = ReplyTracker(keep_audio=keep_audio)
    target = f"{url}?model={agent}" if agent else url
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    session: dict = {}
    error = None
    async with websockets.connect(target, max_size=2**22, open_timeout=10, additional_headers=headers) as ws:
        created = json.loads(await ws.recv())
        session.update(created.get("session", {}))
        receiver = asyncio.create_task(_receive(ws, tracker))
        try:
            await converse(RealtimeLine(ws), tracker, plan, caller=caller, transport="realtime",
                           reply_timeout_s=reply_timeout_s, reply_quiet_s=reply_quiet_s, on_turn=on_turn)
        except websockets.ConnectionClosed as exc:
            error = f"server closed the session: {exc.rcvd.code if exc.rcvd else 'no close frame'}"
        finally:
            receiver.cancel()
            await asyncio.gather(receiver, return_exceptions=True)
        call_id = str(session.get("id", "")).removeprefix("sess_") or None
        return CallResult(call_id, tracker.turns, ws.close_code, error)


async def _receive(ws, tracker: ReplyTracker) -> None:
    async for message in ws:
        event = json.loads(message)
        now = time.time()
        kind = event.get("type")
        if kind == "response.output_audio.delta":
            samples = np.frombuffer(base64.b64decode(event["delta"]), dtype="<i2")
            tracker.hear(now, samples, RATE)
        elif kind == "response.done" and event["response"].get("status") == "cancelled":
            tracker.clear(now)  # the server stopped the reply: what it would have said is not heard
