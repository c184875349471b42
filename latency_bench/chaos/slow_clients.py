"""Chaos scenario: slow clients (slowloris) against a running server.

Opens `idle` TCP connections that never send a byte and `trickle` connections that send an
HTTP request head one byte at a time and never finish it, then, while they are all open,
asks GET /healthz as a real client would. The server should close every slow connection
about `deadline_s` (server.request_header_timeout_seconds) after it opened, and answer the
real client at once. `run` returns the figures; `judge` judges them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from urllib.parse import urlsplit

import httpx

from latency_bench.chaos.verdict import Verdict

# A valid request head whose last header value never ends, so it is never complete.
TRICKLED_HEAD_START = b"GET /healthz HTTP/1.1\r\nHost: chaos-bench\r\nX-Slow: "
TRICKLED_FILLER = b"a"
# How long a real request may take while the slow clients are open.
HEALTHZ_TIMEOUT_S = 5.0


async def run(base_url: str, *, idle: int, trickle: int, deadline_s: float, slack_s: float = 2.0,
              trickle_interval_s: float = 0.1) -> dict:
    """Slow connections open against `base_url`; each is given `deadline_s + slack_s` to be
    closed by the server, after which it is counted as still open and closed by us."""
    parts = urlsplit(base_url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    wait_s = deadline_s + slack_s
    opened = await asyncio.gather(*(_open(host, port) for _ in range(idle + trickle)), return_exceptions=True)
    streams = [s for s in opened if not isinstance(s, BaseException)]
    failed = len(opened) - len(streams)
    # The first `idle` connections that opened stay silent; the rest trickle.
    n_idle = min(idle, len(streams))
    async with asyncio.TaskGroup() as group:
        silent = [group.create_task(_until_closed(*s, wait_s=wait_s, trickle_interval_s=None))
                  for s in streams[:n_idle]]
        trickling = [group.create_task(_until_closed(*s, wait_s=wait_s, trickle_interval_s=trickle_interval_s))
                     for s in streams[n_idle:]]
        healthz = await _healthz(base_url)
    return {"deadline_s": deadline_s, "failed_to_open": failed,
            "idle": _closures([t.result() for t in silent]),
            "trickle": _closures([t.result() for t in trickling]),
            "healthz": healthz}


async def _open(host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, float]:
    # Timed from before the connect: the server may accept (and start its deadline) well
    # before a busy client loop sees the connect complete, and a close then looked early.
    started = asyncio.get_running_loop().time()
    reader, writer = await asyncio.open_connection(host, port)
    return reader, writer, started


async def _until_closed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, opened_at: float, *,
                        wait_s: float, trickle_interval_s: float | None) -> float | None:
    """Seconds from opening until the server closed the connection; None if it was still
    open `wait_s` after opening. The connection is closed on our side either way."""
    loop = asyncio.get_running_loop()
    trickler = None
    if trickle_interval_s is not None:
        trickler = asyncio.create_task(trickle_head(writer, trickle_interval_s))
    try:
        async with asyncio.timeout_at(opened_at + wait_s):
            with contextlib.suppress(ConnectionError):
                while await reader.read(4096):  # whatever the server says before it closes
                    pass
        return loop.time() - opened_at
    except TimeoutError:
        return None
    finally:
        await stop_trickling(trickler)
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def stop_trickling(trickler: asyncio.Task | None) -> None:
    """Cancels a `trickle_head` task (None: nothing to stop) and waits for it to end."""
    if trickler is not None:
        trickler.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await trickler


async def trickle_head(writer: asyncio.StreamWriter, interval_s: float) -> None:
    """Sends the head a byte at a time until cancelled or the connection breaks."""
    for byte in TRICKLED_HEAD_START:
        writer.write(bytes([byte]))
        await writer.drain()
        await asyncio.sleep(interval_s)
    while not writer.is_closing():
        writer.write(TRICKLED_FILLER)
        await writer.drain()
        await asyncio.sleep(interval_s)


async def _healthz(base_url: str) -> dict:
    started = time.monotonic()
    try:
        async with httpx.AsyncClient(base_url=base_url, timeout=HEALTHZ_TIMEOUT_S) as http:
            status = (await http.get("/healthz")).status_code
    except httpx.HTTPError as exc:
        return {"ok": False, "status": None, "error": type(exc).__name__, "latency_s": time.monotonic() - started}
    return {"ok": status == 200, "status": status, "latency_s": time.monotonic() - started}


def _closures(seconds: list[float | None]) -> dict:
    closed = [s for s in seconds if s is not None]
    return {"opened": len(seconds), "closed": len(closed), "still_open": len(seconds) - len(closed),
            "min_close_s": min(closed, default=None), "max_close_s": max(closed, default=None)}


def judge(f: dict) -> Verdict:
    closes = [f["idle"]["max_close_s"], f["trickle"]["max_close_s"]]
    still_open = f["idle"]["still_open"] + f["trickle"]["still_open"]
    slowest = max((round(c, 2) for c in closes if c is not None), default=None)
    passed = still_open == 0 and f["failed_to_open"] == 0 and slowest is not None and slowest <= 10 \
        and f["healthz"]["ok"]
    return Verdict("slow-clients", "400 slow connections all closed within 10 s; a real request answered",
                   f"{still_open} left open, slowest closed after {slowest} s; /healthz "
                   f"{'answered in %.2f s' % f['healthz']['latency_s'] if f['healthz']['ok'] else 'failed'}",
                   passed, f)
