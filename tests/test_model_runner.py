import asyncio
import threading
import time

import pytest

from models.errors import CapacityError, WorkerUnavailableError
from models.runner import ModelRunner


async def test_run_executes_off_the_event_loop():
    runner = ModelRunner("t")
    loop_thread = threading.get_ident()
    assert await runner.run(threading.get_ident) != loop_thread
    runner.shutdown()


async def test_requests_beyond_the_bound_are_refused_not_queued():
    runner = ModelRunner("t", max_waiting=2)
    release = threading.Event()
    first = asyncio.ensure_future(runner.run(lambda: release.wait(5)))
    second = asyncio.ensure_future(runner.run(lambda: None))
    await asyncio.sleep(0)  # both tasks take their slot before their first await
    with pytest.raises(CapacityError, match="2 requests waiting"):
        await runner.run(lambda: None)
    release.set()
    await asyncio.gather(first, second)
    assert runner.depth == 0
    runner.shutdown()


async def test_a_cancelled_request_keeps_its_slot_until_the_model_thread_finishes():
    runner = ModelRunner("t", max_waiting=1)
    started, release = threading.Event(), threading.Event()

    def work():
        started.set()
        release.wait(5)

    request = asyncio.ensure_future(runner.run(work))
    await asyncio.get_running_loop().run_in_executor(None, started.wait, 5)
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request
    assert runner.depth == 1  # the thread still works on it
    with pytest.raises(CapacityError):
        await runner.run(lambda: None)
    release.set()
    assert await _eventually_admitted(runner) == "free"
    assert runner.depth == 0
    runner.shutdown()


async def _eventually_admitted(runner: ModelRunner) -> str:
    # The slot comes back on the loop once the thread's future completes; poll by yielding
    # to the loop (no wall-clock sleep), bounded so a leak fails instead of hanging.
    for _ in range(10_000):
        if runner.depth == 0:
            return await runner.run(lambda: "free")
        await asyncio.sleep(0)
    raise AssertionError(f"slot never came back: depth {runner.depth}")


async def test_closing_a_stream_early_stops_the_producer_and_frees_the_slot():
    runner = ModelRunner("t", max_waiting=1)
    produced = []

    def produce(stop: threading.Event):
        for i in range(1000):
            if stop.is_set():
                return
            produced.append(i)
            time.sleep(0.002)
            yield i

    stream = runner.stream(produce, buffer=2)
    got = [await stream.__anext__() for _ in range(3)]
    await stream.aclose()
    assert got == [0, 1, 2]
    assert len(produced) < 10  # the thread stopped within a few steps, not at 1000
    assert runner.depth == 0
    assert await runner.run(lambda: "next") == "next"  # the slot is free again
    runner.shutdown()


async def test_producer_errors_reach_the_consumer():
    runner = ModelRunner("t")

    def broken(stop):
        yield 1
        raise RuntimeError("model exploded")

    with pytest.raises(RuntimeError, match="model exploded"):
        async for _ in runner.stream(broken):
            pass
    assert runner.depth == 0
    runner.shutdown()


async def test_cancelling_the_consumer_stops_the_producer():
    runner = ModelRunner("t")
    stopped = threading.Event()

    def endless(stop):
        try:
            while True:
                time.sleep(0.005)
                yield b"x"
        finally:  # the generator is closed on the model thread, so its cleanup runs
            stopped.set()

    async def consume():
        async for _ in runner.stream(endless):
            pass

    task = asyncio.ensure_future(consume())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert stopped.wait(1.0)
    runner.shutdown()


async def test_waiting_requests_are_served_by_when_they_are_wanted_not_by_arrival():
    from models.scheduling import WANTED_BY

    runner = ModelRunner("t", clock=lambda: 100.0)
    release, started = threading.Event(), threading.Event()
    order = []

    def blocker():
        started.set()
        release.wait(5)

    first = asyncio.ensure_future(runner.run(blocker))
    await asyncio.get_running_loop().run_in_executor(None, started.wait, 5)

    async def wanted(at, label):
        WANTED_BY.set(at)  # each task has its own copy of the context
        return await runner.run(lambda: order.append(label))

    later = asyncio.ensure_future(wanted(103.0, "third sentence of call A"))
    now = asyncio.ensure_future(wanted(None, "first sentence of call B"))  # None: wanted at arrival (100)
    soon = asyncio.ensure_future(wanted(101.0, "speculative transcript"))
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(first, later, now, soon)
    assert order == ["first sentence of call B", "speculative transcript", "third sentence of call A"]
    runner.shutdown()


async def test_a_request_cancelled_while_waiting_never_runs_and_frees_its_slot_at_once():
    runner = ModelRunner("t", max_waiting=2)
    release, started = threading.Event(), threading.Event()
    ran = []

    def blocker():
        started.set()
        release.wait(5)

    first = asyncio.ensure_future(runner.run(blocker))
    await asyncio.get_running_loop().run_in_executor(None, started.wait, 5)
    waiting = asyncio.ensure_future(runner.run(lambda: ran.append("should not run")))
    await asyncio.sleep(0)
    assert runner.depth == 2
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert runner.depth == 1
    release.set()
    await first
    assert await runner.run(lambda: "next") == "next" and ran == []
    runner.shutdown()


async def test_shutdown_fails_waiting_requests_instead_of_leaving_them_hanging():
    runner = ModelRunner("t")
    release, started = threading.Event(), threading.Event()

    def blocker():
        started.set()
        release.wait(5)

    first = asyncio.ensure_future(runner.run(blocker))
    await asyncio.get_running_loop().run_in_executor(None, started.wait, 5)
    waiting = asyncio.ensure_future(runner.run(lambda: None))
    await asyncio.sleep(0)
    runner.shutdown()
    with pytest.raises(WorkerUnavailableError, match="closed"):
        await asyncio.wait_for(waiting, 2)
    release.set()
    await first
