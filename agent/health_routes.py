"""The health area's routes: probes for load balancers, the operator's view, drain, metrics.

    GET    /healthz       200 {"status": "ok"} as soon as the process answers
    GET    /readyz        200 when every engine is loaded and warmed; 503 while loading, after
                          a failed load ("failed" and the error) and while draining
    GET    /api/health    what an operator needs in an incident, in one read (agent/health.py)
    POST   /api/drain     refuse new calls, keep the live ones; only from this machine
    GET    /api/drain     whether the server drains, and the calls still in progress
    GET    /metrics       Prometheus' text format
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from agent.access import Gatekeeper
from agent.calls import CallManager
from agent.health import (Findings, Readiness, calls_in_progress, check_store, cooling_off, engine_health,
                          named_engines, overall_status)
from agent.http_util import error_response
from agent.loop_lag import LoopLagMonitor
from agent.metrics import CadenceMetrics
from agent.store import CallStore
from pipelines.voice import Engines

log = logging.getLogger(__name__)


def probes_router(*, readiness: Readiness, manager: CallManager, gate: Gatekeeper,
                  metrics: CadenceMetrics) -> APIRouter:
    """/healthz, /readyz, /api/drain and /metrics: for machines (load balancers, `cadence drain`,
    Prometheus), each minimal."""
    router = APIRouter()

    @router.get("/healthz")
    async def healthz() -> dict:
        return {"status": "ok"}

    @router.get("/readyz")
    async def readyz() -> JSONResponse:
        if manager.draining:  # the load balancer stops sending calls here
            return JSONResponse({"status": "draining", "calls_active": manager.active_count}, status_code=503)
        if readiness.ready.is_set():
            return JSONResponse({"status": "ready", "calls_active": manager.active_count})
        status = "failed" if readiness.error else "loading"
        return JSONResponse({"status": status, "error": readiness.error}, status_code=503)

    @router.post("/api/drain")
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

    @router.get("/api/drain")
    async def drain_status() -> JSONResponse:
        return JSONResponse({"draining": manager.draining, "calls_active": manager.active_count})

    @router.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    return router


def health_router(*, readiness: Readiness, manager: CallManager, engines: Engines, loop_lag: LoopLagMonitor,
                  store: CallStore, capacity: int, started_at: float, clock: Callable[[], float] = time.time,
                  monotonic: Callable[[], float] = time.monotonic) -> APIRouter:
    """GET /api/health, for a person. `started_at`: when the app was created, on `monotonic`'s
    scale (uptime); `clock`: wall time, the scale calls' `started_at` is on."""
    router = APIRouter()
    by_role = named_engines(engines)

    @router.get("/api/health")
    async def health() -> dict[str, Any]:
        store_check = await check_store(store)
        engine_states = engine_health(by_role, readiness)
        lag = loop_lag.snapshot()
        status, reasons = overall_status(Findings(
            ready=readiness.ready.is_set(), load_error=readiness.error, draining=manager.draining,
            lag_max_s=lag["max_recent_s"], lag_limit_s=loop_lag.options.degraded_at_s, store=store_check,
            cooling_off=cooling_off(engine_states)))
        return {"status": status, "reasons": reasons, "uptime_s": round(monotonic() - started_at, 1),
                "calls": calls_in_progress(manager, capacity, clock()), "engines": engine_states,
                "event_loop": lag,
                "store": {"reachable": store_check.reachable, "latency_ms": store_check.latency_ms,
                          "error": store_check.error}}

    return router


def _from_loopback(request: Request) -> bool:
    host = request.client.host if request.client else ""
    return host in ("127.0.0.1", "::1", "localhost") or host.startswith("127.")
