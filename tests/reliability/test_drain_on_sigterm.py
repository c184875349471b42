"""SIGTERM drains (issue 13, scenario 12, short version): /readyz turns 503 at once, new calls
are refused, live calls go on until they end or the grace period from config runs out, every
call is stored as ended with the right reason, and the process exits 0. The server runs in a
process of its own (tests/reliability/fake_server.py) so that it gets a real signal."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import websockets

from latency_bench.chaos.admission import calls_active, phone_caller
from tests.test_bad_input import closed_with

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60


@asynccontextmanager
async def server_process(tmp_path: Path, *, grace_s: float):
    port_file, db, log = tmp_path / "port", tmp_path / "calls.sqlite3", tmp_path / "server.log"
    with open(log, "wb") as output:  # a file, not a pipe nobody reads: pipecat logs every frame hop
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.fake_server", "--db", str(db), "--port-file", str(port_file),
             "--grace", str(grace_s)],
            cwd=REPO_ROOT, stdout=output, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not port_file.exists() or not port_file.read_text():
            assert process.poll() is None, f"server exited early:\n{log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, "server did not become ready"
            await asyncio.sleep(0.05)
        yield process, int(port_file.read_text()), db
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


async def open_calls(base_url: str, count: int) -> list:
    return [await phone_caller(base_url, n) for n in range(count)]


async def wait_for_active(base_url: str, count: int) -> None:
    async with asyncio.timeout(10):
        while await calls_active(base_url) != count:
            await asyncio.sleep(0.02)


async def exit_status(process: subprocess.Popen, timeout_s: float) -> int:
    async with asyncio.timeout(timeout_s):
        while process.poll() is None:
            await asyncio.sleep(0.05)
    return process.returncode


def stored_calls(db: Path) -> list[tuple[str, float | None, str | None]]:
    with sqlite3.connect(db) as connection:
        return connection.execute("SELECT external_id, ended_at, end_reason FROM calls ORDER BY external_id").fetchall()


@pytest.mark.slow
async def test_sigterm_drains_live_calls_then_exits_zero(tmp_path):
    async with server_process(tmp_path, grace_s=30) as (process, port, db):
        base, ws_url = f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}"
        live = await open_calls(base, 3)
        await wait_for_active(base, 3)
        async with httpx.AsyncClient(base_url=base) as http:
            os.kill(process.pid, signal.SIGTERM)
            signalled = time.monotonic()
            async with asyncio.timeout(1.0):  # the load balancer is told within a second
                while (await http.get("/readyz")).status_code != 503:
                    await asyncio.sleep(0.02)
            assert time.monotonic() - signalled < 1.0
            refused = await websockets.connect(f"{ws_url}/ws/twilio", open_timeout=5)
            code, reason = await closed_with(refused)
            assert code == 1013 and "draining" in reason
            # The live calls go on: they still take audio, and the server has not stopped.
            await asyncio.sleep(0.5)
            for ws in live:
                await ws.send(json.dumps({"event": "media", "media": {"payload": ""}}))
            assert process.poll() is None and all(ws.close_code is None for ws in live)
            assert (await http.get("/api/drain")).json() == {"draining": True, "calls_active": 3}
        for ws in live:  # the callers hang up, one by one
            await ws.send(json.dumps({"event": "stop"}))
            await closed_with(ws)
        assert await exit_status(process, timeout_s=10) == 0
    calls = stored_calls(db)
    assert [(sid, reason) for sid, _, reason in calls] == [(f"CAchaos{n}", "caller_hung_up") for n in range(3)]
    assert all(ended is not None for _, ended, _ in calls)


@pytest.mark.slow
async def test_calls_still_live_when_the_grace_runs_out_are_ended_as_server_shutdown(tmp_path):
    async with server_process(tmp_path, grace_s=1.0) as (process, port, db):
        live = await open_calls(f"http://127.0.0.1:{port}", 2)
        await wait_for_active(f"http://127.0.0.1:{port}", 2)
        os.kill(process.pid, signal.SIGTERM)
        signalled = time.monotonic()
        assert await exit_status(process, timeout_s=15) == 0
        assert time.monotonic() - signalled >= 1.0  # the grace was given
        for ws in live:
            code, _ = await closed_with(ws, timeout_s=5)
            assert code is not None
    calls = stored_calls(db)
    assert [reason for _, _, reason in calls] == ["server_shutdown", "server_shutdown"]
    assert all(ended is not None for _, ended, _ in calls)


@pytest.mark.slow
async def test_a_second_signal_stops_at_once(tmp_path):
    async with server_process(tmp_path, grace_s=60) as (process, port, db):
        live = await open_calls(f"http://127.0.0.1:{port}", 1)
        await wait_for_active(f"http://127.0.0.1:{port}", 1)
        os.kill(process.pid, signal.SIGTERM)
        await asyncio.sleep(0.3)
        assert process.poll() is None  # draining, the call still live
        os.kill(process.pid, signal.SIGINT)
        interrupted = time.monotonic()
        await exit_status(process, timeout_s=15)  # uvicorn passes Ctrl-C on: the status says so
        assert time.monotonic() - interrupted < 15 < 60  # not after the 60 s grace
        await closed_with(live[0], timeout_s=5)
    assert [reason for _, _, reason in stored_calls(db)] == ["server_shutdown"]
