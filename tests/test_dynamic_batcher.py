"""The dynamic batcher: the pure schedule exhaustively, then the asyncio shell on a fake clock.

No test sleeps: time moves only when a test advances the fake clock, and batches run only
when a test opens their gate. `settle()` lets the event loop run what is ready (zero-length
yields, not waits) before a test checks that nothing fired.
"""

from __future__ import annotations

import asyncio
import itertools
import threading

import pytest

from models.errors import CapacityError, WorkerUnavailableError
from workers.batcher import (
    REQUEST_DEADLINE,
    BatchPolicy,
    BatchRecord,
    BatchSchedule,
    DynamicBatcher,
)

WAIT_S = 5.0  # bound on waiting for an event that must come; never reached when the code is right


# --- the pure schedule ------------------------------------------------------------------

def _schedule(max_batch: int = 4, timeout_s: float = 0.01, max_pending: int = 8, slack: float = 1.0) -> BatchSchedule:
    return BatchSchedule(BatchPolicy(max_batch, timeout_s, max_pending, slack))


def test_policy_refuses_bad_bounds():
    for bad in [(0, 0.01, 4), (4, 0.01, 0), (4, -1.0, 4)]:
        with pytest.raises(ValueError):
            BatchPolicy(*bad)
    with pytest.raises(ValueError):
        BatchPolicy(1, 0.0, 1, default_slack_s=-0.5)


def test_nothing_waiting_never_fires():
    schedule = _schedule()
    assert schedule.fire_at() is None
    assert not schedule.should_fire(1e9)
    batch = schedule.take(0.0)
    assert batch.items == () and batch.expired == ()


def test_fires_when_the_oldest_has_waited_the_timeout():
    schedule = _schedule(timeout_s=0.01)
    schedule.offer("a", now=1.0)
    schedule.offer("b", now=1.005)
    assert schedule.fire_at() == pytest.approx(1.01)
    assert not schedule.should_fire(1.0099)
    assert schedule.should_fire(1.01)


def test_fires_at_once_when_max_batch_wait():
    schedule = _schedule(max_batch=2, timeout_s=10.0)
    schedule.offer("a", now=0.0)
    assert not schedule.should_fire(0.0)
    schedule.offer("b", now=0.0)
    assert schedule.should_fire(0.0)


def test_withdrawing_the_oldest_moves_the_timer_to_the_next():
    schedule = _schedule(timeout_s=0.01)
    first = schedule.offer("a", now=0.0)
    schedule.offer("b", now=0.5)
    assert schedule.withdraw(first)
    assert not schedule.withdraw(first)  # gone already
    assert schedule.fire_at() == pytest.approx(0.51)
    assert schedule.take(1.0).items == ("b",)


def test_full_queue_refuses_at_once_and_frees_after_take():
    schedule = _schedule(max_batch=2, max_pending=3)
    for name in "abc":
        schedule.offer(name, now=0.0)
    with pytest.raises(CapacityError, match="waiting"):
        schedule.offer("d", now=0.0)
    assert schedule.waiting == 3
    schedule.take(0.0)
    schedule.offer("d", now=0.0)
    assert schedule.waiting == 2


def test_take_is_capped_at_max_batch_and_leaves_the_rest_waiting():
    schedule = _schedule(max_batch=2, timeout_s=0.01)
    for name in "abcde":
        schedule.offer(name, now=0.0)
    assert schedule.take(0.0).items == ("a", "b")
    assert schedule.take(0.0).items == ("c", "d")
    # The leftover waited since 0.0: its timer has run out already.
    assert schedule.should_fire(0.01)
    assert schedule.take(0.01).items == ("e",)
    assert schedule.waiting == 0


def test_a_turn_with_a_tight_deadline_goes_before_routine_work():
    schedule = _schedule(max_batch=1, slack=1.0)
    schedule.offer("later sentence of call A", now=0.0)
    schedule.offer("later sentence of call B", now=0.1)
    schedule.offer("first sentence of call C", now=0.2, deadline=0.5)
    order = [schedule.take(0.3).items[0] for _ in range(3)]
    assert order == ["first sentence of call C", "later sentence of call A", "later sentence of call B"]


def test_requests_past_their_deadline_are_returned_as_expired_not_run():
    schedule = _schedule(max_batch=4)
    schedule.offer("stale", now=0.0, deadline=0.05)
    schedule.offer("fresh", now=0.0, deadline=5.0)
    schedule.offer("undated", now=0.0)  # no explicit deadline: never expires
    batch = schedule.take(0.5)
    assert batch.expired == ("stale",)
    assert batch.items == ("undated", "fresh")  # due at 0.0 + 1 s of slack, before 5.0


