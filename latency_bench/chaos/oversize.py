"""Chaos scenario: oversize messages and permessage-deflate bombs, against a running server.

Each attempt opens /ws/twilio or /v1/realtime with compression negotiated and sends one
message over server.max_ws_message_bytes: just over it, or megabytes of one repeated byte
that deflate to a few KB on the wire (a bomb). The server must close with 1009 at once, and
its memory must not follow the inflated size. `run` returns the figures; `judge` judges them.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import websockets

from latency_bench.chaos.admission import ws_url
from latency_bench.chaos.server_figures import process_figures, settle
from latency_bench.chaos.verdict import Verdict

CLOSE_WAIT_S = 5.0


def inflating_media_event(size: int) -> str:
    """A Twilio media event of `size` characters that deflates to almost nothing."""
    head, tail = '{"event": "media", "media": {"payload": "', '"}}'
    return head + "A" * (size - len(head) - len(tail)) + tail


async def one_attempt(base_url: str, path: str, size: int) -> tuple[int | None, float]:
    ws = await websockets.connect(f"{ws_url(base_url)}{path}", open_timeout=5, compression="deflate",
                                  max_size=None)
    if path == "/ws/twilio":
        await ws.send(json.dumps({"event": "connected"}))
    message = inflating_media_event(size)
    sent = time.monotonic()
    try:
        await ws.send(message)  # deflating 64 MB takes this client ~0.3 s: the clock restarts after it
        sent = time.monotonic()
        async with asyncio.timeout(CLOSE_WAIT_S):
            async for _ in ws:
                pass
    except (websockets.ConnectionClosed, TimeoutError):
        pass
    closed_after = time.monotonic() - sent
    await ws.close()
    return ws.close_code, closed_after


async def run(base_url: str, *, limit_bytes: int, attempts: int, bomb_bytes: int) -> dict:
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as http:
        await settle(base_url)
        before = await process_figures(http)
        outcomes = []
        for n in range(attempts):
            path = ("/ws/twilio", "/v1/realtime")[n % 2]
            size = (limit_bytes + 1, bomb_bytes)[(n // 2) % 2]
            outcomes.append(await one_attempt(base_url, path, size))
        await settle(base_url)  # a /v1/realtime session is a call: measured once its memory is back
        after = await process_figures(http)
    close_ms = sorted(seconds * 1000 for _, seconds in outcomes)
    return {"attempts": attempts, "limit_bytes": limit_bytes, "bomb_bytes": bomb_bytes,
            "close_codes": sorted({code for code, _ in outcomes if code is not None}),
            "closed_1009": sum(1 for code, _ in outcomes if code == 1009),
            "close_ms": {"p50": round(close_ms[len(close_ms) // 2], 1), "max": round(close_ms[-1], 1)},
            "rss_growth_mb": round(after["rss_mb"] - before["rss_mb"], 1)}


def judge(f: dict) -> Verdict:
    # Memory: a bomb is inflated up to the limit at most, so the process holds a few limits.
    passed = f["closed_1009"] == f["attempts"] and f["close_ms"]["max"] <= 100 and f["rss_growth_mb"] <= 20
    return Verdict("oversize", f"{f['attempts']} messages over the {f['limit_bytes']} B limit, half of them "
                               f"{f['bomb_bytes'] // 2**20} MB deflate bombs: all closed 1009 within 100 ms, "
                               "memory +20 MB at most",
                   f"{f['closed_1009']} closed 1009 ({f['close_codes']}), p50 {f['close_ms']['p50']} ms, max "
                   f"{f['close_ms']['max']} ms; memory {f['rss_growth_mb']:+.1f} MB", passed, f)
