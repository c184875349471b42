"""The latency dashboard's routes: its page, stored turns, TTFS summaries and a live stream.

    GET /dashboard                  the page (frontend/dashboard.html)
    GET /api/turns                  recent turns across calls, newest first
    GET /api/dashboard/summary      TTFS p50/p95/p99 overall, per time bucket, per agent/transport
    GET /api/dashboard/stream       server-sent events: `turn` as each turn closes, `status` every second

Statistics are computed by `ttfs_stats` (pure); this module only parses queries, reads
the store and streams. Bad query parameters get 400 with what was wrong and what is allowed.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse

from agent.calls import CallManager
from agent.errors import BadQueryError, CapacityError
from agent.events import Subscription, TurnEvents
from agent.store import MAX_LIST_LIMIT, MAX_SUMMARY_TURNS, CallStore
from agent.ttfs_stats import TtfsSample, default_bucket_s, summarize
from pipelines.voice import Engines

DEFAULT_TURNS_LIMIT = 100
MIN_WINDOW_S = 60.0
MAX_WINDOW_S = 7 * 86_400.0  # a week: beyond it the store holds more turns than a summary reads
DEFAULT_WINDOW_S = 3_600.0
MAX_BUCKETS = 720  # more points than a dashboard panel has pixels to show them
MAX_FILTER_CHARS = 64  # agent names and transports are short identifiers
# The status event doubles as the stream's heartbeat: proxies see traffic, and a page that
# hears nothing for a few intervals knows its stream is dead and says so.
STATUS_INTERVAL_S = 1.0
# Tells EventSource how long to wait before reconnecting after the stream ends.
RECONNECT_MS = 3_000


def parse_number(name: str, raw: str | None, *, default: float, low: float, high: float,
                 integer: bool = False) -> float:
    """`raw` as a number in [low, high], or `default` when absent; BadQueryError otherwise."""
    kind = "an integer" if integer else "a number"
    if raw is None or raw == "":
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        raise BadQueryError(f"{name} must be {kind} in {low:g}..{high:g}, got {raw[:32]!r}") from None
    if not math.isfinite(value) or not low <= value <= high:
        raise BadQueryError(f"{name} must be {kind} in {low:g}..{high:g}, got {raw[:32]!r}")
    return value


def parse_filter(name: str, raw: str | None) -> str | None:
    """An agent or transport name to filter by; absent or empty means any."""
    if raw is None or raw == "":
        return None
    if len(raw) > MAX_FILTER_CHARS or not raw.isprintable():
        raise BadQueryError(f"{name} must be a name of at most {MAX_FILTER_CHARS} printable characters")
    return raw


def summary_window(window_raw: str | None, bucket_raw: str | None) -> tuple[float, float]:
    window_s = parse_number("window_s", window_raw, default=DEFAULT_WINDOW_S, low=MIN_WINDOW_S, high=MAX_WINDOW_S)
    bucket_s = parse_number("bucket_s", bucket_raw, default=default_bucket_s(window_s), low=1.0, high=window_s)
    if window_s / bucket_s > MAX_BUCKETS:
        raise BadQueryError(f"window_s / bucket_s gives {window_s / bucket_s:.0f} buckets; at most {MAX_BUCKETS}: "
                            "use a wider bucket_s")
    return window_s, bucket_s


def sse(event: str, data: Any) -> str:
    """One server-sent event. JSON without indentation holds no newline, so one data line suffices."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


