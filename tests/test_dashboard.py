"""The dashboard's server side: TTFS statistics (pure), the turn event hub, the store's
turn queries, and the HTTP API and event stream on a real server (with fake engines:
nothing here loads a model)."""

from __future__ import annotations

import asyncio
import json
import socket
import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace

import httpx
import pytest

from agent.app import create_app
from agent.config import CadenceConfig, StoreConfig
from agent.errors import CapacityError
from agent.events import MAX_SUBSCRIBERS, TurnEvents
from agent.serve import CadenceServer, cadence_server
from agent.store import SCHEMA_VERSION, CallStore, turn_summary
from agent.ttfs_stats import TtfsSample, default_bucket_s, latency_stats, percentile, summarize
from pipelines.turn_timeline import Turn
from pipelines.voice import Engines
from tests.fakes import ScriptedASR, ScriptedLLM, ToneTTS


# ---------- percentiles and buckets ----------

def test_percentiles_interpolate_between_the_nearest_ranks_as_the_bench_does():
    from latency_bench import stats as bench_stats

    assert bench_stats.percentile is percentile  # one definition for the dashboard and the bench
    values = [float(v) for v in range(1, 101)]
    assert [percentile(values, q) for q in (50, 95, 99, 100)] == pytest.approx([50.5, 95.05, 99.01, 100.0])
    assert [percentile([100.0, 200.0], q) for q in (50, 95, 99)] == pytest.approx([150.0, 195.0, 199.0])
    assert percentile([7.0], 99) == 7.0
    assert latency_stats([300.0, 100.0, 200.0]) == {"count": 3, "p50": 200.0, "p95": 290.0, "p99": 298.0}
    assert latency_stats([]) == {"count": 0, "p50": None, "p95": None, "p99": None}
    assert percentile([], 50) is None
    with pytest.raises(ValueError, match="in \\[0, 100\\]"):
        percentile([1.0], 101)


def test_summary_buckets_are_aligned_listed_when_empty_and_bounded_by_the_window():
    samples = [
        TtfsSample(at=99.0, ttfs_ms=5000, agent="a", transport="webrtc"),   # before the window
        TtfsSample(at=100.0, ttfs_ms=800, agent="a", transport="webrtc"),   # on its start: in
        TtfsSample(at=119.0, ttfs_ms=900, agent="a", transport="twilio"),
        TtfsSample(at=121.0, ttfs_ms=1000, agent="b", transport="twilio"),
        TtfsSample(at=200.0, ttfs_ms=1500, agent="a", transport="webrtc"),  # on its end: in
        TtfsSample(at=201.0, ttfs_ms=9000, agent="a", transport="webrtc"),  # after it
    ]
    result = summarize(samples, start=100.0, end=200.0, bucket_s=30.0)
    assert [b["start"] for b in result["buckets"]] == [90.0, 120.0, 150.0, 180.0]
    assert [b["count"] for b in result["buckets"]] == [2, 1, 0, 1]
    assert result["buckets"][2] == {"start": 150.0, "count": 0, "p50": None, "p95": None, "p99": None}
    assert result["buckets"][0]["p50"] == 850.0 and result["buckets"][0]["p99"] == 899.0
    assert result["overall"] == {"count": 4, "p50": 950.0, "p95": 1425.0, "p99": 1485.0}
    assert [(g["agent"], g["transport"], g["count"]) for g in result["groups"]] == [
        ("a", "twilio", 1), ("a", "webrtc", 2), ("b", "twilio", 1)]


def test_a_filter_narrows_the_series_but_every_group_stays_listed():
    samples = [TtfsSample(10.0, 700, "a", "webrtc"), TtfsSample(20.0, 1100, "a", "twilio"),
               TtfsSample(30.0, 1300, "b", "twilio")]
    result = summarize(samples, start=0.0, end=59.0, bucket_s=60.0, transport="twilio")
    assert result["overall"] == {"count": 2, "p50": 1200.0, "p95": 1290.0, "p99": 1298.0}
    assert len(result["groups"]) == 3
    only_b = summarize(samples, start=0.0, end=59.0, bucket_s=60.0, agent="b", transport="twilio")
    assert only_b["overall"]["count"] == 1 and only_b["buckets"][0]["p50"] == 1300.0
    nobody = summarize(samples, start=0.0, end=59.0, bucket_s=60.0, agent="c")
    assert nobody["overall"]["count"] == 0 and len(nobody["groups"]) == 3


