"""What a running server says about itself, read as an operator would (its /metrics and
/api/calls), and the one way the chaos scenarios wait on it.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from latency_bench.chaos.admission import calls_active

SETTLE_TIMEOUT_S = 30.0
IDLE_HOUSEKEEPING_S = 2.0  # the server's idle collection (agent/memory.py) has run by then


async def poll_until(condition: Callable[[], bool | Awaitable[bool]], timeout_s: float, *,
                     every_s: float = 0.05) -> bool:
    """Whether `condition` (a function, or a coroutine function) came true within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        met = condition()
        if inspect.isawaitable(met):
            met = await met
        if met:
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(every_s)


def metric_samples(exposition: str) -> dict[tuple[str, frozenset], float]:
    """Every sample in a Prometheus text exposition: (name, its labels) -> value."""
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(exposition) for sample in family.samples}


async def metric_value(http: httpx.AsyncClient, name: str, default: float = 0.0, **labels: str) -> float:
    """One sample of the server's /metrics (`default` while it has none)."""
    samples = metric_samples((await http.get("/metrics")).text)
    return samples.get((name, frozenset(labels.items())), default)


async def metric_by_labels(http: httpx.AsyncClient, name: str) -> dict[str, float]:
    """Every sample of `name` in the server's /metrics, keyed by its label values joined by "/"
    in label-name order (cadence_model_failures_total{kind="stalled",model="llm"} -> "stalled/llm")."""
    samples = metric_samples((await http.get("/metrics")).text)
    return {"/".join(value for _, value in sorted(labels)): v for (sample, labels), v in samples.items()
            if sample == name}


LOOP_LAG_PROBES = "cadence_event_loop_lag_probe_seconds"
LOOP_STALL_S = 0.1  # a server event-loop stall this long is an audible gap, and a late answer by itself
GC_PAUSES = "cadence_gc_pause_seconds"
FULL_COLLECTION = "2"  # the collector's oldest generation: a full collection


def _over(samples: dict[tuple[str, frozenset], float], histogram: str, seconds: float, **labels: str) -> float:
    """How many observations of `histogram` (with `labels`) in `samples` were over `seconds`,
    which must be one of its bucket bounds. 0 while it has none."""
    count = samples.get((f"{histogram}_count", frozenset(labels.items())))
    if count is None:
        return 0.0
    within = samples.get((f"{histogram}_bucket", frozenset({**labels, "le": str(seconds)}.items())))
    if within is None:
        raise ValueError(f"{seconds} s is not a bucket bound of {histogram}")
    return count - within


async def loop_probes_later_than(http: httpx.AsyncClient, seconds: float) -> float:
    """How many of the server's event-loop lag probes so far fired more than `seconds` late."""
    return _over(metric_samples((await http.get("/metrics")).text), LOOP_LAG_PROBES, seconds)


async def full_collections(http: httpx.AsyncClient, *, over_s: float = 0.05) -> tuple[float, float]:
    """The server's full garbage collections so far, and how many of them took over `over_s`
    (one read of its /metrics)."""
    samples = metric_samples((await http.get("/metrics")).text)
    total = samples.get((f"{GC_PAUSES}_count", frozenset({("generation", FULL_COLLECTION)})), 0.0)
    return total, _over(samples, GC_PAUSES, over_s, generation=FULL_COLLECTION)


async def process_figures(http: httpx.AsyncClient) -> dict[str, float]:
    """The server process's resident memory (MB), open files and OS threads."""
    samples = metric_samples((await http.get("/metrics")).text)

    def one(name: str) -> float:
        return samples[(name, frozenset())]

    return {"rss_mb": one("process_resident_memory_bytes") / 2**20, "open_fds": one("process_open_fds"),
            "threads": one("cadence_process_threads")}


async def settle(base_url: str) -> None:
    """Waits until no call is left and the server has tidied up after them."""
    if not await poll_until(lambda: no_calls_active(base_url), SETTLE_TIMEOUT_S, every_s=0.1):
        raise TimeoutError(f"calls still active {SETTLE_TIMEOUT_S:.0f} s later")
    await asyncio.sleep(IDLE_HOUSEKEEPING_S)


async def no_calls_active(base_url: str) -> bool:
    return await calls_active(base_url) == 0
