"""The bench's reader of a server's own figures, and its one wait."""

from __future__ import annotations

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

import pytest

from agent.metrics import CadenceMetrics
from latency_bench.chaos.server_figures import (full_collections, loop_probes_later_than, metric_by_labels,
                                                metric_samples, metric_value, poll_until)


def exposition() -> str:
    registry = CollectorRegistry()
    audio = Counter("cadence_caller_audio_seconds", "caller audio", ["transport"], registry=registry)
    audio.labels("webrtc").inc(12.5)
    audio.labels("twilio").inc(3)
    Gauge("process_open_fds", "open files", registry=registry).set(42)
    return generate_latest(registry).decode()


def test_samples_are_read_by_name_and_labels():
    samples = metric_samples(exposition())
    assert samples[("cadence_caller_audio_seconds_total", frozenset({("transport", "webrtc")}))] == 12.5
    assert samples[("cadence_caller_audio_seconds_total", frozenset({("transport", "twilio")}))] == 3
    assert samples[("process_open_fds", frozenset())] == 42


async def test_a_metric_is_read_from_the_servers_metrics_route():
    text = exposition()
    transport = httpx.MockTransport(lambda request: httpx.Response(200, text=text))
    async with httpx.AsyncClient(transport=transport, base_url="http://server") as http:
        assert await metric_value(http, "cadence_caller_audio_seconds_total", transport="webrtc") == 12.5
        assert await metric_value(http, "cadence_caller_audio_seconds_total", transport="phone") == 0.0
        assert await metric_value(http, "not_there", default=-1.0) == -1.0


async def test_a_metrics_samples_are_keyed_by_their_label_values():
    metrics = CadenceMetrics()
    metrics.model_failures.labels("llm", "stalled").inc(2)
    metrics.model_failures.labels("asr", "error").inc()
    metrics.redactions.labels("chat").inc(3)
    text = generate_latest(metrics.registry).decode()
    transport = httpx.MockTransport(lambda request: httpx.Response(200, text=text))
    async with httpx.AsyncClient(transport=transport, base_url="http://server") as http:
        assert await metric_by_labels(http, "cadence_model_failures_total") == {"stalled/llm": 2, "error/asr": 1}
        assert await metric_by_labels(http, "cadence_redactions_total") == {"chat": 3}
        assert await metric_by_labels(http, "cadence_not_a_metric") == {}


async def test_loop_stalls_are_counted_from_the_servers_own_lag_histogram():
    metrics = CadenceMetrics()
    for lag in (0.001, 0.004, 0.06, 0.2, 1.5):
        metrics.event_loop_lag_probes.observe(lag)
    text = generate_latest(metrics.registry).decode()
    transport = httpx.MockTransport(lambda request: httpx.Response(200, text=text))
    async with httpx.AsyncClient(transport=transport, base_url="http://server") as http:
        assert await loop_probes_later_than(http, 0.1) == 2
        assert await loop_probes_later_than(http, 0.05) == 3
        with pytest.raises(ValueError, match="not a bucket bound"):
            await loop_probes_later_than(http, 0.07)


async def test_full_collections_are_counted_from_the_servers_gc_pause_histogram():
    metrics = CadenceMetrics()
    text = generate_latest(metrics.registry).decode()
    transport = httpx.MockTransport(lambda request: httpx.Response(200, text=text))
    async with httpx.AsyncClient(transport=transport, base_url="http://server") as http:
        assert await full_collections(http) == (0, 0)  # none yet: no samples at all
    for generation, pause in ((0, 0.001), (2, 0.004), (2, 0.057), (2, 0.2), (1, 0.3)):
        metrics.gc_pause_seconds.labels(str(generation)).observe(pause)
    text = generate_latest(metrics.registry).decode()
    transport = httpx.MockTransport(lambda request: httpx.Response(200, text=text))
    async with httpx.AsyncClient(transport=transport, base_url="http://server") as http:
        assert await full_collections(http) == (3, 2)
        assert await full_collections(http, over_s=0.1) == (3, 1)


async def test_poll_until_takes_plain_and_coroutine_conditions():
    checks = []

    async def third_time() -> bool:
        checks.append(1)
        return len(checks) >= 3

    assert await poll_until(third_time, 5.0, every_s=0) is True
    assert len(checks) == 3
    assert await poll_until(lambda: True, 0.0) is True
    assert await poll_until(lambda: False, 0.0, every_s=0) is False  # checked once more at the deadline
