"""Deadlines on a model's answer while it streams.

A worker that is stopped, deadlocked or lost behind a dead network path sends nothing, and
a client waits out its read timeout (30 s) before it knows; a caller would hear 30 s of
silence. A turn cannot wait that long: `without_stalls` gives up on a stream whose first
item takes longer than `first_s`, or whose next one takes longer than `next_s`, with a
StalledError the pipeline turns into a spoken apology. Only the wait for the model counts:
the time its consumer spends on an item (pushing audio on) does not.

A stream with a `stalled()` method is told when it is given up for lateness (before it is
closed): a client of several replicas then passes the silent one over for later requests
(models/openai_chat.py). A stream closed for any other reason (a barge-in) is not told.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import TypeVar

from models.errors import StalledError

T = TypeVar("T")


@dataclass(frozen=True)
class StallLimits:
    first_s: float  # from the request to its first item: queueing and prefill included
    next_s: float | None = None  # between one item and the next; None: no limit once it started
    # Added to first_s per 1,000 characters of the request (`for_request`): a long prompt's
    # prefill is work a healthy model does before its first token, and on a CPU it is
    # seconds (an agent's 8,000-character prompt, cold, is ~10 s on 2 cores).
    first_per_kchar_s: float = 0.0

    def __post_init__(self) -> None:
        if self.first_s <= 0 or (self.next_s is not None and self.next_s <= 0) or self.first_per_kchar_s < 0:
            raise ValueError("stall limits must be > 0 (the per-character allowance >= 0)")

    def for_request(self, chars: int) -> StallLimits:
        """The limits for one request of `chars` characters: its allowance added to first_s."""
        return replace(self, first_s=self.first_s + self.first_per_kchar_s * max(0, chars) / 1000,
                       first_per_kchar_s=0.0)


async def without_stalls(stream: AsyncIterator[T], limits: StallLimits | None, *, what: str,
                         progress: T | None = None) -> AsyncIterator[T]:
    """`stream`'s items, or StalledError naming `what` once one is late. The stream is closed
    either way (a remote engine then cancels its request). `limits` None: no deadline.
    An item equal to `progress` (an engine's report that it is still reading the request)
    starts the first item's deadline again: each report must come within first_s of the
    last, and the gap limit applies from the first other item on."""
    try:
        if limits is None:
            async for item in stream:
                yield item
            return
        first = True
        reading = False  # the engine has reported progress through the request
        while True:
            within = limits.first_s if first else limits.next_s
            try:
                async with asyncio.timeout(within):
                    item = await anext(stream)
            except StopAsyncIteration:
                return
            except TimeoutError:
                stalled = getattr(stream, "stalled", None)
                if stalled is not None:
                    stalled()
                which = "first answer" if first else "next piece"
                since = " of its last progress" if reading and first else ""  # the gap is from the last piece
                raise StalledError(f"{what}: no {which} within {within:.1f} s{since}") from None
            yield item
            if first and progress is not None and item == progress:
                reading = True
            else:
                first = False
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()



def failure_kind(exc: BaseException) -> str:
    """A lost answer's label for metrics: `stalled` (past its deadline) or `error`."""
    return "stalled" if isinstance(exc, (StalledError, TimeoutError)) else "error"
