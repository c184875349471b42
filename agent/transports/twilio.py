"""Phone callers over the Twilio Media Streams WebSocket protocol.

The handshake (`connected`, then `start` with the streamSid) is read here; then pipecat's
FastAPI WebSocket transport carries the call, with a serializer that validates every
inbound message before it becomes a frame. Replies go out as `media` events on the same
streamSid, and a barge-in sends `clear` so the phone drops audio it has buffered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from fastapi import WebSocket, WebSocketDisconnect
from pipecat.audio.utils import ulaw_to_pcm
from pipecat.frames.frames import Frame, InputAudioRawFrame, InputDTMFFrame
from pipecat.audio.dtmf.types import KeypadEntry
from pipecat.serializers.twilio import TwilioFrameSerializer
from pipecat.transports.websocket.fastapi import FastAPIWebsocketParams, FastAPIWebsocketTransport

from agent.access import Gatekeeper, phone_socket_urls, refusal_reason
from agent.calls import ActiveCall, CallManager
from agent.config import CadenceConfig
from agent.errors import (BadInputError, BadMediaError, CapacityError, ForbiddenError, NotFoundError, SessionLimitError,
                          UnauthorizedError)
from agent.metrics import CadenceMetrics
from agent.transports import closing
from agent.transports.audio_pace import AudioPace
from agent.transports import twilio_protocol as proto

log = logging.getLogger(__name__)

TRANSPORT = "twilio"
PHONE_SAMPLE_RATE = 8000
HANDSHAKE_MAX_MESSAGES = 8
# The `start` event's customParameters key that names the agent (a <Parameter> in TwiML).
AGENT_PARAMETER = "agent"

# WebSocket close codes (RFC 6455): 1008 policy violation, 1013 try again later.
CLOSE_POLICY = 1008
CLOSE_TRY_LATER = 1013


class GuardedTwilioSerializer(TwilioFrameSerializer):
    """Pipecat's Twilio serializer with strict inbound validation.

    The stock `deserialize` raises on bad base64 or a non-object JSON, which ends the
    transport's receive loop; here every bad message is reported and dropped instead.
    """

    def __init__(self, stream_sid: str, call_sid: str | None, *, on_bad_input: Callable[[BadInputError], None],
                 on_stop: Callable[[], None], pace: AudioPace) -> None:
        super().__init__(stream_sid, call_sid, params=TwilioFrameSerializer.InputParams(auto_hang_up=False))
        self._on_bad_input = on_bad_input
        self._on_stop = on_stop
        self._pace = pace

    async def deserialize(self, data: str | bytes) -> Frame | None:
        try:
            return await self._to_frame(proto.parse(data))
        except BadInputError as exc:
            self._on_bad_input(exc)
        except Exception:  # noqa: BLE001 - our bug, not the caller's: logged, the message dropped
            # Raised from here it would end the transport's receive loop: a deaf call.
            log.exception("a phone message failed")
        return None

    async def _to_frame(self, event: proto.TwilioEvent) -> Frame | None:
        if isinstance(event, proto.Media):
            if not self._pace.admit(len(event.mulaw) / PHONE_SAMPLE_RATE):
                raise BadMediaError(f"audio is arriving faster than it is spoken (over {self._pace.max_ahead_s:g} s "
                                    "ahead); this frame was dropped")
            pcm = await ulaw_to_pcm(event.mulaw, PHONE_SAMPLE_RATE, self._sample_rate, self._input_resampler)
            return InputAudioRawFrame(audio=pcm, num_channels=1, sample_rate=self._sample_rate) if pcm else None
        if isinstance(event, proto.Dtmf):
            return InputDTMFFrame(KeypadEntry(event.digit))
        if isinstance(event, proto.Stop):
            self._on_stop()
        return None  # connected / start repeated / mark: nothing for the pipeline


async def read_handshake(websocket: WebSocket, *, timeout_s: float) -> proto.Start:
    """Reads messages until `start`, for at most `timeout_s` (limits.handshake_timeout_seconds);
    raises BadInputError, TimeoutError or WebSocketDisconnect."""
    async with asyncio.timeout(timeout_s):
        for _ in range(HANDSHAKE_MAX_MESSAGES):
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(message.get("code", 1000))
            event = proto.parse(message.get("text") if message.get("text") is not None else message.get("bytes", b""))
            if isinstance(event, proto.Start):
                return event
            if not isinstance(event, proto.Connected):
                raise BadInputError(f"expected 'connected' then 'start', got {type(event).__name__.lower()}")
    raise BadInputError(f"no 'start' event within the first {HANDSHAKE_MAX_MESSAGES} messages")


async def handle_twilio_call(websocket: WebSocket, *, manager: CallManager, config: CadenceConfig,
                             metrics: CadenceMetrics, gate: Gatekeeper) -> None:
    """Admission counts calls, not sockets: the socket's credentials are checked before it is
    accepted, but a key's session and a call slot are taken only once `start` has come, and a
    socket gets limits.handshake_timeout_seconds to send it."""
    urls = phone_socket_urls(websocket.headers, websocket.url.path, websocket.url.query)
    try:
        gate.check_phone(websocket.headers, urls)
    except (UnauthorizedError, ForbiddenError) as exc:
        metrics.calls_refused.labels(TRANSPORT, refusal_reason(exc)).inc()
        # Closed before the handshake is accepted: the client sees HTTP 403.
        await websocket.close(code=CLOSE_POLICY, reason=closing.close_reason(str(exc)))
        return
    await websocket.accept()
    if manager.full:  # told before the handshake; the slot itself is taken once `start` names the agent
        manager.refuse(TRANSPORT)
        await websocket.close(code=CLOSE_TRY_LATER, reason=manager.full_message[:120])
        return
    try:
        start = await read_handshake(websocket, timeout_s=config.limits.handshake_timeout_seconds)
    except (BadInputError, TimeoutError, WebSocketDisconnect) as exc:
        kind = "handshake_timeout" if isinstance(exc, TimeoutError) else "handshake"
        metrics.bad_input.labels(TRANSPORT, kind).inc()
        if not isinstance(exc, WebSocketDisconnect):
            reason = str(exc) if isinstance(exc, BadInputError) else "no start event in time"
            await _close_quietly(websocket, CLOSE_POLICY, reason)
        return
    try:
        lease = gate.admit_phone(websocket.headers, urls)
    except (UnauthorizedError, SessionLimitError) as exc:  # a token used meanwhile; a key at its cap
        metrics.calls_refused.labels(TRANSPORT, refusal_reason(exc)).inc()
        await _close_quietly(websocket, CLOSE_TRY_LATER if isinstance(exc, SessionLimitError) else CLOSE_POLICY,
                             str(exc))
        return
    try:
        try:
            call = manager.admit(TRANSPORT, start.custom_parameters.get(AGENT_PARAMETER), lease=lease)
        except CapacityError as exc:
            await _close_quietly(websocket, CLOSE_TRY_LATER, str(exc))
            return
        except NotFoundError as exc:
            metrics.calls_refused.labels(TRANSPORT, "unknown_agent").inc()
            await _close_quietly(websocket, CLOSE_POLICY, str(exc))
            return
        await _run_call(websocket, call, start, manager=manager, config=config, metrics=metrics)
    finally:
        gate.release(lease)  # idempotent: the call gave it back already if it ran


async def _run_call(websocket: WebSocket, call: ActiveCall, start: proto.Start, *, manager: CallManager,
                    config: CadenceConfig, metrics: CadenceMetrics) -> None:
    call.external_id = start.call_sid or start.stream_sid
    background: set[asyncio.Task] = set()

    def later(coro) -> None:
        # The serializer runs inside the pipeline's receive task; ending the call from there
        # must happen in a task of its own, which this call owns and awaits below.
        task = asyncio.get_running_loop().create_task(coro)
        background.add(task)
        task.add_done_callback(background.discard)

    def on_bad_input(exc: BadInputError) -> None:
        call.bad_messages += 1
        metrics.bad_input.labels(TRANSPORT, type(exc).__name__).inc()
        log.warning("call %s: rejected message (%d so far): %s", call.id, call.bad_messages, exc)
        if call.bad_messages == config.limits.max_bad_messages + 1:
            later(_close_for_bad_input(websocket, call, manager, exc))

    serializer = GuardedTwilioSerializer(
        start.stream_sid, start.call_sid, on_bad_input=on_bad_input,
        on_stop=lambda: later(manager.hang_up(call, "caller_hung_up")),
        pace=AudioPace(config.limits.max_audio_ahead_seconds),
    )
    transport = FastAPIWebsocketTransport(
        closing.for_call(websocket, call, max_call_s=config.limits.max_call_seconds),
        FastAPIWebsocketParams(audio_in_enabled=True, audio_out_enabled=True, add_wav_header=False,
                               serializer=serializer),
    )

    @transport.event_handler("on_client_disconnected")
    async def _on_disconnected(_transport, _ws) -> None:
        later(manager.hang_up(call, "caller_hung_up"))

    try:
        await manager.run(call, transport, output_sample_rate=PHONE_SAMPLE_RATE)
    finally:
        for task in list(background):
            task.cancel()
        if background:
            await asyncio.wait(background, timeout=2.0)


async def _close_for_bad_input(websocket: WebSocket, call: ActiveCall, manager: CallManager,
                               exc: BadInputError) -> None:
    await _close_quietly(websocket, CLOSE_POLICY, f"too many invalid messages; last: {exc}")
    await manager.hang_up(call, "bad_input")


async def _close_quietly(websocket: WebSocket, code: int, reason: str) -> None:
    try:
        await websocket.close(code=code, reason=closing.close_reason(reason))
    except (RuntimeError, WebSocketDisconnect):
        pass  # already closed by the peer
