"""The OpenAI Realtime endpoint and its client secrets.

    WS     /v1/realtime?model=AGENT         OpenAI's Realtime protocol (agent/transports/realtime.py);
                                            `model` names the agent (none: the default agent)
    POST   /v1/realtime/client_secrets      a single-use token for one browser session, as OpenAI's
                                            endpoint of the same name: the operator's backend holds
                                            the key, the page gets only this

A socket opened before the models are loaded is closed 1013 (try again later).
"""

from __future__ import annotations

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import JSONResponse

from agent.access import Gatekeeper
from agent.calls import CallManager
from agent.config import CadenceConfig
from agent.errors import BadSignalingError, CadenceError
from agent.health import Readiness
from agent.http_util import bounded_body, error_for, error_response, parse_json
from agent.metrics import CadenceMetrics
from agent.transports.realtime import handle_realtime_session
from agent.transports.twilio import CLOSE_TRY_LATER
from models.base import ASREngine

# A client-secret request carries a lifetime and session settings: a few hundred bytes.
CLIENT_SECRET_BODY_BYTES = 16_384


def realtime_router(*, config: CadenceConfig, readiness: Readiness, gate: Gatekeeper, metrics: CadenceMetrics,
                    manager: CallManager, asr: ASREngine) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/realtime/client_secrets")
    async def client_secret(request: Request) -> JSONResponse:
        """A single-use token for one browser session, as OpenAI's endpoint of the same name:
        the operator's backend holds the key, the page gets only this."""
        body = await bounded_body(request, CLIENT_SECRET_BODY_BYTES)
        if body is None:
            return error_response(413, f"body larger than {CLIENT_SECRET_BODY_BYTES} bytes")
        try:
            ttl_s = client_secret_ttl(parse_json(body) if body.strip() else {})
            token = gate.mint(request.headers, ttl_s)
        except CadenceError as exc:
            return error_for(exc)
        return JSONResponse({"value": token.value, "expires_at": int(token.expires_at),
                             "session": {"type": "realtime", "object": "realtime.session"}},
                            headers={"Cache-Control": "no-store"})

    @router.websocket("/v1/realtime")
    async def realtime(websocket: WebSocket, model: str | None = None) -> None:
        """OpenAI's Realtime protocol; `model` names the agent (none: the default agent)."""
        if not readiness.ready.is_set():
            await websocket.close(code=CLOSE_TRY_LATER, reason="models are still loading")
            return
        await handle_realtime_session(websocket, model=model, manager=manager, config=config, metrics=metrics,
                                      gate=gate, asr=asr)

    return router


def client_secret_ttl(body: object) -> float | None:
    """`expires_after.seconds` of OpenAI's request body, if given; the config's default if not."""
    if not isinstance(body, dict):
        raise BadSignalingError("body must be a JSON object like {\"expires_after\": {\"seconds\": 60}}")
    expires_after = body.get("expires_after")
    if expires_after is None:
        return None
    seconds = expires_after.get("seconds") if isinstance(expires_after, dict) else None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise BadSignalingError("expires_after.seconds must be a number of seconds")
    return float(seconds)
