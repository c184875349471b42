"""Running blocking model code off the event loop.

Each engine owns one `ModelRunner`: a single worker thread (models are not re-entrant,
and on 2 cores more threads only fight over them), with a bound on how many requests
may wait. Past the bound a request is refused with `CapacityError` at once rather than
queued behind minutes of work: callers see a clear error instead of a silent stall.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from models.errors import CapacityError

T = TypeVar("T")

_DONE = object()


class ModelRunner:
    def __init__(self, name: str, *, max_waiting: int = 16) -> None:
        self.name = name
        self._max_waiting = max_waiting
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"model-{name}")
        self._in_flight = 0  # queued + running; read by metrics
        self._batches_run = 0

    @property
    def depth(self) -> int:
        return self._in_flight

    def _admit(self) -> None:
        if self._in_flight >= self._max_waiting:
            raise CapacityError(f"{self.name} engine has {self._in_flight} requests waiting; retry later")
        self._in_flight += 1

    def _release_when_done(self, job: asyncio.Future) -> None:
        # The slot is the thread's, not the awaiting task's: a caller cancelled while the model
        # still runs (speculative ASR does this all the time) must not let a new request in
        # beside it, nor make the queue depth read lower than the work the thread has.
        job.add_done_callback(self._release)

    def _release(self, job: asyncio.Future) -> None:
        if not job.cancelled():
            job.exception()  # retrieved: a failure nobody awaits any more is not logged as lost
        self._in_flight -= 1
        self._batches_run += 1

    @property
    def batch_size(self) -> int | None:
        """One request at a time: a batch of 1 once any has run."""
        return 1 if self._batches_run else None

    async def run(self, fn: Callable[[], T]) -> T:
        self._admit()
        job = asyncio.get_running_loop().run_in_executor(self._executor, fn)
        self._release_when_done(job)
        # Shielded: cancelling the awaiting task must not mark the job done while it runs.
        return await asyncio.shield(job)

    async def stream(self, make_iterator: Callable[[threading.Event], Iterator[T]], *, buffer: int = 64) -> AsyncIterator[T]:
        """Runs a blocking generator on the model thread and yields its items here.

        The generator receives a `threading.Event` that is set when the consumer stops
        early (barge-in, hang-up); it must check it between steps. Items pass through a
        bounded queue: if the consumer falls `buffer` items behind, the producer waits.
        """
        self._admit()
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

        job = loop.run_in_executor(self._executor, produce)
        self._release_when_done(job)
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
            # Wait for the thread to notice, so the next request never overlaps this one.
            await asyncio.shield(job)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
