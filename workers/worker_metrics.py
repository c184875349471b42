"""What a model worker shows on /metrics, in a registry of its own.

Each worker builds its own CollectorRegistry (never prometheus_client's global one), so two
workers in one test process, or an app rebuilt after a restart, never collide. Queue depth
and batch sizes are read from the engine when Prometheus scrapes, not pushed on every request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from models.base import Engine
from workers.batcher import BatchRecord

# Requests to a model worker take 10 ms (an embedding) to tens of seconds (a long synthesis).
REQUEST_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_POWERS_OF_TWO = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class WorkerMetrics:
    content_type = CONTENT_TYPE_LATEST  # the text format generate_latest writes

    def __init__(self, *, name: str, role: str, engine: Engine, in_flight: Callable[[], int],
                 batch_record: BatchRecord) -> None:
        self.registry = CollectorRegistry()
        self._labels = {"worker": name, "role": role}
        self._request_seconds = Histogram(
            "cadence_worker_request_seconds", "Time from admission to the last byte of the answer",
            ["worker", "role", "endpoint", "status"], buckets=REQUEST_SECONDS_BUCKETS, registry=self.registry)
        self._refused = Counter(
            "cadence_worker_refused_total", "Requests refused at once: worker full, engine queue full, or past deadline",
            ["worker", "role", "reason"], registry=self.registry)
        self.registry.register(_EngineCollector(name, role, engine, in_flight, batch_record))

    def observe_request(self, endpoint: str, status: int, seconds: float) -> None:
        self._request_seconds.labels(**self._labels, endpoint=endpoint, status=str(status)).observe(seconds)

    def refused(self, reason: str) -> None:
        self._refused.labels(**self._labels, reason=reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector(Collector):
    """Reads the engine's queue and batch record at scrape time."""

    def __init__(self, name: str, role: str, engine: Engine, in_flight: Callable[[], int],
                 batch_record: BatchRecord) -> None:
        self._label_values = [name, role]
        self._engine = engine
        self._in_flight = in_flight
        self._record = batch_record

    def collect(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily("cadence_worker_queue_depth", "Requests the engine holds: waiting plus running",
                                  labels=["worker", "role"])
        depth.add_metric(self._label_values, self._engine.queue_depth)
        yield depth
        admitted = GaugeMetricFamily("cadence_worker_in_flight", "Requests the HTTP server has admitted",
                                     labels=["worker", "role"])
        admitted.add_metric(self._label_values, self._in_flight())
        yield admitted
        yield self._batch_sizes()

    def _batch_sizes(self) -> Metric:
        counts = list(self._record.counts)
        bounds = sorted({b for b in _POWERS_OF_TWO if b < self._record.max_batch} | {self._record.max_batch})
        buckets = [(str(float(bound)), float(sum(counts[: bound + 1]))) for bound in bounds]
        buckets.append(("+Inf", float(sum(counts))))
        family = HistogramMetricFamily("cadence_worker_batch_size", "Requests per engine batch",
                                       labels=["worker", "role"])
        family.add_metric(self._label_values, buckets, sum_value=float(sum(n * c for n, c in enumerate(counts))))
        return family

    def describe(self) -> Iterator[Metric]:
        return iter(())  # values are read at scrape time; names are not reserved up front