def test_default_bucket_widths_give_a_readable_number_of_points():
    assert [default_bucket_s(w) for w in (60, 900, 3600, 21600, 86400, 604800)] == [10, 15, 60, 600, 1800, 10800]
    with pytest.raises(ValueError):
        summarize([], start=0.0, end=10.0, bucket_s=0)


# ---------- the event hub ----------

async def test_a_slow_subscriber_loses_its_oldest_events_and_nobody_else_is_affected():
    drops: list[int] = []
    hub = TurnEvents(queue_size=3, on_drop=lambda: drops.append(1))
    slow, fast = hub.subscribe(), hub.subscribe()
    got_fast = []
    for n in range(5):
        hub.publish({"n": n})
        got_fast.append(await fast.next(0.1))
    assert [e["n"] for e in got_fast] == [0, 1, 2, 3, 4] and fast.dropped == 0
    assert slow.backlog == 3 and hub.max_backlog == 3
    assert [(await slow.next(0.1))["n"] for _ in range(3)] == [2, 3, 4]
    assert slow.dropped == 2 and len(drops) == 2
    assert await slow.next(0.01) is None  # nothing more: a timeout, not an error


async def test_subscribers_are_capped_with_a_clear_error_and_a_closed_one_frees_its_slot():
    hub = TurnEvents(max_subscribers=2)
    first = hub.subscribe()
    hub.subscribe()
    with pytest.raises(CapacityError, match="2 dashboard streams are already open"):
        hub.subscribe()
    first.close()
    first.close()  # idempotent
    assert hub.subscriber_count == 1
    hub.subscribe()
    assert hub.subscriber_count == 2


async def test_closing_the_hub_ends_every_subscription_after_what_was_queued():
    hub = TurnEvents()
    subscription = hub.subscribe()
    hub.publish({"n": 1})
    hub.close()
    hub.publish({"n": 2})  # after close: ignored
    assert (await subscription.next(0.1)) == {"n": 1}
    with pytest.raises(EOFError):
        await subscription.next(0.1)
    with pytest.raises(CapacityError, match="shutting down"):
        hub.subscribe()


# ---------- the store ----------

async def stored_turns(store: CallStore, now: float) -> None:
    """Three calls: two webrtc (agents a and b), one twilio; the twilio turn never reached the caller."""
    for call_id, agent, transport in (("c1", "a", "webrtc"), ("c2", "b", "webrtc"), ("c3", "a", "twilio")):
        await store.call_started(call_id, agent, transport, now - 100)
    await store.save_turn("c1", Turn(0, end_of_speech_at=now - 90, stage_at={"asr_final": now - 89.5,
                                                                           "first_audio_sent": now - 89.0}))
    await store.save_turn("c1", Turn(1, end_of_speech_at=now - 50, stage_at={"first_audio_sent": now - 49.2}))
    await store.save_turn("c2", Turn(0, end_of_speech_at=now - 70, stage_at={"first_audio_sent": now - 68.8}))
    await store.save_turn("c3", Turn(0, end_of_speech_at=now - 60, stage_at={"asr_final": now - 59.4},
                                     interrupted=True))


async def test_recent_turns_join_their_call_and_filter_by_agent_transport_and_time(tmp_path):
    store = CallStore(str(tmp_path / "calls.sqlite3"))
    await store.open()
    now = 1_000_000.0
    await stored_turns(store, now)

    turns = await store.recent_turns(limit=10)
    assert [(t["call_id"], t["index"]) for t in turns] == [("c1", 1), ("c3", 0), ("c2", 0), ("c1", 0)]
    assert turns[1] == {"call_id": "c3", "agent": "a", "transport": "twilio", "index": 0,
                        "end_of_speech_at": now - 60, "interrupted": True, "stage_ms": {"asr_final": 600.0},
                        "ttfs_ms": None}
    assert [t["call_id"] for t in await store.recent_turns(limit=10, agent="a", transport="webrtc")] == ["c1", "c1"]
    assert [t["call_id"] for t in await store.recent_turns(limit=10, transport="twilio")] == ["c3"]
    assert [(t["call_id"], t["index"]) for t in await store.recent_turns(limit=10, since=now - 60)] == [("c1", 1)]
    assert len(await store.recent_turns(limit=2)) == 2

    samples = await store.ttfs_samples(since=now - 80)
    assert samples == [(now - 50, pytest.approx(800.0), "a", "webrtc"), (now - 70, pytest.approx(1200.0), "b", "webrtc")]
    await store.close()


