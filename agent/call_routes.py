"""HTTP and WebSocket routes that start calls, and the calls' records.

    GET    /                       the browser caller's page (frontend/index.html)
    POST   /api/offer?agent=NAME   a WebRTC SDP offer -> its answer; a caller's credential and an
                                   allowed Origin (agent/access.py); 503 until ready or when full
    PATCH  /api/offer              trickled ICE candidates for a live WebRTC call
    WS     /ws/twilio              a Twilio media stream (its request signature checked)
    GET    /api/calls              stored calls, newest first (`live` says which are in progress)
    GET    /api/calls/{call_id}    one call: the live snapshot if in progress, else the stored record

Errors are {"error": ..., "retryable": ...}: 400 bad SDP, 404 an unknown agent or call, 413
an offer over server.max_sdp_bytes.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import FileResponse, JSONResponse, Response

from agent.access import Gatekeeper, refusal_reason
from agent.calls import CallManager
from agent.config import CadenceConfig
from agent.errors import BadSignalingError, CadenceError, CapacityError, NotFoundError
from agent.health import Readiness
from agent.http_util import bounded_body, error_for, error_response
from agent.metrics import CadenceMetrics
from agent.store import CallStore
from agent.transports.twilio import CLOSE_TRY_LATER, handle_twilio_call
from agent.transports.webrtc import WebRTCCalls


def calls_router(*, config: CadenceConfig, readiness: Readiness, gate: Gatekeeper, metrics: CadenceMetrics,
                 manager: CallManager, webrtc: WebRTCCalls, store: CallStore, page: Path) -> APIRouter:
    router = APIRouter()
    max_sdp_bytes = config.server.max_sdp_bytes

    @router.post("/api/offer")
    async def offer(request: Request, agent: str | None = None) -> JSONResponse:
        if not readiness.ready.is_set():
            return error_response(503, "models are still loading; retry shortly", retryable=True)
        try:
            lease = gate.admit(request.headers)
        except CadenceError as exc:
            metrics.calls_refused.labels("webrtc", refusal_reason(exc)).inc()
            return error_for(exc)
        body = await bounded_body(request, max_sdp_bytes)
        if body is None:
            gate.release(lease)
            return error_response(413, f"offer larger than {max_sdp_bytes} bytes")
        try:
            return JSONResponse(await webrtc.answer(body, agent, lease=lease))
        except BadSignalingError as exc:
            return error_response(400, str(exc))
        except NotFoundError as exc:
            return error_response(404, str(exc))
        except CapacityError as exc:
            return error_response(503, str(exc), retryable=True)

    @router.patch("/api/offer")
    async def offer_candidates(request: Request) -> Response:
        body = await bounded_body(request, max_sdp_bytes)
        if body is None:
            return error_response(413, "candidate batch too large")
        try:
            await webrtc.add_candidates(body)
        except BadSignalingError as exc:
            return error_response(400, str(exc))
        except LookupError as exc:
            return error_response(404, str(exc))
        return JSONResponse({"status": "ok"})

    @router.websocket("/ws/twilio")
    async def twilio(websocket: WebSocket) -> None:
        if not readiness.ready.is_set():
            await websocket.accept()
            await websocket.close(code=CLOSE_TRY_LATER, reason="models are still loading")
            return
        await handle_twilio_call(websocket, manager=manager, config=config, metrics=metrics, gate=gate)

    @router.get("/api/calls")
    async def list_calls(limit: int = 50, offset: int = 0, external_id: str | None = None) -> dict:
        stored = await store.list_calls(limit, offset, external_id)
        for row in stored:
            row["live"] = manager.live(row["id"]) is not None
        return {"calls": stored}

    @router.get("/api/calls/{call_id}")
    async def get_call(call_id: str) -> JSONResponse:
        live = manager.live(call_id)
        if live is not None:
            return JSONResponse(live.snapshot())
        stored = await store.get_call(call_id)
        if stored is None:
            return error_response(404, f"no call {call_id}")
        return JSONResponse({**stored, "live": False})

    @router.get("/")
    async def index() -> FileResponse:
        return FileResponse(page)

    return router
