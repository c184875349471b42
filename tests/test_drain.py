"""Draining before a stop: no new calls, the live ones go on, and `cadence drain` waits for them."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import websockets

from agent import drain_cli
from tests.test_bad_input import closed_with, open_call

pytestmark = pytest.mark.slow


async def test_a_draining_server_refuses_new_calls_and_keeps_the_live_one(server):
    live = await open_call(server.ws_url)
    async with httpx.AsyncClient(base_url=server.base_url) as http:
        for _ in range(100):  # the call is admitted once its start event is read
            if (await http.get("/api/drain")).json()["calls_active"] == 1:
                break
            await asyncio.sleep(0.02)
        drained = await http.post("/api/drain")
        assert drained.status_code == 200 and drained.json() == {"draining": True, "calls_active": 1}
        ready = await http.get("/readyz")
        assert ready.status_code == 503 and ready.json()["status"] == "draining"
        refused = await websockets.connect(f"{server.ws_url}/ws/twilio")
        code, reason = await closed_with(refused)
        assert code == 1013 and "draining" in reason
        await live.send(json.dumps({"event": "media", "media": {"payload": ""}}))  # still open
        assert live.close_code is None
        await live.send(json.dumps({"event": "stop"}))
        await closed_with(live)
        for _ in range(100):
            if (await http.get("/api/drain")).json()["calls_active"] == 0:
                break
            await asyncio.sleep(0.05)
        assert (await http.get("/api/drain")).json() == {"draining": True, "calls_active": 0}


def test_drain_command_waits_for_the_last_call_then_succeeds(monkeypatch):
    counts = iter([2, 1, 0])
    monkeypatch.setattr(drain_cli.httpx, "post", lambda url, timeout: httpx.Response(
        200, json={"draining": True, "calls_active": 3}))
    monkeypatch.setattr(drain_cli.httpx, "get", lambda url, timeout: httpx.Response(
        200, json={"draining": True, "calls_active": next(counts)}))
    slept = []
    assert drain_cli.drain("http://x", timeout_s=60, clock=lambda: 0.0, sleep=slept.append) == 0
    assert len(slept) == 3


def test_drain_command_gives_up_at_its_timeout(monkeypatch):
    monkeypatch.setattr(drain_cli.httpx, "post", lambda url, timeout: httpx.Response(
        200, json={"draining": True, "calls_active": 1}))
    monkeypatch.setattr(drain_cli.httpx, "get", lambda url, timeout: httpx.Response(
        200, json={"draining": True, "calls_active": 1}))
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    assert drain_cli.drain("http://x", timeout_s=10, clock=lambda: now[0], sleep=sleep) == 1
    assert now[0] >= 10
