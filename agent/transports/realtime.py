"""Clients of OpenAI's Realtime protocol: `GET /v1/realtime?model=AGENT`, a WebSocket.

The agent's pipeline serves the session as it serves a phone call: pipecat's FastAPI
WebSocket transport carries it, with a serializer that turns client events into frames
(`RealtimeSession.on_client_message`). Server events come from one place, the session's
outbound queue, fed by `SpeechEventObserver` (what the caller hears, as it is sent) and by the
answers to client events, and written by one task, so that they leave in the order they were
made. The protocol itself is plain logic: `realtime_protocol` (client events, session
settings) and `realtime_conversation` (items, responses, server events).
"""

from __future__ import annotations

import asyncio
import json
import logging

from fastapi import WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse
from pipecat.frames.frames import Frame
from pipecat.processors.frame_processor import FrameProcessorSetup
from pipecat.serializers.base_serializer import FrameSerializer
from pipecat.transports.websocket.fastapi import FastAPIWebsocketParams, FastAPIWebsocketTransport

from agent.access import Gatekeeper, refusal_reason, subprotocols
from agent.calls import ActiveCall, CallManager
from agent.config import CadenceConfig
from agent.errors import CadenceError, CapacityError, NotFoundError, SessionLimitError
from agent.http_util import error_for
from agent.metrics import CadenceMetrics
from agent.transports import closing
from agent.transports.audio_pace import AudioPace
from agent.transports.realtime_session import RealtimeSession
from models.base import ASREngine
from pipelines.speech_events import SpeechEventObserver

log = logging.getLogger(__name__)

TRANSPORT = "realtime"
SUBPROTOCOL = "realtime"  # what OpenAI's browser clients offer beside their key
# The pipeline speaks at the protocol's default rate; G.711 sessions are converted from it.
OUTPUT_SAMPLE_RATE = 24_000
CLOSE_POLICY, CLOSE_TRY_LATER = 1008, 1013


class RealtimeSerializer(FrameSerializer):
    """Client events in (through the session); nothing out: server events, reply audio
    included, leave through the session's own writer, in order with the rest."""

    def __init__(self, session: RealtimeSession) -> None:
        super().__init__()
        self._session = session

    async def setup(self, setup: FrameProcessorSetup) -> None:
        self._session.set_input_sample_rate(setup.audio_in_sample_rate)

    async def serialize(self, frame: Frame) -> str | bytes | None:
        return None  # taken: the transport still paces reply audio as if it had sent it

    async def deserialize(self, data: str | bytes) -> Frame | None:
        return await self._session.on_client_message(data)


async def handle_realtime_session(websocket: WebSocket, *, model: str | None, manager: CallManager,
                                  config: CadenceConfig, metrics: CadenceMetrics, gate: Gatekeeper,
                                  asr: ASREngine) -> None:
    try:
        lease = gate.admit(websocket.headers)
    except CadenceError as exc:
        metrics.calls_refused.labels(TRANSPORT, refusal_reason(exc)).inc()
        await _deny(websocket, exc)
        return
    try:
        try:
            call = manager.admit(TRANSPORT, model, lease=lease)
        except (NotFoundError, CapacityError) as exc:
            if isinstance(exc, NotFoundError):
                metrics.calls_refused.labels(TRANSPORT, "unknown_agent").inc()
            await _deny(websocket, exc)
            return
        await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in subprotocols(websocket.headers) else None)
        await _run_session(websocket, call, manager=manager, config=config, metrics=metrics, asr=asr)
    finally:
        gate.release(lease)  # idempotent: a call that ran gave it back already


async def _run_session(websocket: WebSocket, call: ActiveCall, *, manager: CallManager, config: CadenceConfig,
                       metrics: CadenceMetrics, asr: ASREngine) -> None:
    background: set[asyncio.Task] = set()

    def later(coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        background.add(task)
        task.add_done_callback(background.discard)

    def on_bad_event(exc: CadenceError) -> None:
        call.bad_messages += 1
        metrics.bad_input.labels(TRANSPORT, getattr(exc, "code", type(exc).__name__)).inc()
        log.info("call %s: rejected client event (%d so far): %s", call.id, call.bad_messages,
                 getattr(exc, "code", type(exc).__name__))
        if call.bad_messages == config.limits.max_bad_messages + 1:
            later(_close(websocket, call, manager, CLOSE_POLICY, f"too many invalid events; last: {exc}", "bad_input"))

    session = RealtimeSession(call, asr=asr, model=call.agent.name,
                              max_buffer_seconds=config.limits.max_user_turn_seconds,
                              vad_start_secs=config.vad.start_secs, on_bad_event=on_bad_event,
                              pace=AudioPace(config.limits.max_audio_ahead_seconds),
                              on_stalled=lambda: later(_close(websocket, call, manager, CLOSE_POLICY,
                                                              "client is not reading events", "client_not_reading")),
                              on_truncated=lambda turn: manager.turn_changed(call, turn))
    transport = FastAPIWebsocketTransport(
        closing.for_call(websocket, call, max_call_s=config.limits.max_call_seconds),
        FastAPIWebsocketParams(audio_in_enabled=True, audio_out_enabled=True, add_wav_header=False,
                               serializer=RealtimeSerializer(session)),
    )
    session.attach(transport.input())

    @transport.event_handler("on_client_disconnected")
    async def _on_disconnected(_transport, _ws) -> None:
        later(manager.hang_up(call, "caller_hung_up"))

    writer = asyncio.create_task(session.write_events(websocket), name=f"realtime-writer-{call.id}")
    session.opened()  # session.created goes out first
    try:
        await manager.run(call, transport, output_sample_rate=OUTPUT_SAMPLE_RATE,
                          observers=[SpeechEventObserver(session, output_transport=transport.output())])
    finally:
        session.close()
        for task in (writer, *background):
            task.cancel()
        await asyncio.wait({writer, *background}, timeout=2.0)


async def _deny(websocket: WebSocket, exc: CadenceError) -> None:
    """Refuses the handshake with an HTTP answer that says why (401, 403, 404, 429, 503) where the
    server can send one, else closes it (1008, or 1013 for a retry-later)."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(_denial(exc))
        return
    code = CLOSE_TRY_LATER if exc.retryable else CLOSE_POLICY
    await websocket.close(code=code, reason=closing.close_reason(str(exc)))


def _denial(exc: CadenceError) -> JSONResponse:
    if isinstance(exc, CapacityError) and not isinstance(exc, SessionLimitError):
        return JSONResponse({"error": {"type": "server_error", "code": "capacity", "message": str(exc)}},
                            status_code=503)
    answer = error_for(exc)
    body = json.loads(answer.body)
    return JSONResponse({"error": {"type": "invalid_request_error", "code": body.get("reason", "refused"),
                                   "message": body["error"]}}, status_code=answer.status_code,
                        headers={k: v for k, v in answer.headers.items() if k.lower() == "www-authenticate"})


async def _close(websocket: WebSocket, call: ActiveCall, manager: CallManager, code: int, reason: str,
                 end_reason: str) -> None:
    try:
        await websocket.close(code=code, reason=closing.close_reason(reason))
    except (RuntimeError, WebSocketDisconnect):
        pass  # already closed
    await manager.hang_up(call, end_reason)

