"""The HTTP/WebSocket server: routes only; the work lives in calls, transports, engines.

Startup serves /healthz at once and loads models in the background; /readyz turns 200
only when every engine is loaded and warmed, and callers are refused (503 / 1013) until then.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Mapping
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import Depends, FastAPI, Request, WebSocket
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from agent.access import Gatekeeper, operator_required, refusal_reason
from agent.agent_registry import AgentRegistry, load_agent_files
from agent.auth import operator_keys
from agent.agent_routes import agents_router
from agent.calls import CallManager
from agent.chat import TextChat
from agent.config import CadenceConfig
from agent.dashboard import dashboard_router
from agent.errors import (BadSignalingError, CadenceError, CapacityError, ForbiddenError, NotFoundError,
                          UnauthorizedError)
from agent.http_util import bounded_body, error_for, error_response, parse_json
from agent.events import TurnEvents
from agent.health import Readiness, health_router, named_engines
from agent.knowledge_wiring import Knowledge
from agent.gc_pauses import GcPauseWatch, freeze_startup_objects
from agent.loop_lag import LoopLagMonitor
from agent.metrics import CadenceMetrics
from agent.model_plane import ModelPlane, model_plane_for
from agent.store import CallStore
from agent.transports.realtime import handle_realtime_session
from agent.transports.twilio import CLOSE_TRY_LATER, handle_twilio_call
from agent.transcription_routes import transcription_router
from agent.transports.webrtc import WebRTCCalls
from agent import engine_factory as registry
from pipelines.voice import Engines
from transcription.jobs import TranscriptionJobs

log = logging.getLogger(__name__)

# A client-secret request carries a lifetime and session settings: a few hundred bytes.
CLIENT_SECRET_BODY_BYTES = 16_384
FRONTEND_DIR = Path(__file__).resolve().parent.parent / "frontend"


def create_app(config: CadenceConfig, *, engines: Engines | None = None, engines_loaded: bool = False,
               environ: Mapping[str, str] | None = None, freeze_after_load: bool = False) -> FastAPI:
    """`engines` may be passed in already loaded (tests share one set across apps).
    A bad agent file raises ConfigError here, naming the file and the field: startup stops.
    `environ` (default: the process's) supplies API keys and the Twilio auth token.
    `freeze_after_load`: once loaded, take what startup made out of the garbage collector's
    scans (agent/gc_pauses.py); for a process that is this server alone (the CLI), not for one
    that runs several apps one after another (tests)."""
    environ = os.environ if environ is None else environ
    owns_engines = engines is None  # engines passed in belong to the caller (tests share them)
    plane = model_plane_for(config) if owns_engines else ModelPlane()
    engines = engines or registry.build_engines(config, plane.endpoints)  # built, not loaded: no model read yet
    # Agents are checked against the LLM's context (a prompt that leaves no room for a dialogue is refused).
    agent_files = load_agent_files(config, llm_context_tokens=engines.llm.context_tokens)
    metrics = CadenceMetrics()
    gate = Gatekeeper(config.auth, operator_keys(config.auth, environ), metrics,
                      twilio_auth_token=environ.get(config.auth.twilio_auth_token_env) or None)
    store = CallStore(config.store.path)
    agents = AgentRegistry(config, store, agent_files, llm_context_tokens=engines.llm.context_tokens)
    knowledge = Knowledge(config, engines.embedder, metrics)
    events = TurnEvents(on_drop=metrics.dashboard_dropped.inc)
    metrics.track_dashboard_streams(lambda: events.subscriber_count, lambda: events.max_backlog)
    manager = CallManager(config, engines, store, metrics, agents, events=events, search_for=knowledge.search_for,
                          release_lease=gate.release, environ=environ)
    webrtc = WebRTCCalls(manager, config, metrics)
    chat = TextChat(config, agents, engines.llm, metrics, search_for=knowledge.search_for)
    transcriptions = TranscriptionJobs(config.transcription.options(), config.transcription.job_limits(),
                                       Path(config.transcription.upload_dir), on_end=metrics.observe_transcription)
    readiness = Readiness()
    by_role = named_engines(engines)
    if engines_loaded:
        readiness.loaded.update(by_role)
    for name, engine in by_role.items():
        metrics.track_queue_depth(name, lambda e=engine: e.queue_depth)
    loop_lag = LoopLagMonitor(on_sample=metrics.event_loop_lag_probes.observe)
    gc_pauses = GcPauseWatch(lambda generation, seconds: metrics.gc_pause_seconds.labels(str(generation)).observe(seconds))
    metrics.track_event_loop_lag(lambda: loop_lag.latest_s, loop_lag.max_recent_s)
    started_at = time.monotonic()

    async def load_models() -> None:
        try:
            if plane.supervisor is not None:
                await plane.supervisor.start()  # the workers this server runs, each ready
            if not engines_loaded:
                await asyncio.to_thread(registry.load_and_warm, engines, lambda engine: readiness.loaded.update(
                    role for role, each in by_role.items() if each is engine))
            # File agents' documents: ingested once (unchanged files are skipped), before calls.
            await knowledge.sync_file_agents(agent_files)
            if freeze_after_load:
                log.info("%d startup objects frozen out of the garbage collector's scans", freeze_startup_objects())
            readiness.ready.set()
            log.info("models loaded; ready for calls")
        except Exception as exc:
            readiness.error = f"{exc.__class__.__name__}: {exc}"
            log.exception("model loading failed; the server stays up but not ready")

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        await store.open()
        await agents.open()
        await knowledge.open()
        loop_lag.start()  # stopped below, however the server ends
        gc_pauses.install()
        loader = asyncio.create_task(load_models(), name="load-models")
        try:
            yield
        finally:
            await loop_lag.stop()
            gc_pauses.uninstall()
            events.close()
            loader.cancel()
            await asyncio.gather(loader, return_exceptions=True)
            await manager.shutdown()
            await transcriptions.close()
            await knowledge.close()
            await store.close()
            if owns_engines:
                await registry.close_engines(engines)
            if plane.supervisor is not None:
                await plane.supervisor.stop()

    app = FastAPI(title="Cadence", lifespan=lifespan)
    app.state.manager, app.state.metrics, app.state.store, app.state.events = manager, metrics, store, events
    app.state.agents, app.state.knowledge, app.state.readiness = agents, knowledge, readiness
    app.state.model_plane, app.state.engines = plane, engines
    app.state.transcriptions = transcriptions
    app.state.gate = gate
    app.state.loop_lag = loop_lag

    @app.exception_handler(UnauthorizedError)
    @app.exception_handler(ForbiddenError)
    async def _refused(_request: Request, exc: CadenceError) -> JSONResponse:
        return error_for(exc)

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        if manager.draining:  # the load balancer stops sending calls here
            return JSONResponse({"status": "draining", "calls_active": manager.active_count}, status_code=503)
        if readiness.ready.is_set():
            return JSONResponse({"status": "ready", "calls_active": manager.active_count})
        status = "failed" if readiness.error else "loading"
        return JSONResponse({"status": status, "error": readiness.error}, status_code=503)

    @app.post("/api/drain")
    async def drain(request: Request) -> JSONResponse:
        """Before a stop (Kubernetes' preStop runs `cadence drain`): refuse new calls, keep
        the live ones. Only from this machine: anyone else could take the server out of service."""
        if not _from_loopback(request):
            return error_response(403, "drain is accepted only from the server's own machine")
        # A page in a browser on this machine is on loopback too, and a form's POST needs no
        # preflight: any site it visits could take the server out of service. `cadence drain`
        # sends no Origin.
        gate.check_origin(request.headers, "drain")
        manager.drain()
        log.info("draining: %d calls in progress, no new ones", manager.active_count)
        return JSONResponse({"draining": True, "calls_active": manager.active_count})

    @app.get("/api/drain")
    async def drain_status() -> JSONResponse:
        return JSONResponse({"draining": manager.draining, "calls_active": manager.active_count})

    @app.post("/api/offer")
    async def offer(request: Request, agent: str | None = None) -> JSONResponse:
        if not readiness.ready.is_set():
            return error_response(503, "models are still loading; retry shortly", retryable=True)
        try:
            lease = gate.admit(request.headers)
        except CadenceError as exc:
            metrics.calls_refused.labels("webrtc", refusal_reason(exc)).inc()
            return error_for(exc)
        body = await bounded_body(request, config.server.max_sdp_bytes)
        if body is None:
            gate.release(lease)
            return error_response(413, f"offer larger than {config.server.max_sdp_bytes} bytes")
        try:
            return JSONResponse(await webrtc.answer(body, agent, lease=lease))
        except BadSignalingError as exc:
            return error_response(400, str(exc))
        except NotFoundError as exc:
            return error_response(404, str(exc))
        except CapacityError as exc:
            return error_response(503, str(exc), retryable=True)

    @app.post("/v1/realtime/client_secrets")
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

    @app.patch("/api/offer")
    async def offer_candidates(request: Request) -> Response:
        body = await bounded_body(request, config.server.max_sdp_bytes)
        if body is None:
            return error_response(413, "candidate batch too large")
        try:
            await webrtc.add_candidates(body)
        except BadSignalingError as exc:
            return error_response(400, str(exc))
        except LookupError as exc:
            return error_response(404, str(exc))
        return JSONResponse({"status": "ok"})

    @app.websocket("/ws/twilio")
    async def twilio(websocket: WebSocket) -> None:
        if not readiness.ready.is_set():
            await websocket.accept()
            await websocket.close(code=CLOSE_TRY_LATER, reason="models are still loading")
            return
        await handle_twilio_call(websocket, manager=manager, config=config, metrics=metrics, gate=gate)

    @app.websocket("/v1/realtime")
    async def realtime(websocket: WebSocket, model: str | None = None) -> None:
        """OpenAI's Realtime protocol; `model` names the agent (none: the default agent)."""
        if not readiness.ready.is_set():
            await websocket.close(code=CLOSE_TRY_LATER, reason="models are still loading")
            return
        await handle_realtime_session(websocket, model=model, manager=manager, config=config, metrics=metrics,
                                      gate=gate, asr=engines.asr)

    @app.get("/api/calls")
    async def list_calls(limit: int = 50, offset: int = 0, external_id: str | None = None) -> dict:
        stored = await store.list_calls(limit, offset, external_id)
        for row in stored:
            row["live"] = manager.live(row["id"]) is not None
        return {"calls": stored}

    @app.get("/api/calls/{call_id}")
    async def get_call(call_id: str) -> JSONResponse:
        live = manager.live(call_id)
        if live is not None:
            return JSONResponse(live.snapshot())
        stored = await store.get_call(call_id)
        if stored is None:
            return error_response(404, f"no call {call_id}")
        return JSONResponse({**stored, "live": False})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/")
    async def index() -> FileResponse:
        return FileResponse(FRONTEND_DIR / "index.html")

    # Changes need an operator key (reads do not, yet): see agent/access.py.
    changes_need_a_key = [Depends(operator_required(gate))]
    app.include_router(agents_router(agents, chat, max_body_bytes=config.agents.max_body_bytes,
                                     forget_knowledge=knowledge.forget_agent), dependencies=changes_need_a_key)
    app.include_router(knowledge.router(agent_exists=agents.exists), dependencies=changes_need_a_key)
    app.include_router(transcription_router(transcriptions), dependencies=changes_need_a_key)
    # Reads, open as /api/calls and the dashboard are: an operator in an incident needs them at once.
    app.include_router(health_router(readiness=readiness, manager=manager, engines=engines, loop_lag=loop_lag,
                                     store=store, capacity=config.server.max_concurrent_calls,
                                     started_at=started_at))
    app.include_router(dashboard_router(store=store, manager=manager, events=events, engines=engines,
                                        page=FRONTEND_DIR / "dashboard.html"))
    app.mount("/static", StaticFiles(directory=FRONTEND_DIR), name="static")
    return app


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


def _from_loopback(request: Request) -> bool:
    host = request.client.host if request.client else ""
    return host in ("127.0.0.1", "::1", "localhost") or host.startswith("127.")
