"""Which replica of a model worker takes the next request: a pure policy, no I/O.

The engine clients (models/remote.py, models/openai_chat.py) send; this only chooses, so
every client spreads its own load without a central balancer:
  least in flight   a request goes to the replica with the fewest requests in flight from
                    this client; ties go round-robin, so one request at a time still spreads.
  cool-off          a replica that refused a connection is passed over for `cool_off_s`, then
                    tried again; the client may pass one over for longer (`mark_down(url,
                    for_s)`: a replica that went silent past a reply's deadline). When every
                    replica is cooling off one is still tried (the least loaded): a request
                    must go somewhere, and the worker may be back.
  retry target      `alternative(url)`: another replica that is not cooling off, for the one
                    more try of a request that `url` refused or was too full to take.
  affinity          `pick_for(key, busy_at)`: a key (a conversation's opening) maps to a home
                    replica by a stable hash, so its prompt cache there is reused; a home that
                    is cooling off, or has `busy_at` requests while another has fewer, is
                    passed over for the least loaded.
Blocking callers (a thread) only pick and mark down; the per-replica tables never change size
after construction, so that needs no lock (a race only skews the round-robin).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Sequence

DEFAULT_COOL_OFF_S = 2.0  # long enough to skip a dead worker for a turn or two, short enough to see it back


def stable_index(key: str, count: int) -> int:
    """The same index for the same key in every process (Python's hash() is salted per process)."""
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count


class ReplicaSet:
    def __init__(self, urls: Sequence[str], *, cool_off_s: float = DEFAULT_COOL_OFF_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not urls:
            raise ValueError("a replica set needs at least one URL")
        if len(set(urls)) != len(urls):
            raise ValueError(f"replica URLs must differ; got {', '.join(urls)}")
        if cool_off_s < 0:
            raise ValueError("cool_off_s must be >= 0")
        self.urls = tuple(urls)
        self._cool_off_s = cool_off_s
        self._clock = clock
        self._in_flight = dict.fromkeys(self.urls, 0)
        self._down_until = dict.fromkeys(self.urls, -math.inf)
        self._why = dict.fromkeys(self.urls, "")
        self._cursor = 0  # index where the round-robin among equally loaded replicas starts

    @property
    def in_flight(self) -> int:
        """Requests of this client in flight over all replicas."""
        return sum(self._in_flight.values())

    def in_flight_at(self, url: str) -> int:
        return self._in_flight[url]

    def is_down(self, url: str) -> bool:
        return self._clock() < self._down_until[url]

    def states(self) -> list[dict[str, object]]:
        """Each replica as an operator sees it: its load from this client, and whether it is
        being passed over, and why (None while it is not)."""
        return [{"url": url, "in_flight": self._in_flight[url], "cooling_off": self.is_down(url),
                 "why": self._why[url] if self.is_down(url) else None} for url in self.urls]

    def started(self, url: str) -> None:
        self._in_flight[url] += 1

    def finished(self, url: str) -> None:
        self._in_flight[url] -= 1

    def mark_down(self, url: str, for_s: float | None = None, *, why: str = "refused a connection") -> None:
        """Passes `url` over for `for_s` (None: cool_off_s); never shortens a longer pass-over.
        `why` is what an operator reads in its state while it lasts."""
        until = self._clock() + (self._cool_off_s if for_s is None else for_s)
        if until >= self._down_until[url]:
            self._down_until[url], self._why[url] = until, why

    def mark_up(self, url: str) -> None:
        """Ends a pass-over early: the replica was heard from again."""
        self._down_until[url], self._why[url] = -math.inf, ""

    def pick(self) -> str:
        up = [url for url in self.urls if not self.is_down(url)]
        return self._least_loaded(up or list(self.urls))

    def alternative(self, failed: str) -> str | None:
        """Another replica, not cooling off, for one more try of a request `failed` did not take."""
        others = [url for url in self.urls if url != failed and not self.is_down(url)]
        return self._least_loaded(others) if others else None

    def pick_for(self, key: str, *, busy_at: float) -> str:
        home = self.urls[stable_index(key, len(self.urls))]
        if self.is_down(home):
            return self.pick()
        fewer_elsewhere = any(self._in_flight[url] < self._in_flight[home]
                              for url in self.urls if url != home and not self.is_down(url))
        if self._in_flight[home] >= busy_at and fewer_elsewhere:
            return self.pick()
        return home

    def _least_loaded(self, candidates: list[str]) -> str:
        fewest = min(self._in_flight[url] for url in candidates)
        tied = [url for url in candidates if self._in_flight[url] == fewest]
        count = len(self.urls)
        chosen = min(tied, key=lambda url: (self.urls.index(url) - self._cursor) % count)
        self._cursor = (self.urls.index(chosen) + 1) % count
        return chosen
