"""Chaos scenario: SIGTERM with calls live (a rolling deploy, `docker stop`).

Starts its own server (`cadence serve`, real models) admitting `calls` calls, with
server.shutdown_grace_seconds = `grace_s`; opens `calls` phone calls; sends SIGTERM; then
measures how soon /readyz says 503, whether a new call is refused and the live ones keep
going, and, after the callers hang up `hold_s` later, the exit status and what the store
holds. `run` returns the figures; `judge` judges them.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import websockets

from latency_bench import servers
from latency_bench.chaos.admission import calls_active, hang_up, phone_caller
from latency_bench.chaos.verdict import Verdict

READY_TIMEOUT_S = 300.0


async def run(out: Path, *, calls: int, grace_s: float, hold_s: float, config: Path = servers.DEFAULT_CONFIG) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    store = out / "cadence-bench.sqlite3"
    store.unlink(missing_ok=True)
    bench_config = servers.write_bench_config(out, config, max_calls=calls,
                                              settings=[f"server.shutdown_grace_seconds={grace_s}"])
    port = servers.free_port()
    base_url = f"http://127.0.0.1:{port}"
    with open(out / "cadence-drain.log", "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "agent.cli", "serve", "--config", str(bench_config), "--host", "127.0.0.1",
             "--port", str(port), "--log-level", "info"],
            cwd=servers.REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        await _until_ready(base_url, process)
        live = [await phone_caller(base_url, n) for n in range(calls)]
        async with asyncio.timeout(30):
            while await calls_active(base_url) < calls:
                await asyncio.sleep(0.05)
        os.kill(process.pid, signal.SIGTERM)
        signalled = time.monotonic()
        readyz_503_s = await _until_not_ready(base_url)
        refused = await phone_caller(base_url, calls)
        try:
            async with asyncio.timeout(5):
                async for _ in refused:
                    pass
        except (TimeoutError, websockets.ConnectionClosed):
            pass
        new_call_code = refused.close_code
        await asyncio.sleep(max(0.0, hold_s - (time.monotonic() - signalled)))
        alive_after_hold = process.poll() is None and all(ws.close_code is None for ws in live)
        for ws in live:
            await hang_up(ws)
        exit_status = await _exit_status(process, timeout_s=grace_s + 30)
        stopped_s = time.monotonic() - signalled
    finally:
        servers.stop(process)  # SIGTERM first: a SIGKILLed server cannot stop its model workers
    with sqlite3.connect(store) as db:
        rows = db.execute("SELECT ended_at, end_reason FROM calls").fetchall()
    return {"calls": calls, "grace_s": grace_s, "hold_s": hold_s, "readyz_503_after_s": readyz_503_s,
            "new_call_close_code": new_call_code, "live_calls_kept_through_hold": alive_after_hold,
            "exit_status": exit_status, "stopped_after_s": round(stopped_s, 2),
            "stored_calls": len(rows), "stored_without_end": sum(1 for ended, _ in rows if ended is None),
            "end_reasons": sorted({reason or "" for _, reason in rows})}


async def _until_ready(base_url: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    async with httpx.AsyncClient(base_url=base_url, timeout=2) as http:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the drain scenario's server exited with {process.returncode}")
            try:
                if (await http.get("/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"server not ready within {READY_TIMEOUT_S:.0f} s")
            await asyncio.sleep(0.25)


async def _until_not_ready(base_url: str) -> float | None:
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=base_url, timeout=2) as http:
        while time.monotonic() - started < 10:
            if (await http.get("/readyz")).status_code == 503:
                return round(time.monotonic() - started, 3)
            await asyncio.sleep(0.01)
    return None


async def _exit_status(process: subprocess.Popen, *, timeout_s: float) -> int | None:
    deadline = time.monotonic() + timeout_s
    while process.poll() is None and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return process.poll()


def judge(f: dict) -> Verdict:
    passed = (f["readyz_503_after_s"] is not None and f["readyz_503_after_s"] <= 1.0
              and f["new_call_close_code"] == 1013 and f["live_calls_kept_through_hold"]
              and f["exit_status"] == 0 and f["stored_calls"] == f["calls"] and f["stored_without_end"] == 0)
    return Verdict("drain", f"SIGTERM, {f['calls']} live calls: /readyz 503 within 1 s, new calls refused, live "
                            "calls kept, exit 0, every call stored as ended",
                   f"503 after {f['readyz_503_after_s']} s, new call closed {f['new_call_close_code']}, live calls "
                   f"{'kept' if f['live_calls_kept_through_hold'] else 'CUT'}, exit {f['exit_status']} after "
                   f"{f['stopped_after_s']} s, {f['stored_without_end']} of {f['stored_calls']} stored unended "
                   f"({', '.join(f['end_reasons'])})", passed, f)
