"""One dynamic batcher for every engine that batches.

Requests wait in a bounded set ordered by when they are due, earliest first: when the
answer is wanted (soft: X-Wanted-By-Ms, a later sentence of a reply) or its deadline
(hard: X-Deadline-Ms), whichever comes first; arrival + `default_slack_s` for neither. A batch fires when
`max_batch` requests wait, or when the oldest has waited `timeout_s`; it runs on a worker
thread, one batch at a time (no in-flight batching: the next batch forms while this one runs).

    BatchSchedule    pure: which waiting requests form the next batch and when it fires;
                     time is passed in, nothing awaits. Tested exhaustively.
    BatchRecord      bounded record of batch sizes (the recent ones, and a count per size).
    DynamicBatcher   the thin asyncio shell: futures, a dispatcher task, the worker thread.

Policies: past `max_pending` waiting requests a new one is refused at once (CapacityError),
never queued behind work it cannot wait for. A request cancelled while waiting leaves the
queue and never runs. A request cancelled while its batch runs has its result dropped, and
its slot stays taken until the thread finishes (the bound never under-counts real work).
A request whose explicit deadline passes while it waits is refused (CapacityError) instead
of run for a caller who has stopped waiting.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from models.errors import CapacityError, WorkerUnavailableError

log = logging.getLogger(__name__)

T = TypeVar("T")
Req = TypeVar("Req")
Res = TypeVar("Res")

# A request without a deadline is ordered as if due this long after it arrived: a turn's
# first sentence (sent with a tight deadline) goes ahead of other calls' routine work.
DEFAULT_SLACK_S = 1.0
RECENT_BATCHES = 64  # batch sizes kept for /metrics and the dashboard
CLOSE_WAIT_S = 10.0  # how long close() waits for a running batch before giving up on it

# The deadline of the request being served, on time.monotonic's scale, set by the worker
# server from X-Deadline-Ms; batching engines pass it to submit(). None: no deadline.
REQUEST_DEADLINE: ContextVar[float | None] = ContextVar("cadence_request_deadline", default=None)
# When the answer is wanted, on the same scale, from X-Wanted-By-Ms: orders the request
# only; it is served late rather than refused once that time has passed. None: not said.
REQUEST_WANTED_BY: ContextVar[float | None] = ContextVar("cadence_request_wanted_by", default=None)


@dataclass(frozen=True)
class BatchPolicy:
    max_batch: int  # most requests one run_batch call takes
    timeout_s: float  # longest the oldest waiting request waits for others to join its batch
    max_pending: int  # waiting requests past which new ones are refused with CapacityError
    default_slack_s: float = DEFAULT_SLACK_S  # ordering deadline of a request that gives none

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_pending < 1:
            raise ValueError("batching: max_batch and max_pending must be >= 1")
        if self.timeout_s < 0 or self.default_slack_s < 0:
            raise ValueError("batching: timeout_s and default_slack_s must be >= 0")


@dataclass(order=True)
class _Waiting(Generic[T]):
    due_at: float  # the ordering key: the deadline, or arrival + slack
    ticket: int  # arrival order; breaks ties so equal deadlines stay first come, first served
    arrived_at: float = field(compare=False)
    deadline: float | None = field(compare=False)  # explicit only: past it the request is refused
    item: T = field(compare=False)


@dataclass(frozen=True)
class Batch(Generic[T]):
    items: tuple[T, ...]  # to run now, earliest deadline first
    expired: tuple[T, ...]  # waited past their explicit deadline: refuse, do not run


class BatchSchedule(Generic[T]):
    """Which waiting requests form the next batch, and when it fires. No I/O, no asyncio."""

    def __init__(self, policy: BatchPolicy) -> None:
        self.policy = policy
        self._waiting: dict[int, _Waiting[T]] = {}
        self._tickets = itertools.count()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def offer(self, item: T, *, now: float, deadline: float | None = None, wanted_by: float | None = None) -> int:
        """Admits a request; returns its ticket. Raises CapacityError when the queue is full.
        `deadline`: refused once past it; `wanted_by`: ordering only."""
        if len(self._waiting) >= self.policy.max_pending:
            raise CapacityError(f"{len(self._waiting)} requests are waiting for a batch (the bound); retry later")
        ticket = next(self._tickets)
        said = [t for t in (deadline, wanted_by) if t is not None]
        due_at = min(said) if said else now + self.policy.default_slack_s
        self._waiting[ticket] = _Waiting(due_at, ticket, now, deadline, item)
        return ticket

    def withdraw(self, ticket: int) -> bool:
        """Removes a waiting request (its caller gave up). False if it already left the queue."""
        return self._waiting.pop(ticket, None) is not None

    def fire_at(self) -> float | None:
        """When the next batch fires unless it fills first; None while nothing waits."""
        if not self._waiting:
            return None
        if len(self._waiting) >= self.policy.max_batch:
            return float("-inf")
        return min(w.arrived_at for w in self._waiting.values()) + self.policy.timeout_s

    def should_fire(self, now: float) -> bool:
        fire_at = self.fire_at()
        return fire_at is not None and now >= fire_at

    def take(self, now: float) -> Batch[T]:
        """Removes and returns the next batch: up to max_batch, earliest deadline first."""
        expired = [w for w in self._waiting.values() if w.deadline is not None and w.deadline < now]
        for w in expired:
            del self._waiting[w.ticket]
        chosen = heapq.nsmallest(self.policy.max_batch, self._waiting.values())
        for w in chosen:
            del self._waiting[w.ticket]
        return Batch(tuple(w.item for w in chosen), tuple(w.item for w in sorted(expired)))


class BatchRecord:
    """Batch sizes: the last, the recent ones (bounded), and a count per size for histograms."""

    def __init__(self, max_batch: int, *, recent: int = RECENT_BATCHES) -> None:
        self.max_batch = max_batch
        self.counts = [0] * (max_batch + 1)  # counts[n]: batches of n requests run so far
        self._recent: deque[int] = deque(maxlen=recent)

    def record(self, size: int) -> None:
        self.counts[min(size, self.max_batch)] += 1
        self._recent.append(size)

    @property
    def last(self) -> int | None:
        return self._recent[-1] if self._recent else None

    @property
    def recent(self) -> tuple[int, ...]:
        return tuple(self._recent)


@dataclass(eq=False)
class _Request(Generic[Req, Res]):
    payload: Req
    future: asyncio.Future[Res]


class DynamicBatcher(Generic[Req, Res]):
    """Merges concurrent `submit` calls into `run_batch` calls on a worker thread.

    `run_batch` takes a list of requests and returns their results in the same order. It must
    be safe to call from a thread that is not the event loop's. Deadlines are on `clock`'s
    scale. `sleep` is the clock's sleep, replaced together with it in tests.
    """

    def __init__(self, run_batch: Callable[[list[Req]], list[Res]], *, max_batch: int, timeout_s: float,
                 max_pending: int, default_slack_s: float = DEFAULT_SLACK_S, name: str = "batch",
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                 executor: Executor | None = None) -> None:
        self.name = name
        self._run_batch = run_batch
        self._schedule: BatchSchedule[_Request[Req, Res]] = BatchSchedule(
            BatchPolicy(max_batch, timeout_s, max_pending, default_slack_s))
        self.record = BatchRecord(max_batch)
        self._clock = clock
        self._sleep = sleep
        self._owns_executor = executor is None
        self._executor = executor or ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"batch-{name}")
        self._running = 0  # requests in the batch on the thread now; 0 when none runs
        self._job: asyncio.Future[list[Res]] | None = None
        self._wake: asyncio.Event | None = None
        self._dispatcher: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def queue_depth(self) -> int:
        """Requests admitted and not finished: waiting, plus the batch that runs."""
        return self._schedule.waiting + self._running

    @property
    def last_batch_size(self) -> int | None:
        return self.record.last

    @property
    def recent_batch_sizes(self) -> tuple[int, ...]:
        return self.record.recent

    async def submit(self, request: Req, deadline: float | None = None) -> Res:
        """Runs `request` in the next batch that takes it. `deadline` (on the clock's scale,
        default REQUEST_DEADLINE) orders it and bounds its wait. Raises CapacityError when
        full or past its deadline, WorkerUnavailableError once closed, or run_batch's error."""
        if self._closed:
            raise WorkerUnavailableError(f"the {self.name} batcher is closed")
        self._ensure_dispatcher()
        if deadline is None:
            deadline = REQUEST_DEADLINE.get()
        pending = _Request(request, asyncio.get_running_loop().create_future())
        ticket = self._schedule.offer(pending, now=self._clock(), deadline=deadline, wanted_by=REQUEST_WANTED_BY.get())
        self._poke()
        try:
            return await pending.future
        except asyncio.CancelledError:
            self._schedule.withdraw(ticket)  # still waiting: it never runs; running: result dropped
            raise

    def _ensure_dispatcher(self) -> None:
        if self._dispatcher is None or self._dispatcher.done():
            self._wake = asyncio.Event()
            self._dispatcher = asyncio.get_running_loop().create_task(self._dispatch(), name=f"batcher-{self.name}")

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _dispatch(self) -> None:
        assert self._wake is not None
        while True:
            now = self._clock()
            if self._job is None and self._schedule.should_fire(now):
                self._start_batch(now)
                continue
            self._wake.clear()
            fire_at = self._schedule.fire_at() if self._job is None else None
            await self._wait(None if fire_at is None else fire_at - now)

    async def _wait(self, delay: float | None) -> None:
        assert self._wake is not None
        waiter = asyncio.ensure_future(self._wake.wait())
        sleeper = None if delay is None else asyncio.ensure_future(self._sleep(max(delay, 0.0)))
        try:
            await asyncio.wait([t for t in (waiter, sleeper) if t is not None], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (waiter, sleeper):
                if task is not None:
                    task.cancel()

    def _start_batch(self, now: float) -> None:
        batch = self._schedule.take(now)
        for pending in batch.expired:
            if not pending.future.done():
                pending.future.set_exception(CapacityError(
                    f"the {self.name} request waited past its deadline for a batch; retry later"))
        if not batch.items:
            return
        self._running = len(batch.items)
        self.record.record(len(batch.items))
        payloads = [p.payload for p in batch.items]
        self._job = asyncio.get_running_loop().run_in_executor(self._executor, self._run_batch, payloads)
        self._job.add_done_callback(lambda job: self._finish(batch.items, job))

    def _finish(self, items: tuple[_Request[Req, Res], ...], job: asyncio.Future[list[Res]]) -> None:
        # The slot is the thread's: it frees only now, whatever happened to the callers.
        self._running = 0
        self._job = None
        self._poke()
        error = job.exception() if not job.cancelled() else WorkerUnavailableError(f"the {self.name} batch was cancelled")
        results: list[Res] = []
        if error is None:
            results = job.result()
            if len(results) != len(items):
                error = RuntimeError(f"{self.name} run_batch returned {len(results)} results for {len(items)} requests")
        if error is not None:
            log.warning("%s batch of %d failed: %r", self.name, len(items), error)
        for index, pending in enumerate(items):
            if pending.future.done():  # its caller was cancelled: the result is dropped
                continue
            if error is not None:
                pending.future.set_exception(error)
            else:
                pending.future.set_result(results[index])

    async def close(self, timeout_s: float = CLOSE_WAIT_S) -> None:
        """Refuses waiting requests, waits (bounded) for the running batch, stops the thread. Idempotent."""
        self._closed = True
        if self._dispatcher is not None:
            self._dispatcher.cancel()
            await asyncio.gather(self._dispatcher, return_exceptions=True)
        leftovers = self._schedule.take(float("-inf"))
        while leftovers.items:
            for pending in leftovers.items:
                if not pending.future.done():
                    pending.future.set_exception(WorkerUnavailableError(f"the {self.name} batcher closed"))
            leftovers = self._schedule.take(float("-inf"))
        if self._job is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._job), timeout_s)
            except Exception:  # a timeout, or run_batch's error: its callers were told already
                pass
        if self._owns_executor:
            self._executor.shutdown(wait=False, cancel_futures=True)


class BatchedEngineLoad:
    """The Engine contract's load figures for an engine that serves through `self._batcher`."""

    _batcher: DynamicBatcher

    @property
    def queue_depth(self) -> int:
        return self._batcher.queue_depth

    @property
    def batch_size(self) -> int | None:
        return self._batcher.last_batch_size

    @property
    def batch_record(self) -> BatchRecord:
        return self._batcher.record
