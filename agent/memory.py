"""Giving freed memory back to the operating system once no call is in progress.

Each call allocates and frees tens of MB (its VAD's ONNX session, audio buffers, pipecat's
frames and processors, many of them in reference cycles that only Python's cyclic collector
frees). Between the collector's infrequent full passes and glibc keeping freed memory in its
arenas for reuse, the server's resident memory climbs to a high-water mark and stays there:
measured, 240 short calls left it ~180 MB above what was in use, and a full collection plus
`malloc_trim` brought it back to within 2 MB of where it started. Under a container's memory
limit that retained memory is what gets a pod OOM-killed, and it hides real leaks from the
operator's graphs. A full collection stalls the event loop (tens of ms), so it runs only
when the server has had no call for `delay_s`.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable

from models.native_memory import trim_native_heap

log = logging.getLogger(__name__)

IDLE_DELAY_S = 0.5  # after the last call ends: long enough for its teardown to finish


def return_freed_memory() -> None:
    """A full collection, then freed heap back to the OS (where the C library can)."""
    gc.collect()
    trim_native_heap()


class IdleHousekeeping:
    """`when_idle()` once the last call has ended: `delay_s` later, if still no call is in
    progress, `housekeep` runs (on the event loop: nothing else is waiting on it then)."""

    def __init__(self, is_idle: Callable[[], bool], *, delay_s: float = IDLE_DELAY_S,
                 housekeep: Callable[[], None] = return_freed_memory) -> None:
        self._is_idle = is_idle
        self._delay_s = delay_s
        self._housekeep = housekeep
        self._pending: asyncio.TimerHandle | None = None
        self.runs = 0

    def when_idle(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a test's synchronous teardown): nothing to schedule on
            return
        if self._pending is not None:
            self._pending.cancel()
        self._pending = loop.call_later(self._delay_s, self._run)

    def _run(self) -> None:
        self._pending = None
        if self._is_idle():
            self._housekeep()
            self.runs += 1
