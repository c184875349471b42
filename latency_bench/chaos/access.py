"""Chaos scenario `access` (issue 13, scenario 14): bad credentials on every route that starts a
call or changes something, against a running server that has an operator key.

Each route of `access_routes` (those the server's OpenAPI document lists, and its WebSockets)
is tried with a missing credential, a wrong key, an expired, a reused and an unsigned
`alg: none` JWT token, an unused client token where a key is needed, and the valid key from a
foreign Origin, each sent every way the route reads one (Authorization, api-key, the
WebSocket key subprotocol). All must be refused (401/403, or the handshake refused so). The
valid key, and a client token on the call routes, must get past the same routes, so the
refusals say something. Then the server's log must hold none of the keys and tokens used.

`run` returns the measured figures; `judge` judges them. `server` starts one to run it on.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import websockets

from agent.access import KEY_SUBPROTOCOL_PREFIX
from latency_bench import servers
from latency_bench.chaos.inputs.access_routes import (CALL, GUARDS, LOCAL, NOT_SWEPT, WEBSOCKET, filled, guard_of,
                                                      label, routes_from_openapi, unclassified)
from latency_bench.chaos.verdict import Verdict

KINDS = ("missing", "wrong", "expired", "reused", "alg-none", "client-token", "foreign-origin")
FOREIGN_ORIGIN = "https://evil.example"
HTTP_CARRIERS, WS_CARRIERS = ("bearer", "api-key"), ("bearer", "subprotocol")
REFUSED_STATUSES = frozenset({401, 403})
SWEEP_AGENT = "access-sweep"  # created, changed and deleted with the valid key
PLACEHOLDER = "access-sweep"  # a path parameter the sweep has no real value for (a 404 past the gate)
EXPIRING_TTL_S, EXPIRY_MARGIN_S = 0.2, 0.2  # the token that has expired by the time it is tried
TOKEN_TTL_S = 120  # the others outlive the sweep
LOG_SETTLE_S = 0.5  # the server writes a request's last log lines after answering it
AGENT_SPEC = {"name": SWEEP_AGENT, "system_prompt": "You answer the access sweep's test calls."}

# What a valid request on each classified route looks like. Where the real thing is costly (a
# call, a transcription), one that fails validation once past access control shows the same.
REQUESTS: dict[tuple[str, str], dict] = {
    ("POST", "/api/offer"): {"content": b'{"type": "offer", "sdp": "v=0"}'},  # a bad SDP: 400, no call
    ("POST", "/v1/realtime/client_secrets"): {"json": {"expires_after": {"seconds": TOKEN_TTL_S}}},
    ("POST", "/api/agents"): {"json": AGENT_SPEC},
    ("PUT", "/api/agents/{name}"): {"json": AGENT_SPEC},
    ("PATCH", "/api/agents/{name}"): {"json": {"greeting": "Hello from the access sweep."}},
    ("POST", "/api/agents/{name}/chat"): {"json": {"message": "Hello?"}},
    ("POST", "/api/agents/{name}/knowledge"): {
        "files": [("file", ("sweep.txt", b"The access sweep's bakery opens at nine.", "text/plain"))]},
    ("POST", "/api/transcriptions"): {"params": {"diarize": "maybe"}, "content": b"RIFF"},  # 400: no Whisper
}


def unsigned_jwt(now: float) -> str:
    """A JWT as a forger makes one: `alg: none`, an admin's claims, an empty signature."""
    def part(obj: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj, separators=(",", ":")).encode()).rstrip(b"=").decode()
    claims = {"sub": "operator", "role": "admin", "exp": int(now) + 3600}
    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(claims)}."


@dataclass(frozen=True)
class Credentials:
    key: str
    wrong: str
    token: str  # minted, unused: valid for a call, not for a change
    expired: str
    reused: str  # used once, on POST /api/offer
    jwt: str

    def for_kind(self, kind: str) -> str | None:
        return {"missing": None, "wrong": self.wrong, "expired": self.expired, "reused": self.reused,
                "alg-none": self.jwt, "client-token": self.token, "foreign-origin": self.key}[kind]


