"""Live turn events for dashboards: a small publish/subscribe hub on the event loop.

A closed turn is published once (from `CallManager`, on the loop) and copied to every
subscriber's bounded queue. Publishing never waits: a subscriber that falls
`queue_size` events behind (a stalled browser tab, a slow network) loses its oldest
events, and the drops are counted so its dashboard can say it missed some. A call's
pipeline must never slow down because somebody is watching it.

Subscribers are capped: each open dashboard holds a connection and a queue, so past
`max_subscribers` a new one is refused with `CapacityError` (HTTP 503).

All methods run on the event loop's thread except `closed`, which is a plain flag.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from agent.errors import CapacityError

# Open dashboards at once. Each is one long-lived HTTP response; a handful of operators is normal.
MAX_SUBSCRIBERS = 16
# Events a subscriber may fall behind before its oldest are dropped. At the default 4
# concurrent calls a turn closes every few seconds, so this is minutes of backlog.
SUBSCRIBER_QUEUE_EVENTS = 256

Event = dict[str, Any]


class _Closed:
    """Sentinel queued to each subscriber when the hub closes (server shutting down)."""


_CLOSED = _Closed()


class Subscription:
    def __init__(self, hub: TurnEvents, queue_size: int) -> None:
        self._hub = hub
        self._queue: asyncio.Queue[Event | _Closed] = asyncio.Queue(maxsize=queue_size)
        self.dropped = 0  # events this subscriber lost to the drop-oldest policy

    @property
    def backlog(self) -> int:
        return self._queue.qsize()

    def _offer(self, item: Event | _Closed) -> bool:
        """Queues `item`, dropping the oldest queued event when full; True if one was dropped."""
        dropped = False
        if self._queue.full():
            self._queue.get_nowait()
            self.dropped += 1
            dropped = True
        self._queue.put_nowait(item)
        return dropped

    async def next(self, timeout: float) -> Event | None:
        """The next event, or None after `timeout` seconds without one.

        Raises `EOFError` once the hub has closed and everything queued before was read."""
        try:
            item = await asyncio.wait_for(self._queue.get(), timeout)
        except asyncio.TimeoutError:
            if self._hub.closed:
                raise EOFError("event hub closed") from None
            return None
        if isinstance(item, _Closed):
            raise EOFError("event hub closed")
        return item

    def close(self) -> None:
        self._hub._remove(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class TurnEvents:
    def __init__(self, *, max_subscribers: int = MAX_SUBSCRIBERS, queue_size: int = SUBSCRIBER_QUEUE_EVENTS,
                 on_drop: Callable[[], None] = lambda: None) -> None:
        if max_subscribers < 1 or queue_size < 1:
            raise ValueError("max_subscribers and queue_size must be >= 1")
        self._max_subscribers = max_subscribers
        self._queue_size = queue_size
        self._on_drop = on_drop  # e.g. a Prometheus counter's inc
        self._subscribers: list[Subscription] = []
        self.closed = False
        self.published = 0

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)

    @property
    def max_backlog(self) -> int:
        """The deepest subscriber queue: how far the slowest dashboard lags."""
        return max((s.backlog for s in self._subscribers), default=0)

    def subscribe(self) -> Subscription:
        if self.closed:
            raise CapacityError("the server is shutting down; no new event streams")
        if len(self._subscribers) >= self._max_subscribers:
            raise CapacityError(
                f"{self._max_subscribers} dashboard streams are already open (the limit); close one or retry later"
            )
        subscription = Subscription(self, self._queue_size)
        self._subscribers.append(subscription)
        return subscription

    def _remove(self, subscription: Subscription) -> None:
        if subscription in self._subscribers:
            self._subscribers.remove(subscription)

    def publish(self, event: Event) -> None:
        """Hands `event` to every subscriber without waiting; never raises for a slow one."""
        if self.closed:
            return
        self.published += 1
        for subscription in self._subscribers:
            if subscription._offer(event):
                self._on_drop()

    def close(self) -> None:
        """Ends every subscription (their `next` raises EOFError after what is queued) and
        refuses new ones. The server calls this as it starts shutting down: an open event
        stream would otherwise keep the HTTP server waiting for it to finish."""
        if self.closed:
            return
        self.closed = True
        for subscription in self._subscribers:
            subscription._offer(_CLOSED)
