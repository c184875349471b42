"""Access control swept (issue 13, scenario 14), the short version of `latency_bench chaos
access`, judged by its pass figure: on every route that starts a call or changes something,
missing, wrong, expired, reused and `alg: none` credentials and a foreign Origin are all
refused, a valid credential gets past the same routes, and no key or token reaches any log
line, at DEBUG included. The routes come from the app's own route table: one that changes
something and is not classified in latency_bench/chaos/inputs/access_routes.py fails here."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
from fastapi.staticfiles import StaticFiles

from agent.access import CredentialRedactor
from agent.app import FRONTEND_DIR, create_app
from agent.auth import AuthConfig
from latency_bench.chaos import access
from latency_bench.chaos.inputs import access_routes
from latency_bench.chaos.inputs.access_routes import CALL, GUARDS, LOCAL, NOT_SWEPT, label
from pipelines.voice import Engines
from tests.conftest import CLIENT_LOGGERS, running_server
from tests.fakes import HashingEmbedder, ScriptedASR, ScriptedLLM, ToneTTS

KEY = "sweep-operator-key-0123456789"


def fake_engines() -> Engines:
    return Engines(asr=ScriptedASR("hi"), llm=ScriptedLLM(["Hello there."]), tts=ToneTTS(), embedder=HashingEmbedder())


@pytest.fixture
def keyed(server_config):
    config = replace(server_config, auth=AuthConfig(allowed_origins=("https://app.example",)))
    with running_server(config, fake_engines(), environ={"CADENCE_API_KEYS": KEY}) as running:
        yield running


@pytest.fixture
def server_log(keyed):
    """Every line the server logs from here on, at DEBUG: uvicorn's own loggers (which do not
    propagate to the root, and log WebSocket handshake headers at DEBUG) and pipecat's loguru
    too. The test's clients log the headers they send; those lines are theirs, left out."""
    from loguru import logger as loguru

    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if not record.name.startswith(CLIENT_LOGGERS):
                lines.append(f"{record.name}: {self.format(record)}")

    handler = Collect(level=logging.DEBUG)
    # Levels set after `keyed` has started: uvicorn sets its loggers' levels as it starts.
    holders = [logging.getLogger(name) for name in ("", "uvicorn", "uvicorn.access")]
    leveled = [logging.getLogger(name) for name in ("", "uvicorn.error", "uvicorn.access")]
    levels = [each.level for each in leveled]
    for each in holders:
        each.addHandler(handler)
    for each in leveled:
        each.setLevel(logging.DEBUG)
    sink = loguru.add(lambda message: lines.append(f"loguru: {message}"), level="DEBUG")
    yield lines
    loguru.remove(sink)
    for each, level in zip(leveled, levels):
        each.setLevel(level)
    for each in holders:
        each.removeHandler(handler)


def test_every_route_that_changes_something_is_classified(server_config):
    app = create_app(server_config, engines=fake_engines(), engines_loaded=True, environ={})
    routes = access_routes.mutating_routes(app)
    assert access_routes.unclassified(routes) == [], (
        "classify each new route that changes something in latency_bench/chaos/inputs/access_routes.py (GUARDS, or "
        "NOT_SWEPT with the reason)")
    assert set(GUARDS) | set(NOT_SWEPT) <= routes, "a classified route is gone: take it out of the tables"

    # A route added without a word is caught, whatever it is.
    @app.post("/api/agents/{name}/clone")
    async def clone(name: str) -> None: ...

    @app.websocket("/ws/other")
    async def other(websocket) -> None: ...

    app.mount("/uploads", StaticFiles(directory=FRONTEND_DIR))
    assert access_routes.unclassified(access_routes.mutating_routes(app)) == [
        ("MOUNT", "/uploads"), ("POST", "/api/agents/{name}/clone"), ("WS", "/ws/other")]


@pytest.mark.slow
async def test_bad_credentials_are_refused_everywhere_and_none_is_logged(keyed, server_log):
    routes = access_routes.mutating_routes(keyed.app)
    assert await access_routes.routes_from_openapi(keyed.base_url) == routes  # the bench finds the same
    figures = await access.run(keyed.base_url, key=KEY, read_log=lambda: "\n".join(server_log), routes=routes)
    verdict = access.judge(figures)
    assert figures["not_refused"] == []
    assert verdict.passed, verdict.measured

    matrix = figures["matrix"]
    assert set(matrix) == {label(r) for r in GUARDS}
    for route, guard in GUARDS.items():
        assert set(matrix[label(route)]) == set(access.kinds_for(guard)), route
    # The tokens were refused for what they were, not as strangers: the refusals are not vacuous.
    for route in ("POST /api/offer", "WS /v1/realtime"):
        assert matrix[route]["expired"] == ["401 expired"] and matrix[route]["reused"] == ["401 reused"], route
    # A valid credential got past every route the sweep refused (a client token too where calls start).
    assert set(figures["accepted_with_valid"]) == (
        {f"{label(r)} [key]" for r, guard in GUARDS.items() if guard != LOCAL}
        | {f"{label(r)} [client token]" for r, guard in GUARDS.items() if guard == CALL})
    assert figures["accepted_with_valid"]["WS /v1/realtime [client token]"] == "101"

    # The log check saw what it must: the refusals and the handshake headers that carried the credentials.
    text = "\n".join(server_log)
    assert "access refused" in text
    assert "< authorization: [redacted]" in text and "openai-insecure-api-key.[redacted]" in text


@pytest.mark.parametrize(("args", "expected"), [
    (("authorization", "Bearer sk-live-123"), "< authorization: [redacted]"),
    (("api-key", "sk-live-123"), "< api-key: [redacted]"),
    (("X-Twilio-Signature", "c2lnbmF0dXJl"), "< X-Twilio-Signature: [redacted]"),
    (("sec-websocket-protocol", "realtime, openai-insecure-api-key.sk-live-123"),
     "< sec-websocket-protocol: realtime, openai-insecure-api-key.[redacted]"),
    (("user-agent", "Python/3.11 websockets/17.4"), "< user-agent: Python/3.11 websockets/17.4"),
])
def test_the_handshake_log_masks_credentials_and_keeps_the_rest(args, expected):
    record = logging.LogRecord("uvicorn.error", logging.DEBUG, __file__, 1, "< %s: %s", args, None)
    assert CredentialRedactor().filter(record) and record.getMessage() == expected
