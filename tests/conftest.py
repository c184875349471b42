"""Shared fixtures: the embedded models (loaded once per session) and a real server on loopback."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from agent.app import create_app
from agent.config import CadenceConfig, StoreConfig, load_config
from agent.serve import cadence_server
from agent import engine_factory as registry
from pipelines.voice import Engines

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO_ROOT / "configs" / "default.yaml"
TEST_MAX_CALLS = 4


@pytest.fixture(scope="session")
def default_config() -> CadenceConfig:
    return load_config(DEFAULT_CONFIG)


@pytest.fixture(scope="session")
def embedded_engines(default_config: CadenceConfig) -> Iterator[Engines]:
    """The real default models, loaded and warmed once for every test that needs them."""
    engines = registry.build_engines(default_config)
    registry.load_and_warm(engines)
    yield engines


@dataclass(frozen=True)
class RunningServer:
    base_url: str
    ws_url: str
    app: object


@contextmanager
def running_server(config: CadenceConfig, engines: Engines | None, *, ready_timeout_s: float = 60,
                   environ: dict[str, str] | None = None, host: str = "127.0.0.1") -> Iterator[RunningServer]:
    """Serves the real app with uvicorn on a free port of `host` (loopback) in a thread of its own.
    `engines` None: the app builds its own from the config, starting its deployment's workers.
    `environ`: the environment the app reads its keys from (default: none, not the process's)."""
    app = create_app(config, engines=engines, engines_loaded=engines is not None, environ=environ or {})
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    server = cadence_server(app, config, log_level="warning", lifespan="on")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + ready_timeout_s
    # Ready, not just listening: the agents' shipped documents are ingested before calls.
    while not (server.started and app.state.readiness.ready.is_set()):
        if time.monotonic() > deadline or not thread.is_alive() or app.state.readiness.error:
            raise RuntimeError(f"test server did not start: {app.state.readiness.error}")
        time.sleep(0.02)
    try:
        yield RunningServer(f"http://{host}:{port}", f"ws://{host}:{port}", app)
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        sock.close()


@pytest.fixture
def server_config(default_config: CadenceConfig, tmp_path: Path) -> CadenceConfig:
    # Tests run a few calls at once on purpose; the shipped limit is the measured capacity (1).
    return replace(default_config, store=StoreConfig(path=str(tmp_path / "calls.sqlite3")),
                   server=replace(default_config.server, max_concurrent_calls=TEST_MAX_CALLS),
                   transcription=replace(default_config.transcription, upload_dir=str(tmp_path / "uploads")))


@pytest.fixture
def server(server_config: CadenceConfig, embedded_engines: Engines) -> Iterator[RunningServer]:
    with running_server(server_config, embedded_engines) as running:
        yield running


async def finished_call(base_url: str, external_id: str, *, timeout_s: float = 5.0) -> dict:
    """The stored call a caller's external id names, once the server has closed it."""
    import asyncio

    import httpx

    async with httpx.AsyncClient(base_url=base_url) as http:
        call_id = (await http.get("/api/calls", params={"external_id": external_id})).json()["calls"][0]["id"]
        for _ in range(int(timeout_s / 0.1)):
            call = (await http.get(f"/api/calls/{call_id}")).json()
            if not call["live"]:
                return call
            await asyncio.sleep(0.1)
    raise AssertionError(f"call {call_id} still live after {timeout_s} s")


CLIENT_LOGGERS = ("websockets.client", "httpx", "httpcore", "openai")


@pytest.fixture
def log_lines():
    """Every line the server logs during the test (DEBUG and up), formatted: for what it must
    never log. The test's own clients (websockets' client, httpx, the openai SDK) log the
    headers they send at DEBUG; those lines are the client's, not the server's, and are left out."""
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if not record.name.startswith(CLIENT_LOGGERS):
                records.append(f"{record.name}: {self.format(record)}")

    handler = Collect(level=logging.DEBUG)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield records
    root.removeHandler(handler)
    root.setLevel(old_level)


# The fast tier's promise (`make check`: pure logic and fake engines, minutes in all): a test
# not marked `slow` whose setup, body or teardown takes longer than this fails, saying so.
# Real models, whole calls and servers belong under `slow`; a test waits on events and a fake
# clock, never on sleeps. CADENCE_FAST_TEST_LIMIT_S changes the limit for one run (e.g. on a
# machine much slower than the 2 cores this is sized for).
FAST_TEST_LIMIT_S = float(os.environ.get("CADENCE_FAST_TEST_LIMIT_S", "2.0"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    exempt = item.get_closest_marker("slow") or item.get_closest_marker("system")
    if report.passed and exempt is None and report.duration > FAST_TEST_LIMIT_S:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid}: its {report.when} took {report.duration:.2f} s, over the "
                           f"{FAST_TEST_LIMIT_S:.1f} s a test not marked `slow` may take: make it faster, "
                           "or mark it `slow` if it needs real models or whole calls")
