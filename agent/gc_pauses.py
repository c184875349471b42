"""Python's cyclic garbage collector as the event loop feels it.

A collection holds the GIL for as long as it scans, and a full (generation 2) one scans every
object that has survived so far: the modules, the models' Python side, the web framework,
~140,000 objects once the default models are loaded, which took 50-57 ms per full collection
here (python -m latency_bench gc-pause). Full collections come by themselves during calls, as
calls make and drop frames, so every so often the event loop, and every caller's audio with
it, stood still for that long.

Nearly all of those objects live as long as the process. `freeze_startup_objects` moves them,
once the server is loaded, to the permanent generation, which collections never scan (what
CPython's gc.freeze is for); a full collection then scans only what calls made. What it costs:
an object alive at startup that later becomes cyclic garbage is never freed, and startup
leaves little of that (it runs a full collection first, so its own garbage goes first).

`GcPauseWatch` times every collection (gc.callbacks), for the metrics.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any


def freeze_startup_objects() -> int:
    """A full collection, then every surviving object moved out of the collector's scans.
    Returns how many objects are frozen. Blocking (one full collection): call it once, at the
    end of startup, before the first call."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class GcPauseWatch:
    """Tells `on_pause(generation, seconds)` of every collection once it ends. A collection
    runs in whichever thread allocated when the collector's threshold was crossed (a model
    thread too), so `on_pause` must be thread-safe (a Prometheus histogram is)."""

    def __init__(self, on_pause: Callable[[int, float], None], *, clock: Callable[[], float] = time.perf_counter) -> None:
        self._on_pause = on_pause
        self._clock = clock
        self._started_at: float | None = None

    def install(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        # A collection starts wherever an allocation crosses the threshold, in the last frames
        # of a deep recursion too (a stranger's deeply nested JSON being parsed): with no stack
        # left to time it, that sample is dropped. An error out of a gc callback would be
        # printed as an unraisable exception, and its collection left timed from the next start.
        try:
            if phase == "start":
                self._started_at = self._clock()
            elif self._started_at is not None:  # "stop"; collections never nest (the GIL is held)
                started_at, self._started_at = self._started_at, None
                self._on_pause(info["generation"], self._clock() - started_at)
        except RecursionError:
            self._started_at = None
