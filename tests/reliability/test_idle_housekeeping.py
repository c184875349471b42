"""Memory goes back to the OS once the server is idle (agent/memory.py)."""

from __future__ import annotations

import asyncio

from agent.memory import IdleHousekeeping, return_freed_memory


async def test_housekeeping_runs_once_the_server_has_stayed_idle():
    ran = asyncio.Event()
    housekeeping = IdleHousekeeping(lambda: True, delay_s=0.0, housekeep=ran.set)
    housekeeping.when_idle()
    await asyncio.wait_for(ran.wait(), 5)
    assert housekeeping.runs == 1


def test_a_call_that_started_meanwhile_puts_it_off():
    calls_active = 1
    done = []
    housekeeping = IdleHousekeeping(lambda: calls_active == 0, housekeep=lambda: done.append(1))
    housekeeping._run()  # the timer fires with a call in progress
    assert done == [] and housekeeping.runs == 0
    calls_active = 0
    housekeeping._run()
    assert done == [1]


async def test_a_second_idle_moment_replaces_the_first_timer():
    ran = []
    housekeeping = IdleHousekeeping(lambda: True, delay_s=60.0, housekeep=lambda: ran.append(1))
    housekeeping.when_idle()
    first = housekeeping._pending
    housekeeping.when_idle()
    assert first.cancelled() and housekeeping._pending is not first
    housekeeping._pending.cancel()


def test_returning_freed_memory_is_safe_to_call():
    return_freed_memory()  # a full collection and malloc_trim (a no-op without glibc)
