"""Running blocking model code off the event loop, earliest-wanted first.

Each engine owns one `ModelRunner`: a single worker thread (models are not re-entrant,
and on 2 cores more threads only fight over them), with a bound on how many requests
may wait. Past the bound a request is refused with `CapacityError` at once rather than
queued behind minutes of work: callers see a clear error instead of a silent stall.

Waiting requests are served by when their answer is wanted (`models.scheduling.WANTED_BY`),
not by arrival: one call's first sentence goes before another call's third. A request
cancelled while it waits is dropped unrun; one cancelled while it runs keeps its slot until
the thread is done with it, so the bound and the queue depth never under-count the work.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from models.errors import CapacityError, WorkerUnavailableError
from models.scheduling import WANTED_BY

T = TypeVar("T")

_DONE = object()


@dataclass(order=True)
class _Job:
    wanted_by: float
    seq: int
    fn: Callable[[], Any] = field(compare=False)
    future: asyncio.Future = field(compare=False)
    loop: asyncio.AbstractEventLoop = field(compare=False)
    started: bool = field(default=False, compare=False)  # guarded by the runner's lock
    dropped: bool = field(default=False, compare=False)  # cancelled before it started


class ModelRunner:
    def __init__(self, name: str, *, max_waiting: int = 16, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self._max_waiting = max_waiting
        self._clock = clock
        self._queue: list[_Job] = []
        self._lock = threading.Condition()
        self._sequence = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._in_flight = 0  # admitted and not finished (waiting + running); read by metrics
        self._batches_run = 0

    @property
    def depth(self) -> int:
        return self._in_flight

    @property
    def batch_size(self) -> int | None:
        """One request at a time: a batch of 1 once any has run."""
        return 1 if self._batches_run else None

    def _submit(self, fn: Callable[[], T], wanted_by: float | None) -> _Job:
        if self._closed:
            raise WorkerUnavailableError(f"{self.name} engine is closed")
        if self._in_flight >= self._max_waiting:
            raise CapacityError(f"{self.name} engine has {self._in_flight} requests waiting; retry later")
        loop = asyncio.get_running_loop()
        job = _Job(self._clock() if wanted_by is None else wanted_by, next(self._sequence), fn,
                   loop.create_future(), loop)
        self._in_flight += 1
        with self._lock:
            heapq.heappush(self._queue, job)
            self._lock.notify()
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=f"model-{self.name}", daemon=True)
            self._thread.start()
        return job

    def _withdraw(self, job: _Job) -> None:
        """The caller gave up: a job not yet started never runs and frees its slot now."""
        with self._lock:
            if job.started:
                return  # the slot comes back when the thread finishes it
            job.dropped = True
        self._in_flight -= 1

    def _serve(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._lock.wait()
                if self._closed and not self._queue:
                    return
                job = heapq.heappop(self._queue)
                if job.dropped:
                    continue
                job.started = True
            try:
                outcome: tuple[bool, Any] = (True, job.fn())
            except BaseException as exc:  # handed to the awaiting task
                outcome = (False, exc)
            try:
                job.loop.call_soon_threadsafe(self._finish, job, outcome)
            except RuntimeError:  # the loop is closed: nobody waits for the answer
                pass

    def _finish(self, job: _Job, outcome: tuple[bool, Any]) -> None:
        self._in_flight -= 1
        self._batches_run += 1
        if job.future.done():
            return
        ok, value = outcome
        if ok:
            job.future.set_result(value)
        else:
            job.future.set_exception(value)

    async def run(self, fn: Callable[[], T]) -> T:
        job = self._submit(fn, WANTED_BY.get())
        try:
            # Shielded: cancelling the awaiting task must not mark the job done while it runs.
            return await asyncio.shield(job.future)
        except asyncio.CancelledError:
            self._withdraw(job)
            if job.future.done() and not job.future.cancelled():
                job.future.exception()  # retrieved: nobody will read it
            raise

    def stream(self, make_iterator: Callable[[threading.Event], Iterator[T]], *, buffer: int = 64) -> AsyncIterator[T]:
        """Runs a blocking generator on the model thread and yields its items here.

        When it is wanted is read now, at the call, so a caller can set WANTED_BY around
        creating the stream. The generator receives a `threading.Event` that is set when the
        consumer stops early (barge-in, hang-up); it must check it between steps. Items pass
        through a bounded queue: if the consumer falls `buffer` items behind, the producer waits.
        """
        return self._stream(make_iterator, buffer, WANTED_BY.get())

    async def _stream(self, make_iterator: Callable[[threading.Event], Iterator[T]], buffer: int,
                      wanted_by: float | None) -> AsyncIterator[T]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[object] = asyncio.Queue(maxsize=buffer)
        stop = threading.Event()

        def put(item: object) -> None:
            # Block the model thread (not the loop) while the queue is full.
            future = asyncio.run_coroutine_threadsafe(queue.put(item), loop)
            while not stop.is_set():
                try:
                    future.result(timeout=0.1)
                    return
                except TimeoutError:
                    continue
            future.cancel()

        def produce() -> None:
            iterator = None
            try:
                iterator = make_iterator(stop)
                for item in iterator:
                    if stop.is_set():
                        break
                    put(item)
            except BaseException as exc:  # handed to the consumer, re-raised there
                put(_Failure(exc))
            finally:
                if hasattr(iterator, "close"):
                    iterator.close()  # runs the generator's own cleanup now, on this thread
                put(_DONE)

        job = self._submit(produce, wanted_by)
        try:
            while True:
                item = await queue.get()
                if item is _DONE:
                    break
                if isinstance(item, _Failure):
                    raise item.exc
                yield item  # type: ignore[misc]
        finally:
            stop.set()
            self._withdraw(job)
            if job.started:
                # Wait for the thread to notice, so the next request never overlaps this one.
                await asyncio.shield(job.future)

    def shutdown(self) -> None:
        """Stops the thread once the running job ends; jobs still waiting fail at once."""
        with self._lock:
            self._closed = True
            abandoned = [job for job in self._queue if not job.dropped]
            for job in abandoned:
                job.dropped = True
            self._queue.clear()
            self._lock.notify_all()
        for job in abandoned:
            try:
                job.loop.call_soon_threadsafe(self._finish, job, (False, WorkerUnavailableError(
                    f"{self.name} engine closed before it ran this request")))
            except RuntimeError:
                pass


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class RunnerLoad:
    """For an engine whose inference runs on its own `ModelRunner` (`self._runner`): the
    queue depth and batch size the dashboard and /metrics show are the runner's. Listed
    before the engine's contract class, whose defaults it replaces."""

    _runner: ModelRunner

    @property
    def queue_depth(self) -> int:
        return self._runner.depth

    @property
    def batch_size(self) -> int | None:
        return self._runner.batch_size