@dataclass(frozen=True)
class Attempt:
    route: tuple[str, str]
    kind: str
    carrier: str  # bearer, api-key, subprotocol; "none" when nothing is sent


def kinds_for(guard: str) -> tuple[str, ...]:
    if guard == LOCAL:  # takes no credential: the Origin is all there is to judge
        return ("foreign-origin",)
    if guard == CALL:  # an unused client token is what a call takes
        return tuple(k for k in KINDS if k != "client-token")
    return KINDS


def attempts_for(routes: set[tuple[str, str]]) -> list[Attempt]:
    """Every bad credential on every route, every way the route reads one. LOCAL routes go
    last: a drain that got through would refuse every call after it."""
    out: list[Attempt] = []
    for route in sorted(routes, key=lambda r: (guard_of(r) == LOCAL, r[1], r[0])):
        carriers = WS_CARRIERS if route[0] == WEBSOCKET else HTTP_CARRIERS
        for kind in kinds_for(guard_of(route)):
            sends_nothing = kind == "missing" or guard_of(route) == LOCAL
            out += [Attempt(route, kind, "none")] if sends_nothing else [Attempt(route, kind, c) for c in carriers]
    return out


def _headers(carrier: str, credential: str | None, origin: str | None) -> tuple[dict[str, str], list[str]]:
    headers = {"Origin": origin} if origin else {}
    if credential is None or carrier == "none":
        return headers, []
    if carrier == "subprotocol":  # as a browser's WebSocket sends a key
        return headers, ["realtime", KEY_SUBPROTOCOL_PREFIX + credential]
    headers["Authorization" if carrier == "bearer" else "api-key"] = (
        f"Bearer {credential}" if carrier == "bearer" else credential)
    return headers, []


def _reason(body: bytes) -> str | None:
    """The refusal's `reason` as the server words it (HTTP: `reason`; /v1/realtime: `error.code`)."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    error = data.get("error") if isinstance(data, dict) else None
    return data.get("reason") or (error.get("code") if isinstance(error, dict) else None)


class Sweeper:
    """Sends one request or handshake to a route and says what came back ("401 invalid", "101")."""

    def __init__(self, http: httpx.AsyncClient, base_url: str, params: dict[str, str]) -> None:
        self._http, self._params = http, params
        self._ws_base = base_url.replace("http://", "ws://", 1).replace("https://", "wss://", 1)

    async def send(self, route: tuple[str, str], carrier: str, credential: str | None,
                   origin: str | None = None) -> str:
        headers, protocols = _headers(carrier, credential, origin)
        path = filled(route[1], self._params, PLACEHOLDER)
        if route[0] == WEBSOCKET:
            return await self._handshake(path, headers, protocols)
        async with self._http.stream(route[0], path, headers=headers, **REQUESTS.get(route, {})) as response:
            # Only a refusal's body is read: a chat that got through would stream a whole reply.
            reason = _reason(await response.aread()) if response.status_code in REFUSED_STATUSES else None
        return f"{response.status_code} {reason}" if reason else str(response.status_code)

    async def _handshake(self, path: str, headers: dict[str, str], protocols: list[str]) -> str:
        try:
            async with websockets.connect(self._ws_base + path, additional_headers=headers,
                                          subprotocols=protocols or None, open_timeout=10):
                return "101"  # admitted; leaving hangs up
        except websockets.InvalidStatus as exc:
            reason = _reason(exc.response.body or b"")
            return f"{exc.response.status_code} {reason}" if reason else str(exc.response.status_code)


def refused(outcome: str) -> bool:
    return int(outcome.split()[0]) in REFUSED_STATUSES


def accepted(outcome: str) -> bool:
    """Past access control and answered: a 5xx is a failure, not an acceptance."""
    status = int(outcome.split()[0])
    return status not in REFUSED_STATUSES and status < 500


def _bearer(credential: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}"}


class Minter:
    """Client tokens minted with the sweep's key; each is remembered for the log scan."""

    def __init__(self, http: httpx.AsyncClient, key: str, seen: dict[str, str]) -> None:
        self._http, self._key, self._seen = http, key, seen
        self.minted: list[str] = []

    async def __call__(self, ttl_s: float = TOKEN_TTL_S) -> str:
        response = await self._http.post("/v1/realtime/client_secrets", headers=_bearer(self._key),
                                         json={"expires_after": {"seconds": ttl_s}})
        self._seen["POST /v1/realtime/client_secrets [key]"] = str(response.status_code)
        if response.status_code != 200:
            raise RuntimeError(f"the server would not mint a client token with the sweep's key "
                               f"({response.status_code}): was it started with that key?")
        self.minted.append(response.json()["value"])
        return self.minted[-1]