def test_when_an_answer_is_wanted_orders_it_but_never_refuses_it():
    schedule = _schedule(max_batch=1, slack=1.0)
    schedule.offer("third sentence, wanted in 2 s", now=0.0, wanted_by=2.0)
    schedule.offer("routine, no time given", now=0.1)  # due at 1.1
    schedule.offer("first sentence, wanted now", now=0.2, wanted_by=0.2)
    schedule.offer("wanted late, but a deadline sooner", now=0.3, wanted_by=9.0, deadline=1.5)
    batches = [schedule.take(5.0) for _ in range(4)]  # long past every wanted-by time
    assert [b.items[0] for b in batches[:3]] == [
        "first sentence, wanted now", "routine, no time given", "third sentence, wanted in 2 s"]
    assert batches[0].expired == ("wanted late, but a deadline sooner",)  # the hard one, only
    assert all(not b.expired for b in batches[1:3])


@pytest.mark.parametrize("max_batch", [1, 2, 3, 4])
def test_every_mix_of_deadlines_is_taken_in_deadline_then_arrival_order(max_batch):
    # Exhaustive over 4 requests x {no deadline, 0.5, 1.0 (= the slack), 3.0}, arrivals 0.0..0.3.
    choices = (None, 0.5, 1.0, 3.0)
    for deadlines in itertools.product(choices, repeat=4):
        schedule = _schedule(max_batch=max_batch, max_pending=4, slack=1.0)
        for index, deadline in enumerate(deadlines):
            schedule.offer(index, now=index * 0.1, deadline=deadline)
        due = {i: (d if d is not None else i * 0.1 + 1.0) for i, d in enumerate(deadlines)}
        expected = sorted(range(4), key=lambda i: (due[i], i))
        taken: list[int] = []
        while schedule.waiting:
            batch = schedule.take(0.4)
            assert batch.expired == () and 1 <= len(batch.items) <= max_batch
            taken += batch.items
        assert taken == expected, deadlines


def test_batch_record_is_bounded():
    record = BatchRecord(max_batch=4, recent=3)
    assert record.last is None and record.recent == ()
    for size in [1, 4, 2, 3, 4]:
        record.record(size)
    assert record.last == 4
    assert record.recent == (2, 3, 4)
    assert record.counts == [0, 1, 1, 1, 2]


# --- the asyncio shell --------------------------------------------------------------------

class FakeClock:
    """Time that moves only when a test says so; `sleep` wakes when it has moved far enough."""

    def __init__(self) -> None:
        self.now = 100.0
        self._sleepers: list[tuple[float, asyncio.Future]] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        future = asyncio.get_running_loop().create_future()
        entry = (self.now + delay, future)
        self._sleepers.append(entry)
        try:
            await future
        finally:
            self._sleepers.remove(entry)

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for wake_at, future in list(self._sleepers):
            if wake_at <= self.now and not future.done():
                future.set_result(None)


