"""Chaos scenario: callers who vanish (a dropped mobile call, a crashed client), against a
running server.

Each cycle connects a phone socket to an agent with a greeting, sends `connected` and
`start`, and goes: half the cycles as soon as the call is admitted, half mid-reply (after
the greeting's first audio arrives); every other one of each half closes politely, the rest
drop the TCP connection with no close at all. After warm-up cycles, the server's own
figures (/metrics: resident memory, open files, OS threads) are read before and after the
measured cycles, once no call is left; each vanished call must end at once (never a zombie)
and the store must hold every call as ended. `run`
returns the figures; `judge` judges them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import httpx
import websockets

from latency_bench.chaos.admission import start_event, ws_url
from latency_bench.chaos.server_figures import SETTLE_TIMEOUT_S, no_calls_active, poll_until, process_figures, settle
from latency_bench.chaos.verdict import Verdict

AGENT = {"name": "chaos-greeter", "system_prompt": "You answer calls for a bakery.",
         "greeting": "Hello, this is the bakery. How can I help you today?"}
GREETING_TIMEOUT_S = 10.0


async def ensure_agent(http: httpx.AsyncClient) -> None:
    created = await http.post("/api/agents", json=AGENT)
    if created.status_code not in (201, 409):
        raise RuntimeError(f"could not create the greeting agent: {created.status_code} {created.text[:200]}")


async def one_cycle(base_url: str, n: int, *, mid_reply: bool, abrupt: bool) -> bool:
    """One caller who vanishes; True if the greeting's audio had begun when it did."""
    ws = await websockets.connect(f"{ws_url(base_url)}/ws/twilio", open_timeout=5)
    heard = False
    try:
        await ws.send(json.dumps({"event": "connected"}))
        start = json.loads(start_event(n))
        start["start"]["customParameters"] = {"agent": AGENT["name"]}
        await ws.send(json.dumps(start))
        if mid_reply:
            async with asyncio.timeout(GREETING_TIMEOUT_S):
                while not heard:
                    heard = json.loads(await ws.recv()).get("event") == "media"
    finally:
        if abrupt:
            ws.transport.abort()  # no close frame, no FIN handshake: the client is simply gone
        else:
            with contextlib.suppress(websockets.ConnectionClosed):
                await ws.close()
    return heard


async def until_ended(base_url: str) -> float:
    """Seconds until the server has ended the vanished caller's call (no call in progress)."""
    started = time.monotonic()
    if not await poll_until(lambda: no_calls_active(base_url), SETTLE_TIMEOUT_S, every_s=0.01):
        raise TimeoutError(f"a vanished caller's call still active {SETTLE_TIMEOUT_S:.0f} s later")
    return time.monotonic() - started


async def run(base_url: str, *, cycles: int, warmup: int = 20) -> dict:
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as http:
        await ensure_agent(http)
        for n in range(warmup):
            await one_cycle(base_url, n, mid_reply=n % 2 == 0, abrupt=n % 4 < 2)
            await until_ended(base_url)
        await settle(base_url)
        calls_before = len((await http.get("/api/calls", params={"limit": 500})).json()["calls"])
        before = await process_figures(http)
        mid_reply_heard, ended_after = 0, []
        for n in range(cycles):
            mid_reply_heard += await one_cycle(base_url, warmup + n, mid_reply=n % 2 == 0, abrupt=n % 4 < 2)
            ended_after.append(await until_ended(base_url))
        await settle(base_url)
        after = await process_figures(http)
        stored = await stored_calls(http, expected=calls_before + cycles)
    ended_after.sort()
    return {"cycles": cycles, "warmup": warmup, "mid_reply_cycles_that_heard_audio": mid_reply_heard,
            "call_ended_after_vanishing_ms": {"p50": round(ended_after[len(ended_after) // 2] * 1000, 1),
                                              "max": round(ended_after[-1] * 1000, 1)},
            "before": before, "after": after,
            "rss_growth_mb": round(after["rss_mb"] - before["rss_mb"], 1),
            "open_fds_delta": after["open_fds"] - before["open_fds"],
            "threads_delta": after["threads"] - before["threads"],
            "stored_calls": len(stored), "stored_live_or_unended": sum(1 for c in stored if c["live"] or
                                                                       c["ended_at"] is None),
            "end_reasons": sorted({c["end_reason"] or "" for c in stored})}


async def stored_calls(http: httpx.AsyncClient, *, expected: int) -> list[dict]:
    calls: list[dict] = []
    while len(calls) < expected:
        page = (await http.get("/api/calls", params={"limit": 500, "offset": len(calls)})).json()["calls"]
        if not page:
            break
        calls += page
    return calls


def judge(f: dict) -> Verdict:
    passed = (f["rss_growth_mb"] <= 20 and f["open_fds_delta"] <= 0 and f["threads_delta"] <= 0
              and f["stored_live_or_unended"] == 0 and f["stored_calls"] >= f["warmup"] + f["cycles"]
              and f["call_ended_after_vanishing_ms"]["max"] <= 5000)
    return Verdict("vanishing", f"{f['cycles']} connect/start/vanish cycles (half mid-reply, half dropping TCP): "
                                "memory +20 MB at most, open files and threads back to baseline, each call "
                                "ended within 5 s and stored as ended",
                   f"memory {f['rss_growth_mb']:+.1f} MB, open files {f['open_fds_delta']:+.0f}, threads "
                   f"{f['threads_delta']:+.0f}, calls ended {f['call_ended_after_vanishing_ms']['p50']} ms after "
                   f"(max {f['call_ended_after_vanishing_ms']['max']}), "
                   f"{f['stored_live_or_unended']} of {f['stored_calls']} unended; "
                   f"{f['mid_reply_cycles_that_heard_audio']} left mid-reply", passed, f)