async def _prepare(http: httpx.AsyncClient, key: str, mint: Minter, params: dict[str, str],
                   seen: dict[str, str]) -> Credentials:
    """The credentials to try, and something for each route to change: an agent, a document.
    The steps taken with the key are the first acceptances."""
    reused, token = await mint(), await mint()
    # Minted last: a mint purges expired tokens, and a purged one would read "unknown", not "expired".
    expired = await mint(EXPIRING_TTL_S)
    expires_at = time.monotonic() + EXPIRING_TTL_S  # later than the server's own expiry
    created = await http.post("/api/agents", headers=_bearer(key), **REQUESTS[("POST", "/api/agents")])
    seen["POST /api/agents [key]"] = str(created.status_code)  # 409: left by an earlier run in the same store
    knowledge = ("POST", "/api/agents/{name}/knowledge")
    uploaded = await http.post(filled(knowledge[1], params, PLACEHOLDER), headers=_bearer(key), **REQUESTS[knowledge])
    seen[f"{label(knowledge)} [key]"] = str(uploaded.status_code)
    if uploaded.status_code == 201:
        params["doc_id"] = uploaded.json()["documents"][0]["id"]
    first_use = await http.post("/api/offer", headers=_bearer(reused), **REQUESTS[("POST", "/api/offer")])
    seen["POST /api/offer [client token]"] = str(first_use.status_code)
    await asyncio.sleep(max(0.0, expires_at - time.monotonic()) + EXPIRY_MARGIN_S)
    return Credentials(key=key, wrong=secrets.token_urlsafe(24), token=token, expired=expired, reused=reused,
                       jwt=unsigned_jwt(time.time()))


async def _accept_each(sweeper: Sweeper, routes: set[tuple[str, str]], creds: Credentials, mint: Minter,
                       seen: dict[str, str]) -> None:
    """The valid key on each classified route (an unused client token too where a call starts).
    Deletions come last, the deepest first; LOCAL routes are not tried: a drain would work."""
    for route in sorted(routes, key=lambda r: (r[0] == "DELETE", -len(r[1]), r[1])):
        if route not in GUARDS or guard_of(route) == LOCAL:  # unclassified: no valid request is known
            continue
        if f"{label(route)} [key]" not in seen:
            seen[f"{label(route)} [key]"] = await sweeper.send(route, "bearer", creds.key)
        if guard_of(route) == CALL and f"{label(route)} [client token]" not in seen:
            carrier = "subprotocol" if route[0] == WEBSOCKET else "bearer"
            seen[f"{label(route)} [client token]"] = await sweeper.send(route, carrier, await mint())


def secrets_of(creds: Credentials, minted: list[str]) -> dict[str, str]:
    """Every key and token the sweep sent, by a name that can be printed in its place."""
    named = {"operator key": creds.key, "wrong key": creds.wrong, "alg-none JWT": creds.jwt}
    for n, token in enumerate(minted, 1):
        named[f"client token {n}"] = token
        named[f"client token {n} without its prefix"] = token.removeprefix("ek_")
    return named


def scan_log(text: str, named: dict[str, str]) -> dict:
    lines = text.splitlines()
    found = [{"secret": name, "lines": hits} for name, value in named.items()
             if (hits := sum(1 for line in lines if value in line))]
    return {"lines": len(lines), "secrets_found": found}