class LiveTurns:
    """What /api/dashboard/stream sends one subscriber: each turn as it closes, and a status
    (calls, engine queues, streams) every `status_interval_s`, which is also the heartbeat."""

    def __init__(self, *, manager: CallManager, events: TurnEvents, engines: Engines, clock: Callable[[], float],
                 status_interval_s: float) -> None:
        self._manager, self._events, self._engines = manager, events, engines
        self._clock = clock
        self._status_interval_s = status_interval_s

    def status(self, subscription: Subscription) -> dict[str, Any]:
        engines = self._engines
        return {
            "at": self._clock(),
            "calls": self._manager.in_progress(),
            # batch_size: the last batch an engine ran, for engines that batch (none of the embedded ones do).
            "engines": [{"name": name, "queue_depth": getattr(engine, "queue_depth", None),
                         "batch_size": getattr(engine, "batch_size", None)}
                        for name, engine in (("asr", engines.asr), ("llm", engines.llm), ("tts", engines.tts))],
            "streams": self._events.subscriber_count,
            "dropped": subscription.dropped,
        }

    async def stream(self, subscription: Subscription) -> AsyncIterator[str]:
        # Ends when the hub closes (server shutdown). A client that goes away cancels the
        # response, which frees the subscriber slot (EventStreamResponse).
        loop = asyncio.get_running_loop()
        yield f"retry: {RECONNECT_MS}\n\n"
        yield sse("status", self.status(subscription))
        next_status = loop.time() + self._status_interval_s
        while True:
            try:
                event = await subscription.next(max(0.0, next_status - loop.time()))
            except EOFError:
                yield sse("end", {"reason": "server shutting down"})
                return
            if event is not None:
                yield sse("turn", event)
            if loop.time() >= next_status:
                yield sse("status", self.status(subscription))
                next_status = loop.time() + self._status_interval_s


def dashboard_router(*, store: CallStore, manager: CallManager, events: TurnEvents, engines: Engines,
                     page: Path, clock: Callable[[], float] = time.time,
                     status_interval_s: float = STATUS_INTERVAL_S) -> APIRouter:
    router = APIRouter()
    live = LiveTurns(manager=manager, events=events, engines=engines, clock=clock, status_interval_s=status_interval_s)

    @router.get("/dashboard")
    async def dashboard_page() -> FileResponse:
        return FileResponse(page)

    @router.get("/api/turns")
    async def recent_turns(since: str | None = None, limit: str | None = None, agent: str | None = None,
                           transport: str | None = None) -> Response:
        try:
            since_at = parse_number("since", since, default=-1.0, low=0.0, high=1e12)
            count = int(parse_number("limit", limit, default=DEFAULT_TURNS_LIMIT, low=1, high=MAX_LIST_LIMIT,
                                     integer=True))
            agent, transport = parse_filter("agent", agent), parse_filter("transport", transport)
        except BadQueryError as exc:
            return _error(400, str(exc))
        turns = await store.recent_turns(limit=count, since=None if since_at < 0 else since_at, agent=agent,
                                         transport=transport)
        return JSONResponse({"turns": turns})

    @router.get("/api/dashboard/summary")
    async def ttfs_summary(window_s: str | None = None, bucket_s: str | None = None, agent: str | None = None,
                           transport: str | None = None) -> Response:
        try:
            window, bucket = summary_window(window_s, bucket_s)
            agent, transport = parse_filter("agent", agent), parse_filter("transport", transport)
        except BadQueryError as exc:
            return _error(400, str(exc))
        end = clock()
        rows = await store.ttfs_samples(since=end - window)
        samples = [TtfsSample(*row) for row in rows]
        # Sorting tens of thousands of values is milliseconds of CPU: off the event loop.
        result = await asyncio.to_thread(summarize, samples, start=end - window, end=end, bucket_s=bucket,
                                         agent=agent, transport=transport)
        return JSONResponse({"window_s": window, "bucket_s": bucket, "start": end - window, "end": end,
                             "agent": agent, "transport": transport,
                             "truncated": len(rows) >= MAX_SUMMARY_TURNS, **result})

    @router.get("/api/dashboard/stream")
    async def live_stream() -> Response:
        try:
            subscription = events.subscribe()
        except CapacityError as exc:
            return _error(503, str(exc), retryable=True)
        return EventStreamResponse(subscription, live.stream(subscription))

    return router


class EventStreamResponse(StreamingResponse):
    """A text/event-stream response that frees its subscription however it ends: finished,
    cancelled by a client that left, or never started because the client left at once."""

    def __init__(self, subscription: Subscription, content: AsyncIterator[str]) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._subscription = subscription

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._subscription.close()


def _error(status: int, message: str, *, retryable: bool = False) -> JSONResponse:
    return JSONResponse({"error": message, "retryable": retryable}, status_code=status)