class GatedModel:
    """run_batch that reports each batch as it starts and waits for the test to release it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, gated: bool = True) -> None:
        self._loop = loop
        self.started: asyncio.Queue[list] = asyncio.Queue()
        self.gate = threading.Event()
        if not gated:
            self.gate.set()
        self.finished = threading.Event()
        self.batches: list[list] = []
        self.fail_with: Exception | None = None

    def __call__(self, requests: list) -> list:
        self.batches.append(list(requests))
        self._loop.call_soon_threadsafe(self.started.put_nowait, list(requests))
        self.gate.wait(WAIT_S)
        try:
            if self.fail_with is not None:
                raise self.fail_with
            return [f"result of {r}" for r in requests]
        finally:
            self.finished.set()

    async def next_batch(self) -> list:
        return await asyncio.wait_for(self.started.get(), WAIT_S)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def model() -> GatedModel:
    return GatedModel(asyncio.get_running_loop())


def _batcher(model: GatedModel, clock: FakeClock, **bounds) -> DynamicBatcher:
    bounds = {"max_batch": 4, "timeout_s": 0.015, "max_pending": 8, **bounds}
    return DynamicBatcher(model, clock=clock, sleep=clock.sleep, name="test", **bounds)


def _submit(batcher: DynamicBatcher, request, deadline=None) -> asyncio.Task:
    return asyncio.create_task(batcher.submit(request, deadline))


async def test_a_batch_forms_as_soon_as_max_batch_wait(model, clock):
    model.gate.set()
    batcher = _batcher(model, clock, max_batch=3, timeout_s=10.0)
    tasks = [_submit(batcher, name) for name in "abc"]
    assert await model.next_batch() == ["a", "b", "c"]
    assert await asyncio.gather(*tasks) == ["result of a", "result of b", "result of c"]
    assert batcher.last_batch_size == 3 and batcher.queue_depth == 0
    await batcher.close()


async def test_a_partial_batch_fires_when_the_oldest_times_out(model, clock):
    model.gate.set()
    batcher = _batcher(model, clock, max_batch=8, timeout_s=0.015)
    tasks = [_submit(batcher, "a")]
    await settle()
    clock.advance(0.010)
    tasks.append(_submit(batcher, "b"))
    await settle()
    assert batcher.last_batch_size is None and batcher.queue_depth == 2  # 10 ms: not yet
    clock.advance(0.005)
    assert await model.next_batch() == ["a", "b"]
    assert await asyncio.gather(*tasks) == ["result of a", "result of b"]
    await batcher.close()


async def test_one_batch_at_a_time_and_the_next_forms_in_deadline_order(model, clock):
    batcher = _batcher(model, clock, max_batch=2, timeout_s=0.0)
    first = _submit(batcher, "running")
    assert await model.next_batch() == ["running"]
    routine = _submit(batcher, "routine")  # due at now + 1 s of slack
    late = _submit(batcher, "relaxed", deadline=clock.now + 30.0)
    urgent = _submit(batcher, "urgent", deadline=clock.now + 0.2)
    await settle()
    assert batcher.queue_depth == 4 and len(model.batches) == 1  # no in-flight batching
    model.gate.set()
    assert await model.next_batch() == ["urgent", "routine"]
    assert await model.next_batch() == ["relaxed"]
    await asyncio.gather(first, routine, late, urgent)
    assert batcher.recent_batch_sizes == (1, 2, 1)
    await batcher.close()


async def test_a_full_queue_refuses_at_once(model, clock):
    batcher = _batcher(model, clock, max_batch=1, timeout_s=0.0, max_pending=2)
    running = _submit(batcher, "running")
    await model.next_batch()
    waiting = [_submit(batcher, name) for name in ("w1", "w2")]
    await settle()
    with pytest.raises(CapacityError):
        await batcher.submit("one too many")  # raises before it awaits anything
    model.gate.set()
    await asyncio.gather(running, *waiting)
    await batcher.close()


async def test_a_request_cancelled_while_waiting_never_runs(model, clock):
    batcher = _batcher(model, clock, max_batch=1, timeout_s=0.0)
    running = _submit(batcher, "running")
    await model.next_batch()
    doomed = _submit(batcher, "cancelled")
    kept = _submit(batcher, "kept")
    await settle()
    doomed.cancel()
    with pytest.raises(asyncio.CancelledError):
        await doomed
    assert batcher.queue_depth == 2  # running + kept
    model.gate.set()
    assert await asyncio.gather(running, kept) == ["result of running", "result of kept"]
    assert [r for batch in model.batches for r in batch] == ["running", "kept"]
    await batcher.close()


async def test_a_request_cancelled_while_running_holds_its_slot_until_the_thread_ends(model, clock):
    batcher = _batcher(model, clock, max_batch=1, timeout_s=0.0, max_pending=1)
    abandoned = _submit(batcher, "abandoned")
    await model.next_batch()
    abandoned.cancel()
    with pytest.raises(asyncio.CancelledError):
        await abandoned
    assert batcher.queue_depth == 1  # the thread still works on it
    nxt = _submit(batcher, "next")
    await settle()
    assert len(model.batches) == 1 and batcher.queue_depth == 2  # waits for the thread, not the caller
    model.gate.set()
    assert await nxt == "result of next"
    assert batcher.queue_depth == 0
    await batcher.close()


async def test_an_exception_fails_every_request_of_its_batch_only(model, clock):
    batcher = _batcher(model, clock, max_batch=2, timeout_s=0.0)
    model.fail_with = RuntimeError("model exploded")
    model.gate.set()
    tasks = [_submit(batcher, name) for name in "ab"]
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert [str(r) for r in results] == ["model exploded", "model exploded"]
    model.fail_with = None
    assert await batcher.submit("c") == "result of c"
    await batcher.close()


async def test_a_wrong_number_of_results_is_an_error_not_a_mismatch(clock):
    batcher = DynamicBatcher(lambda requests: requests[:1], max_batch=2, timeout_s=0.0, max_pending=4,
                             clock=clock, sleep=clock.sleep)
    results = await asyncio.gather(batcher.submit("a"), batcher.submit("b"), return_exceptions=True)
    assert all(isinstance(r, RuntimeError) and "2 requests" in str(r) for r in results)
    await batcher.close()


async def test_a_request_past_its_deadline_is_refused_not_run(model, clock):
    batcher = _batcher(model, clock, max_batch=1, timeout_s=0.0)
    running = _submit(batcher, "running")
    await model.next_batch()
    token = REQUEST_DEADLINE.set(clock.now + 0.05)  # as the worker server sets it
    try:
        stale = _submit(batcher, "stale")
    finally:
        REQUEST_DEADLINE.reset(token)
    await settle()
    clock.advance(0.1)
    model.gate.set()
    with pytest.raises(CapacityError, match="deadline"):
        await stale
    await running
    assert [r for batch in model.batches for r in batch] == ["running"]
    await batcher.close()


async def test_close_refuses_waiting_and_later_requests(model, clock):
    batcher = _batcher(model, clock, max_batch=1, timeout_s=0.0)
    running = _submit(batcher, "running")
    await model.next_batch()
    waiting = _submit(batcher, "waiting")
    await settle()
    model.gate.set()
    await batcher.close()
    with pytest.raises(WorkerUnavailableError):
        await waiting
    with pytest.raises(WorkerUnavailableError):
        await batcher.submit("after close")
    assert await running == "result of running"
