"""GET /api/health: what an operator needs in an incident, in one read.

/healthz (the process answers) and /readyz (send calls here) are for load balancers and stay
minimal. This is for a person: one status word with the reasons behind it, the calls in
progress against capacity, each engine's load, the event loop's lag, uptime and the store.

    status    draining  no new calls, by request (`cadence drain`, SIGTERM)
              failed    the models did not load; the server stays up, not ready
              starting  the models are still loading
              degraded  serving, but something an operator should look at (`reasons`)
              ok        serving, nothing to report

It answers 200 whatever the status: the body is the answer, and a server that can answer
this is up. `overall_status` is pure; the route (agent/health_routes.py) only gathers what it judges.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.calls import CallManager
from agent.store import CallStore
from models.base import Engine
from pipelines.voice import Engines

ENGINE_ROLES = ("asr", "llm", "tts", "embedder", "turn_end")
# The count of calls is exact; the list is for reading at a glance (the dashboard has them all).
MAX_LISTED_CALLS = 20
# A store that cannot run `SELECT 1` within this is as good as down for the calls writing to it.
STORE_PING_TIMEOUT_S = 1.0


class Readiness:
    """Whether the server takes calls yet: set once every engine is loaded and warmed."""

    def __init__(self) -> None:
        self.ready = asyncio.Event()
        self.error: str | None = None  # why loading failed; the server then stays up, not ready
        # Roles whose engine has loaded, added from the loading thread as each one finishes:
        # while a slow load runs, the operator sees which engine it is stuck on.
        self.loaded: set[str] = set()


def named_engines(engines: Engines) -> dict[str, Engine]:
    """Role -> engine, for the roles this server has an engine for."""
    return {role: engine for role in ENGINE_ROLES if (engine := getattr(engines, role)) is not None}


@dataclass(frozen=True)
class StoreCheck:
    reachable: bool
    latency_ms: float | None = None  # how long `SELECT 1` took, queueing behind other statements included
    error: str | None = None


@dataclass(frozen=True)
class Findings:
    """What the status is judged from."""

    ready: bool
    load_error: str | None
    draining: bool
    lag_max_s: float | None  # the largest recent event-loop lag; None before the first probe
    lag_limit_s: float
    store: StoreCheck
    cooling_off: Sequence[str] = field(default_factory=tuple)  # "role replica url why" of replicas passed over


def overall_status(findings: Findings) -> tuple[str, list[str]]:
    """The status word, and every reason an operator should look at (whatever the word)."""
    reasons = []
    if findings.load_error is not None:
        reasons.append(f"models failed to load: {findings.load_error}")
    if findings.lag_max_s is not None and findings.lag_max_s >= findings.lag_limit_s:
        reasons.append(f"event loop lagged {findings.lag_max_s:.3f} s recently (limit {findings.lag_limit_s:g} s): "
                       "something blocks it; callers hear gaps")
    if not findings.store.reachable:
        reasons.append(f"call store did not answer: {findings.store.error}")
    reasons.extend(f"{replica}; passed over for now" for replica in findings.cooling_off)
    if findings.draining:
        return "draining", reasons
    if findings.load_error is not None:
        return "failed", reasons
    if not findings.ready:
        return "starting", reasons
    return ("degraded" if reasons else "ok"), reasons


async def check_store(store: CallStore, *, timeout_s: float = STORE_PING_TIMEOUT_S,
                      clock: Callable[[], float] = time.monotonic) -> StoreCheck:
    started = clock()
    try:
        await asyncio.wait_for(store.ping(), timeout_s)
    except asyncio.TimeoutError:
        return StoreCheck(False, error=f"no answer within {timeout_s:g} s")
    except Exception as exc:  # reported, not raised: a health page must answer when the store does not
        return StoreCheck(False, error=f"{type(exc).__name__}: {exc}"[:200])
    return StoreCheck(True, latency_ms=round((clock() - started) * 1000.0, 2))


def engine_health(engines: dict[str, Engine], readiness: Readiness) -> dict[str, dict[str, Any]]:
    return {role: {"kind": type(engine).__name__, "loaded": role in readiness.loaded, **engine.health()}
            for role, engine in engines.items()}


def cooling_off(engine_states: dict[str, dict[str, Any]]) -> list[str]:
    return [f"{role} replica {replica['url']} {replica['why']}" for role, state in engine_states.items()
            for replica in state.get("replicas", ()) if replica["cooling_off"]]


def calls_in_progress(manager: CallManager, capacity: int, now: float) -> dict[str, Any]:
    listed = [{"id": call["id"], "transport": call["transport"], "agent": call["agent"],
               "started_at": call["started_at"], "seconds": round(max(0.0, now - call["started_at"]), 1),
               "turns": call["turns"]}
              for call in manager.in_progress()[:MAX_LISTED_CALLS]]
    return {"active": manager.active_count, "capacity": capacity, "listed": listed}
