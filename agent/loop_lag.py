"""How late the event loop runs: a stalled loop is a gap in every caller's audio.

A probe task sleeps `interval_s` over and over; each wake-up is late by however long the
loop was busy elsewhere (a blocking call, a burst of CPU work, the GIL held by a model
thread). That lateness is the lag. `LagWindow` keeps the figures and does no I/O, so it is
tested with a fake clock; `LoopLagMonitor` is the thin asyncio task around it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoopLagOptions:
    # How often the probe wakes. Lag shorter than timer granularity is noise; a stall longer
    # than this shows in full (a 0.3 s stall is lag >= 0.3 - interval_s on the next wake-up).
    interval_s: float = 0.25
    # What "recently" means for `max_recent_s`: a stall stays visible this long, so an operator
    # or a scrape that comes after it still sees it.
    window_s: float = 60.0
    # Lag at or above this marks /api/health degraded. Outbound audio goes in 20 ms frames and
    # clients buffer ~100 ms; a loop that stalls this long leaves an audible gap.
    degraded_at_s: float = 0.1
    # stop() waits this long for the probe to unwind after it is cancelled.
    stop_timeout_s: float = 1.0

    def __post_init__(self) -> None:
        if not (self.interval_s > 0 and self.window_s >= self.interval_s and self.degraded_at_s > 0
                and self.stop_timeout_s > 0):
            raise ValueError("loop lag options: interval_s, degraded_at_s and stop_timeout_s must be > 0, "
                             "window_s >= interval_s")


class LagWindow:
    """Lag samples over a sliding window of `window_s`: the latest, and the largest recent one."""

    def __init__(self, window_s: float, interval_s: float) -> None:
        self._window_s = window_s
        # One sample per wake-up at most, and wake-ups are >= interval_s apart: the bound
        # is never reached in practice, it only guarantees the memory.
        self._samples: deque[tuple[float, float]] = deque(maxlen=math.ceil(window_s / interval_s) + 1)
        self.latest_s: float | None = None  # None until the first wake-up
        self.samples_seen = 0

    def woke(self, due_at: float, woke_at: float) -> float:
        """Records a wake-up due at `due_at` that came at `woke_at`; returns its lag. Early
        wake-ups (timers fire up to the clock's resolution early) count as no lag."""
        lag = max(0.0, woke_at - due_at)
        self._samples.append((woke_at, lag))
        self._forget_before(woke_at - self._window_s)
        self.latest_s = lag
        self.samples_seen += 1
        return lag

    def max_recent_s(self, now: float) -> float | None:
        """The largest lag of the last `window_s` before `now`; None if there was no wake-up in it."""
        self._forget_before(now - self._window_s)
        return max((lag for _, lag in self._samples), default=None)

    def _forget_before(self, cutoff: float) -> None:
        while self._samples and self._samples[0][0] < cutoff:
            self._samples.popleft()


class LoopLagMonitor:
    """Owns the probe task: `start()` on the loop to watch, `await stop()` before it closes.
    `on_sample` hears every lag measured (the metrics' histogram)."""

    def __init__(self, options: LoopLagOptions = LoopLagOptions(), *, clock: Callable[[], float] = time.monotonic,
                 on_sample: Callable[[float], None] = lambda lag_s: None) -> None:
        self.options = options
        self._clock = clock
        self._on_sample = on_sample
        self._window = LagWindow(options.window_s, options.interval_s)
        self._task: asyncio.Task | None = None

    @property
    def latest_s(self) -> float | None:
        return self._window.latest_s

    def max_recent_s(self) -> float | None:
        return self._window.max_recent_s(self._clock())

    @property
    def lagging(self) -> bool:
        """The loop lagged past the degraded threshold within the window."""
        worst = self.max_recent_s()
        return worst is not None and worst >= self.options.degraded_at_s

    def snapshot(self) -> dict[str, float | bool | None]:
        return {"latest_s": self.latest_s, "max_recent_s": self.max_recent_s(), "window_s": self.options.window_s,
                "interval_s": self.options.interval_s, "degraded_at_s": self.options.degraded_at_s,
                "lagging": self.lagging}

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop being watched; None while stopped."""
        return self._task.get_loop() if self._task is not None else None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._probe(), name="loop-lag-probe")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        # asyncio.wait, not wait_for: the probe's own CancelledError is expected and stays
        # here, while a cancellation of whoever awaits stop() still reaches them.
        done, _ = await asyncio.wait({task}, timeout=self.options.stop_timeout_s)
        if not done:
            log.warning("loop lag probe did not stop within %.1f s", self.options.stop_timeout_s)

    async def _probe(self) -> None:
        interval = self.options.interval_s
        while True:
            due_at = self._clock() + interval
            await asyncio.sleep(interval)
            lag = self._window.woke(due_at, self._clock())
            try:
                self._on_sample(lag)
            except Exception:  # a broken listener must not stop the measuring
                log.exception("loop lag listener failed")