async def test_a_version_2_database_gains_the_turn_time_index(tmp_path):
    path = tmp_path / "v2.sqlite3"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE calls (id TEXT PRIMARY KEY, agent TEXT NOT NULL, transport TEXT NOT NULL, external_id TEXT,
                            started_at REAL NOT NULL, ended_at REAL, end_reason TEXT);
        CREATE TABLE turns (call_id TEXT NOT NULL, idx INTEGER NOT NULL, user_text TEXT NOT NULL,
                            reply_text TEXT NOT NULL, interrupted INTEGER NOT NULL, end_of_speech_at REAL,
                            stage_ms TEXT NOT NULL, ttfs_ms REAL, PRIMARY KEY (call_id, idx));
        PRAGMA user_version = 2;
    """)
    db.close()

    store = CallStore(str(path))
    await store.open()
    await store.close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
    assert db.execute("SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = 'turns_spoken'").fetchone()
    assert db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'agents'").fetchone()
    plan = " ".join(str(r) for r in db.execute(
        "EXPLAIN QUERY PLAN SELECT * FROM turns WHERE end_of_speech_at > 5 ORDER BY end_of_speech_at DESC"))
    assert "turns_spoken" in plan


# ---------- HTTP API and event stream on a real server ----------

@dataclass
class Served:
    http: httpx.AsyncClient
    app: object
    server: CadenceServer
    task: asyncio.Task


@asynccontextmanager
async def served(config: CadenceConfig) -> AsyncIterator[Served]:
    """The real app under uvicorn on this test's event loop, so a test can publish to it directly."""
    engines = Engines(ScriptedASR("hello"), ScriptedLLM(["Hi."]), ToneTTS())
    app = create_app(config, engines=engines, engines_loaded=True)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = cadence_server(app, config, log_level="warning", lifespan="on")
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        assert not task.done(), "server did not start"
        await asyncio.sleep(0.01)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{sock.getsockname()[1]}", timeout=10) as http:
            yield Served(http, app, server, task)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


@pytest.fixture
def fake_config(tmp_path) -> CadenceConfig:
    return replace(CadenceConfig(), store=StoreConfig(path=str(tmp_path / "calls.sqlite3")))


async def test_turns_and_summary_come_from_the_store_with_filters(fake_config):
    async with served(fake_config) as s:
        now = time.time()
        await stored_turns(s.app.state.store, now)

        turns = (await s.http.get("/api/turns", params={"agent": "a", "limit": "10"})).json()["turns"]
        assert [(t["call_id"], t["transport"]) for t in turns] == [("c1", "webrtc"), ("c3", "twilio"), ("c1", "webrtc")]
        assert [t["call_id"] for t in (await s.http.get("/api/turns?transport=twilio")).json()["turns"]] == ["c3"]
        assert len((await s.http.get("/api/turns?limit=1")).json()["turns"]) == 1

        summary = (await s.http.get("/api/dashboard/summary", params={"window_s": 600, "transport": "webrtc"})).json()
        assert summary["bucket_s"] == default_bucket_s(600) and summary["truncated"] is False
        assert summary["overall"] == {"count": 3, "p50": 1000.0, "p95": 1180.0, "p99": 1196.0}
        assert sum(b["count"] for b in summary["buckets"]) == 3
        assert [(g["agent"], g["transport"], g["count"]) for g in summary["groups"]] == [("a", "webrtc", 2),
                                                                                        ("b", "webrtc", 1)]
        narrow = (await s.http.get("/api/dashboard/summary", params={"window_s": 60, "bucket_s": 10})).json()
        assert narrow["overall"]["count"] == 1 and len(narrow["buckets"]) == 7
        page = await s.http.get("/dashboard")
        assert page.status_code == 200 and "latency dashboard" in page.text


