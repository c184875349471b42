"""Which of the server's routes change something, and what guards each: the route table of the
access sweep (latency_bench.chaos.access).

A route changes something if it takes POST, PUT, PATCH or DELETE, or is a WebSocket (a call).
Each such route is classified here; `tests/reliability/test_access_sweep.py` fails on one that
is not, so a new route cannot go out unguarded by accident, and the sweep tries bad
credentials on every route it finds, classified or not.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx

CALL = "call"  # starts a call: an operator key or an unused client token, and an allowed Origin
OPERATOR = "operator"  # changes an agent or its knowledge, or mints a token: an operator key, an allowed Origin
LOCAL = "local"  # takes no credential: only from this machine, and only with an allowed Origin

MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
WEBSOCKET = "WS"  # the "method" of a WebSocket route in these tables

GUARDS: dict[tuple[str, str], str] = {
    (WEBSOCKET, "/ws/twilio"): CALL,
    (WEBSOCKET, "/v1/realtime"): CALL,
    ("POST", "/api/offer"): CALL,
    ("POST", "/v1/realtime/client_secrets"): OPERATOR,
    ("POST", "/api/agents"): OPERATOR,
    ("PUT", "/api/agents/{name}"): OPERATOR,
    ("PATCH", "/api/agents/{name}"): OPERATOR,
    ("POST", "/api/agents/{name}/chat"): OPERATOR,  # spends the LLM: an operator's, as the agent is
    ("POST", "/api/agents/{name}/knowledge"): OPERATOR,
    ("DELETE", "/api/agents/{name}/knowledge/{doc_id}"): OPERATOR,
    ("POST", "/api/transcriptions"): OPERATOR,
    ("DELETE", "/api/transcriptions/{job_id}"): OPERATOR,
    ("DELETE", "/api/agents/{name}"): OPERATOR,
    ("POST", "/api/drain"): LOCAL,  # `cadence drain`, Kubernetes' preStop, holds no key
}

# Routes that change something and are not swept, each with the reason.
NOT_SWEPT: dict[tuple[str, str], str] = {
    ("PATCH", "/api/offer"): "adds ICE candidates to a live WebRTC call named by its pc_id, which only the "
                             "offer's answer gives out; but GET /api/calls (open, as reads are) lists pc_ids",
}

# Mounted apps that only serve reads (StaticFiles answers GET and HEAD, nothing else).
READ_ONLY_MOUNTS = frozenset({"/static"})


def _routes_with_paths(app) -> Iterator[tuple[object, str]]:
    """(route, path) of every route of the app, its included routers' too: newer FastAPI keeps an
    included router whole in `app.routes`, and `iter_route_contexts` lists what it holds."""
    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:  # an older FastAPI copies included routes into app.routes
        yield from ((route, route.path) for route in app.routes)
        return
    for context in iter_route_contexts(app.routes):
        yield context.original_route, context.path


def mutating_routes(app) -> set[tuple[str, str]]:
    """(method, path) of every route of a FastAPI app that may change something; a mount not
    known to be read-only is one too, as ("MOUNT", path)."""
    from fastapi.routing import APIWebSocketRoute
    from starlette.routing import Mount, WebSocketRoute

    found: set[tuple[str, str]] = set()
    for route, path in _routes_with_paths(app):
        if isinstance(route, (APIWebSocketRoute, WebSocketRoute)):
            found.add((WEBSOCKET, path))
        elif isinstance(route, Mount):
            if path not in READ_ONLY_MOUNTS:
                found.add(("MOUNT", path))
        else:
            found |= {(m, path) for m in getattr(route, "methods", None) or () if m in MUTATING_METHODS}
    return found


async def routes_from_openapi(base_url: str) -> set[tuple[str, str]]:
    """The HTTP routes a running server that may change something, from its OpenAPI document,
    with the WebSocket routes classified above (OpenAPI does not list WebSockets)."""
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as http:
        response = await http.get("/openapi.json")
        response.raise_for_status()
    found = {(method.upper(), path) for path, operations in response.json()["paths"].items()
             for method in operations if method.upper() in MUTATING_METHODS}
    return found | {route for route in GUARDS if route[0] == WEBSOCKET}


def guard_of(route: tuple[str, str]) -> str:
    """A route's guard; an unclassified one is held to the strictest (an operator key)."""
    return GUARDS.get(route, OPERATOR)


def unclassified(routes: set[tuple[str, str]]) -> list[tuple[str, str]]:
    return sorted(r for r in routes if r not in GUARDS and r not in NOT_SWEPT)


def filled(path: str, params: dict[str, str], default: str) -> str:
    """`path` with each {param} replaced by its value (`default` for one not given)."""
    return re.sub(r"\{(\w+)(?::\w+)?\}", lambda m: params.get(m[1], default), path)


def label(route: tuple[str, str]) -> str:
    return f"{route[0]} {route[1]}"
