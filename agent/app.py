"""The HTTP/WebSocket server: the parts of one server (agent/composition.py) and the routers
of each area on them; the work lives in calls, transports, engines.

    health          /healthz, /readyz, /api/health, /api/drain, /metrics   agent/health_routes.py
    calls           /, /api/offer, /ws/twilio, /api/calls                  agent/call_routes.py
    realtime        /v1/realtime, /v1/realtime/client_secrets              agent/realtime_routes.py
    agents          /api/agents...                                         agent/agent_routes.py
    knowledge       /api/agents/{name}/knowledge, /search                  agent/knowledge_routes.py
    transcription   /api/transcriptions...                                 agent/transcription_routes.py
    dashboard       /dashboard, /api/turns, /api/dashboard/...             agent/dashboard.py

Startup serves /healthz at once and loads models in the background; /readyz turns 200
only when every engine is loaded and warmed, and callers are refused (503 / 1013) until then.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles

from agent.access import operator_required
from agent.agent_routes import agents_router
from agent.call_routes import calls_router
from agent.composition import ServerParts, compose
from agent.config import CadenceConfig
from agent.dashboard import dashboard_router
from agent.errors import CadenceError, ForbiddenError, UnauthorizedError
from agent.health_routes import health_router, probes_router
from agent.http_util import error_for
from agent.realtime_routes import realtime_router
from agent.transcription_routes import transcription_router
from pipelines.voice import Engines

FRONTEND_DIR = Path(__file__).resolve().parent.parent / "frontend"


def create_app(config: CadenceConfig, *, engines: Engines | None = None, engines_loaded: bool = False,
               environ: Mapping[str, str] | None = None, freeze_after_load: bool = False) -> FastAPI:
    """`engines` may be passed in already loaded (tests share one set across apps).
    A bad agent file raises ConfigError here, naming the file and the field: startup stops.
    `environ` (default: the process's) supplies API keys and the Twilio auth token.
    `freeze_after_load`: once loaded, take what startup made out of the garbage collector's
    scans (agent/gc_pauses.py); for a process that is this server alone (the CLI), not for one
    that runs several apps one after another (tests)."""
    parts = compose(config, engines=engines, engines_loaded=engines_loaded, environ=environ)
    app = FastAPI(title="Cadence", lifespan=parts.lifespan(freeze_after_load=freeze_after_load))
    parts.publish(app.state)
    app.add_exception_handler(UnauthorizedError, _refused)
    app.add_exception_handler(ForbiddenError, _refused)
    include_routers(app, parts)
    app.mount("/static", StaticFiles(directory=FRONTEND_DIR), name="static")
    return app


def include_routers(app: FastAPI, parts: ServerParts) -> None:
    config, readiness, gate, metrics, manager = parts.config, parts.readiness, parts.gate, parts.metrics, parts.manager
    app.include_router(probes_router(readiness=readiness, manager=manager, gate=gate, metrics=metrics))
    app.include_router(calls_router(config=config, readiness=readiness, gate=gate, metrics=metrics, manager=manager,
                                    webrtc=parts.webrtc, store=parts.store, page=FRONTEND_DIR / "index.html"))
    app.include_router(realtime_router(config=config, readiness=readiness, gate=gate, metrics=metrics,
                                       manager=manager, asr=parts.engines.asr))
    # Changes need an operator key (reads do not, yet): see agent/access.py.
    changes_need_a_key = [Depends(operator_required(gate))]
    app.include_router(agents_router(parts.agents, parts.chat, max_body_bytes=config.agents.max_body_bytes,
                                     forget_knowledge=parts.knowledge.forget_agent), dependencies=changes_need_a_key)
    app.include_router(parts.knowledge.router(agent_exists=parts.agents.exists), dependencies=changes_need_a_key)
    app.include_router(transcription_router(parts.transcriptions), dependencies=changes_need_a_key)
    # Reads, open as /api/calls and the dashboard are: an operator in an incident needs them at once.
    app.include_router(health_router(readiness=readiness, manager=manager, engines=parts.engines,
                                     loop_lag=parts.loop_lag, store=parts.store,
                                     capacity=config.server.max_concurrent_calls, started_at=parts.started_at))
    app.include_router(dashboard_router(store=parts.store, manager=manager, events=parts.events,
                                        engines=parts.engines, page=FRONTEND_DIR / "dashboard.html"))


async def _refused(_request: Request, exc: CadenceError) -> JSONResponse:
    return error_for(exc)
