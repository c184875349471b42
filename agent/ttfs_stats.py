"""TTFS percentiles over time, per agent and transport, as plain functions (no I/O).

The dashboard's summary is computed here from stored turns: overall p50/p95/p99 (by
`percentile`, the one definition the bench uses too), the
same per time bucket (buckets aligned to multiples of their width, so a chart that is
refreshed keeps its buckets), and per (agent, transport) group.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

PERCENTILES = (50, 95, 99)
# Bucket widths a chart reads easily (seconds): 10 s ... 1 day.
NICE_BUCKETS_S = (10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
# About this many points make a readable line across a dashboard panel.
TARGET_BUCKETS = 60


@dataclass(frozen=True)
class TtfsSample:
    at: float  # the caller's end of speech, epoch seconds
    ttfs_ms: float
    agent: str
    transport: str


def percentile(values: Iterable[float | None], q: float) -> float | None:
    """The q-th percentile of `values` (any order; None entries are skipped), linearly
    interpolated between the two nearest ranks: numpy's default, and statistics.median's at
    q = 50. None when there are no values.

    Cadence's one percentile: the dashboard's TTFS and the bench's figures (latency_bench/
    stats.py imports it) are the same statistic, so a dashboard p95 and a bench p95 agree.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    ordered = sorted(v for v in values if v is not None)
    if not ordered:
        return None
    position = (len(ordered) - 1) * q / 100
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def latency_stats(values: Iterable[float]) -> dict[str, Any]:
    """{"count", "p50", "p95", "p99"}; the percentiles are None when there are no values."""
    present = list(values)
    stats: dict[str, Any] = {"count": len(present)}
    for q in PERCENTILES:
        value = percentile(present, q)
        stats[f"p{q}"] = None if value is None else round(value, 1)
    return stats


def bucket_start(at: float, bucket_s: float) -> float:
    return math.floor(at / bucket_s) * bucket_s


def default_bucket_s(window_s: float) -> int:
    """The smallest nice bucket width that splits `window_s` into at most TARGET_BUCKETS."""
    for width in NICE_BUCKETS_S:
        if window_s / width <= TARGET_BUCKETS:
            return width
    return NICE_BUCKETS_S[-1]


def summarize(samples: Iterable[TtfsSample], *, start: float, end: float, bucket_s: float,
              agent: str | None = None, transport: str | None = None) -> dict[str, Any]:
    """Stats for samples with `start <= at <= end`.

    `overall` and `buckets` cover the samples matching `agent` and `transport` (None: any);
    `groups` lists every (agent, transport) in the window whatever the filter, so the
    choices and the side-by-side comparison stay in view while one is charted. Every
    bucket from the one holding `start` to the one holding `end` is listed, empty ones
    with count 0, so a chart shows a gap where nobody called.
    """
    if bucket_s <= 0:
        raise ValueError("bucket_s must be > 0")
    if end < start:
        raise ValueError("end must not be before start")
    first = bucket_start(start, bucket_s)
    n_buckets = int((bucket_start(end, bucket_s) - first) / bucket_s + 0.5) + 1
    by_bucket: list[list[float]] = [[] for _ in range(n_buckets)]
    by_group: dict[tuple[str, str], list[float]] = defaultdict(list)
    everything: list[float] = []
    for sample in samples:
        if not start <= sample.at <= end:
            continue
        by_group[(sample.agent, sample.transport)].append(sample.ttfs_ms)
        if (agent is not None and sample.agent != agent) or (transport is not None and sample.transport != transport):
            continue
        index = min(int((sample.at - first) // bucket_s), n_buckets - 1)
        by_bucket[index].append(sample.ttfs_ms)
        everything.append(sample.ttfs_ms)
    return {
        "overall": latency_stats(everything),
        "buckets": [{"start": first + i * bucket_s, **latency_stats(values)} for i, values in enumerate(by_bucket)],
        "groups": [{"agent": agent, "transport": transport, **latency_stats(values)}
                   for (agent, transport), values in sorted(by_group.items())],
    }