async def run(base_url: str, *, key: str, read_log: Callable[[], str] | None = None,
              routes: set[tuple[str, str]] | None = None) -> dict:
    """The sweep against a server started with operator key `key`. `read_log`: the server's log
    so far (None: not scanned, and the scenario fails). `routes`: (method, path) of the routes
    that change something (default: from the server's OpenAPI document, and its WebSockets)."""
    found = routes if routes is not None else await routes_from_openapi(base_url)
    swept = {r for r in found if r not in NOT_SWEPT}
    seen: dict[str, str] = {}
    params = {"name": SWEEP_AGENT}
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        mint = Minter(http, key, seen)
        creds = await _prepare(http, key, mint, params, seen)
        sweeper = Sweeper(http, base_url, params)
        results = [(a, await sweeper.send(a.route, a.carrier, creds.for_kind(a.kind),
                                          FOREIGN_ORIGIN if a.kind == "foreign-origin" else None))
                   for a in attempts_for(swept)]
        await _accept_each(sweeper, swept, creds, mint, seen)
    log = None
    if read_log is not None:
        await asyncio.sleep(LOG_SETTLE_S)
        log = scan_log(read_log(), secrets_of(creds, mint.minted))
    return _figures(found, swept, results, seen, log)


def _figures(found: set, swept: set, results: list[tuple[Attempt, str]], seen: dict[str, str],
             log: dict | None) -> dict:
    matrix: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    by_kind: dict[str, Counter] = defaultdict(Counter)
    for attempt, outcome in results:
        matrix[label(attempt.route)][attempt.kind].add(outcome)
        by_kind[attempt.kind].update(attempts=1, refused=int(refused(outcome)))
    not_refused = [{"route": label(a.route), "kind": a.kind, "carrier": a.carrier, "outcome": o}
                   for a, o in results if not refused(o)]
    return {"routes": sorted(label(r) for r in swept), "unclassified": [label(r) for r in unclassified(found)],
            "not_swept": {label(r): why for r, why in NOT_SWEPT.items() if r in found},
            "attempts": len(results), "refused": len(results) - len(not_refused), "not_refused": not_refused,
            "outcomes": dict(sorted(Counter(o for _, o in results).items())),
            "by_kind": {kind: dict(counts) for kind, counts in by_kind.items()},
            "matrix": {route: {kind: sorted(outcomes) for kind, outcomes in kinds.items()}
                       for route, kinds in sorted(matrix.items())},
            "accepted_with_valid": dict(sorted(seen.items())),
            "not_accepted_with_valid": sorted(k for k, o in seen.items() if not accepted(o)),
            "log": log}


def judge(f: dict) -> Verdict:
    log = f["log"]
    log_clean = log is not None and log["lines"] > 0 and not log["secrets_found"]  # an empty log proves nothing
    passed = (f["attempts"] > 0 and f["refused"] == f["attempts"] and not f["unclassified"]
              and not f["not_accepted_with_valid"] and log_clean)
    leaked = ("the log was not read" if log is None else
              f"keys or tokens in the {log['lines']}-line log: "
              f"{', '.join(s['secret'] for s in log['secrets_found']) or 'none'}")
    measured = (f"{f['refused']} of {f['attempts']} refused ({', '.join(f['outcomes'])}) on {len(f['routes'])} "
                f"routes; {len(f['accepted_with_valid']) - len(f['not_accepted_with_valid'])} of "
                f"{len(f['accepted_with_valid'])} valid requests accepted; {leaked}")
    if f["unclassified"]:
        measured += f"; unclassified routes: {', '.join(f['unclassified'])}"
    return Verdict("access", "missing, wrong, expired, reused and alg:none credentials and a foreign Origin on "
                             "every route that starts a call or changes an agent: 100 % refused, a valid "
                             "key accepted on each; no key or token in any log line", measured, passed, f)


@contextlib.contextmanager
def server(out: Path, *, config: Path = servers.DEFAULT_CONFIG,
           max_calls: int = 4) -> Iterator[tuple[str, str, Path]]:
    """A Cadence server for the sweep: a fresh random operator key, given in its environment (no
    file holds it), logging at DEBUG (handshake headers included) into out/cadence.log.
    Yields (base URL, key, log path)."""
    key = "access-sweep-" + secrets.token_urlsafe(32)  # a prefix: never "ek_", which marks a client token
    with servers.cadence(out, max_calls=max_calls, config=config, log_level="debug",
                         environ={"CADENCE_API_KEYS": key}) as base_url:
        yield base_url, key, out / "cadence.log"