@pytest.mark.parametrize("path, params, message", [
    ("/api/turns", {"limit": "abc"}, "limit must be an integer in 1..500, got 'abc'"),
    ("/api/turns", {"limit": "0"}, "limit must be an integer in 1..500"),
    ("/api/turns", {"limit": "501"}, "limit must be an integer in 1..500"),
    ("/api/turns", {"limit": "2.5"}, "limit must be an integer"),
    ("/api/turns", {"since": "-5"}, "since must be a number"),
    ("/api/turns", {"since": "nan"}, "since must be a number"),
    ("/api/turns", {"agent": "x" * 65}, "agent must be a name of at most 64"),
    ("/api/dashboard/summary", {"window_s": "10"}, "window_s must be a number in 60..604800"),
    ("/api/dashboard/summary", {"window_s": "3600", "bucket_s": "7200"}, "bucket_s must be a number in 1..3600"),
    ("/api/dashboard/summary", {"window_s": "604800", "bucket_s": "60"}, "gives 10080 buckets; at most 720"),
    ("/api/dashboard/summary", {"transport": "a\nb"}, "transport must be a name"),
])
async def test_bad_query_parameters_get_400_saying_what_is_allowed(fake_config, path, params, message):
    async with served(fake_config) as s:
        response = await s.http.get(path, params=params)
    assert response.status_code == 400
    assert message in response.json()["error"] and response.json()["retryable"] is False


async def read_events(lines: AsyncIterator[str], until: str, timeout_s: float = 5.0) -> list[tuple[str, dict]]:
    """Server-sent events as (name, data) up to and including the first named `until`."""
    events, name = [], None
    async with asyncio.timeout(timeout_s):
        async for line in lines:
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((name, json.loads(line.removeprefix("data: "))))
                if name == until:
                    return events
    raise AssertionError(f"stream ended before a {until!r} event: {events}")


@pytest.mark.slow
async def test_the_stream_sends_status_then_each_published_turn_and_frees_its_slot_on_disconnect(fake_config):
    async with served(fake_config) as s:
        hub: TurnEvents = s.app.state.events
        async with s.http.stream("GET", "/api/dashboard/stream") as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            lines = response.aiter_lines()
            assert await anext(lines) == "retry: 3000"
            [(_, status)] = await read_events(lines, "status")
            assert status["calls"] == [] and status["streams"] == 1 and status["dropped"] == 0
            assert [e["name"] for e in status["engines"]] == ["asr", "llm", "tts"]

            turn = Turn(0, end_of_speech_at=100.0, stage_at={"asr_final": 100.4, "first_audio_sent": 101.0})
            hub.publish(turn_summary("call-1", "default", "webrtc", turn))
            events = await read_events(lines, "turn")
            assert events[-1] == ("turn", {"call_id": "call-1", "agent": "default", "transport": "webrtc", "index": 0,
                                           "end_of_speech_at": 100.0, "interrupted": False,
                                           "stage_ms": {"asr_final": 400.0, "first_audio_sent": 1000.0},
                                           "ttfs_ms": 1000.0})
            # The status keeps coming about every second: it is also the stream's heartbeat.
            started = time.monotonic()
            await read_events(lines, "status")
            assert time.monotonic() - started < 2.0
        for _ in range(50):
            if hub.subscriber_count == 0:
                break
            await asyncio.sleep(0.05)
        assert hub.subscriber_count == 0, "a closed dashboard kept its stream slot"
        metrics = (await s.http.get("/metrics")).text
        assert "cadence_dashboard_streams 0.0" in metrics


async def test_streams_beyond_the_cap_get_503_and_shutdown_ends_the_open_ones(fake_config):
    async with served(fake_config) as s:
        async with asyncio.TaskGroup() as group:
            opened = asyncio.Event()
            finished: list[tuple[str, dict]] = []

            async def hold_stream() -> None:
                async with s.http.stream("GET", "/api/dashboard/stream") as response:
                    lines = response.aiter_lines()
                    await read_events(lines, "status")
                    if s.app.state.events.subscriber_count == MAX_SUBSCRIBERS:
                        opened.set()
                    finished.extend(await read_events(lines, "end", timeout_s=15))

            for _ in range(MAX_SUBSCRIBERS):
                group.create_task(hold_stream())
            await asyncio.wait_for(opened.wait(), 10)
            refused = await s.http.get("/api/dashboard/stream")
            assert refused.status_code == 503
            assert refused.json() == {"error": f"{MAX_SUBSCRIBERS} dashboard streams are already open (the limit); "
                                               "close one or retry later", "retryable": True}

            started = time.monotonic()
            s.server.should_exit = True  # as on SIGTERM: uvicorn would otherwise wait on the streams forever
            await asyncio.wait_for(s.task, 5)
        assert time.monotonic() - started < 3.0
        assert finished.count(("end", {"reason": "server shutting down"})) == MAX_SUBSCRIBERS
