"""Python's garbage collector as the event loop feels it (agent/gc_pauses.py)."""

from __future__ import annotations

import gc
import inspect
import json
import subprocess
import sys

import httpx
import pytest

from agent.gc_pauses import GcPauseWatch
from latency_bench.chaos.server_figures import full_collections, metric_value
from tests.conftest import REPO_ROOT
from tests.reliability.test_drain_on_sigterm import server_process


class SteppingClock:
    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_every_collection_is_timed_by_its_generation_until_uninstalled():
    pauses: list[tuple[int, float]] = []
    watch = GcPauseWatch(lambda generation, seconds: pauses.append((generation, seconds)), clock=SteppingClock(0.25))
    watch.install()
    watch.install()  # twice is once
    try:
        gc.collect(1)
        gc.collect(2)
    finally:
        watch.uninstall()
    gc.collect()
    assert pauses == [(1, 0.25), (2, 0.25)]


def _collect_at_depth(frames_left: int) -> None:
    if frames_left <= 0:
        gc.collect()
        return
    _collect_at_depth(frames_left - 1)


@pytest.mark.slow
def test_a_collection_at_the_end_of_a_deep_recursion_is_no_error_out_of_the_collector(monkeypatch):
    """Found by make test: the malformed-frames fuzzer's deeply nested JSON made a collection in
    the last frames of the parser's recursion, and the callback's RecursionError came out of the
    collector as an unraisable exception."""
    unraisable: list[type] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda hook_args: unraisable.append(hook_args.exc_type))
    pauses: list[tuple[int, float]] = []
    # Several Python frames deep, as a Prometheus histogram's observe is.
    watch = GcPauseWatch(lambda generation, seconds: _record_deeply(pauses, (generation, seconds), 5))
    depth_here = len(inspect.stack(0))
    watch.install()
    try:
        for frames_short_of_the_limit in range(1, 40):
            try:
                _collect_at_depth(sys.getrecursionlimit() - depth_here - frames_short_of_the_limit)
            except RecursionError:
                pass
        timed_deep = len(pauses)
        gc.collect()
    finally:
        watch.uninstall()
    assert unraisable == []
    assert 0 < timed_deep < 39  # some collections had no stack left to be timed; the rest were
    assert len(pauses) == timed_deep + 1  # and the watch goes on timing


def _record_deeply(into: list, sample: tuple[int, float], frames: int) -> None:
    if frames:
        _record_deeply(into, sample, frames - 1)
    else:
        into.append(sample)


def test_a_frozen_server_scans_nothing_startup_made():
    """In a process of its own: freezing is for the life of the process."""
    script = ("import gc, time, json, weakref; from agent.gc_pauses import freeze_startup_objects\n"
              "gc.disable()\n"  # only the collections below
              "keep = [[i, [i]] for i in range(100000)]\n"  # long-lived containers, as loaded models leave
              "def full():\n    t = time.perf_counter(); gc.collect(); return time.perf_counter() - t\n"
              "before = min(full() for _ in range(3))\n"
              "class Node: pass\n"
              "node = Node(); node.me = node; cycle = weakref.ref(node); del node\n"  # startup's cyclic garbage
              "frozen = freeze_startup_objects()\n"
              "after = min(full() for _ in range(3))\n"
              "print(json.dumps([frozen, cycle() is None, before, after]))")
    run = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                         check=True)
    frozen, cycle_freed, before, after = json.loads(run.stdout)
    assert frozen > 200_000  # the lists kept
    assert cycle_freed  # collected before the freeze, not kept for good
    assert after < before / 5, (before, after)


@pytest.mark.slow
async def test_a_server_process_freezes_once_loaded_and_reports_its_collections(tmp_path):
    async with server_process(tmp_path, grace_s=1) as (_, port, _):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            frozen = await metric_value(http, "cadence_gc_frozen_objects")
            collections, _ = await full_collections(http)
    assert frozen > 50_000  # the server's modules and the app, at least
    assert collections >= 1  # the freeze's own full collection, timed like any other
