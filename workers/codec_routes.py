"""The codec worker's stream endpoint: `WS /v1/codec/stream`, one connection per audio stream.

The format is models/orpheus/codec_wire.py's. The worker's bound on requests in flight is a
bound on open streams here: a stream holds decoder state for its whole life, so a full
worker refuses the next stream at once (a retryable refusal, then close code 1013) rather
than letting it queue behind audio that would play late anyway. A request the worker cannot
take (malformed, or the decoder's queue full) is refused and leaves the stream as it was;
a stream silent for `codec_idle_s` is closed, so a client that vanished without closing
gives its slot back. Whatever way the connection ends, the stream's state is released.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from models.errors import CapacityError
from models.orpheus.codec_engine import SnacCodecEngine
from models.orpheus.codec_wire import (
    FINAL, FLUSH, KINDS, PATH, TRY_AGAIN_LATER, WINDOW, CodecRequest, CodecWireError, decode_request, encode_audio,
    encode_refusal)
from models.base import Engine
from models.orpheus.snac_stream import StreamState
from workers.worker_metrics import WorkerMetrics

log = logging.getLogger(__name__)
_INTERNAL_ERROR = 1011  # WebSocket close code: the server failed


class CodecLimits(Protocol):
    max_codec_frames: int  # most frames in one request; more is refused
    codec_idle_s: float  # a stream silent this long is closed, freeing its slot


class CodecHost(Protocol):
    """What the stream endpoint reads and counts of the worker that serves it (workers/server.py)."""

    engine: Engine  # a SnacCodecEngine (checked by `codec_routes`)
    name: str
    ready: bool  # the engine is loaded and warmed
    load_error: str | None  # why it failed to load, if it did
    in_flight: int  # streams open now; the endpoint counts its own
    max_in_flight: int  # streams the worker holds at once
    limits: CodecLimits
    metrics: WorkerMetrics
    clock: Callable[[], float]


def codec_routes(worker: CodecHost) -> list[WebSocketRoute]:
    if not isinstance(worker.engine, SnacCodecEngine):
        raise ValueError(f"role codec needs a SnacCodecEngine; got {type(worker.engine).__name__}")

    async def stream(websocket: WebSocket) -> None:
        await websocket.accept()
        refusal = _refusal(worker)
        if refusal is not None:
            worker.metrics.refused("in_flight" if worker.ready else "not_ready")
            await websocket.send_text(encode_refusal(refusal, retryable=True))
            await websocket.close(code=TRY_AGAIN_LATER, reason=refusal[:120])
            return
        service = worker.engine.service
        await service.start()
        state = service.open_stream()
        worker.in_flight += 1
        try:
            await _serve(worker, websocket, state)
        except WebSocketDisconnect:
            pass  # the stream ended (or was abandoned) from the client's side
        finally:
            worker.in_flight -= 1
            service.release(state)

    return [WebSocketRoute(PATH, stream)]


def _refusal(worker: CodecHost) -> str | None:
    if not worker.ready:
        return f"worker {worker.name} is not ready: {worker.load_error or 'loading the engine'}"
    if worker.in_flight >= worker.max_in_flight:
        return f"worker {worker.name} has {worker.in_flight} streams open, its bound; retry later"
    return None


async def _serve(worker: CodecHost, websocket: WebSocket, state: StreamState) -> None:
    engine = worker.engine
    assert isinstance(engine, SnacCodecEngine)
    limits = worker.limits
    while True:
        try:
            async with asyncio.timeout(limits.codec_idle_s):
                message = await websocket.receive()
        except TimeoutError:
            await websocket.close(code=1000, reason=f"idle for {limits.codec_idle_s:g} s")
            return
        if message["type"] == "websocket.disconnect":
            return
        started = worker.clock()
        data = message.get("bytes")
        try:
            if data is None:
                raise CodecWireError("requests are binary messages (models/orpheus/codec_wire.py), not text")
            request = decode_request(data, max_frames=limits.max_codec_frames)
        except CodecWireError as exc:
            await websocket.send_text(encode_refusal(str(exc), retryable=False))
            worker.metrics.observe_request(PATH, 422, worker.clock() - started)
            continue
        endpoint = f"{PATH}#{KINDS[request.kind]}"
        try:
            audio = await _run(engine, state, request)
        except CapacityError as exc:
            worker.metrics.refused("engine_queue")
            await websocket.send_text(encode_refusal(str(exc), retryable=True))
            worker.metrics.observe_request(endpoint, 503, worker.clock() - started)
            continue
        except Exception as exc:  # the stream's state may be half moved: end this stream, keep serving others
            log.error("%s: a codec %s failed: %r", worker.name, KINDS[request.kind], exc, exc_info=exc)
            await websocket.send_text(encode_refusal(f"the codec failed: {type(exc).__name__}: {exc}", retryable=False))
            await websocket.close(code=_INTERNAL_ERROR, reason="the codec failed")
            worker.metrics.observe_request(endpoint, 500, worker.clock() - started)
            return
        await websocket.send_bytes(encode_audio(audio))
        worker.metrics.observe_request(endpoint, 200, worker.clock() - started)


async def _run(engine: SnacCodecEngine, state: StreamState, request: CodecRequest):
    service = engine.service
    state.next_sample = max(state.next_sample, request.skip_to)  # a head start the client played
    if request.kind == WINDOW:
        return await service.decode(request.frames, request.first_frame, stream=state)
    if request.kind == FLUSH:
        return await service.step(state, None)
    return await service.step(state, request.frames, final=request.kind == FINAL)
