"""When a request's answer is wanted: how a shared engine orders the calls waiting for it.

A model serves every call; which request it takes next decides whose caller waits. Arrival
order lets one call's third sentence (not heard for seconds yet) go before another call's
first (heard as soon as it exists). So a pipeline stage says when it needs the answer, in
this context variable, and the engine serves the earliest first (`ModelRunner`):

- a reply's first sentence, a turn's final transcript: now;
- a later sentence: when the audio already queued ahead of it runs out;
- a speculative transcript: when the caller's pause would end the turn.

A context variable, not an argument: it travels from the pipeline through any engine (and
its fallbacks) to the runner without widening every engine's signature, and a request made
without one is simply served in arrival order.

ANSWER_DEADLINE, beside it, says when an answer stops being useful (a turn's transcript past
its deadlines.asr_*): a worker serves such requests earliest deadline first and answers 504
past it, and a client may wait that long for a worker that is restarting or still loading.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar

# On time.monotonic's scale. None: wanted now (arrival order among such requests).
WANTED_BY: ContextVar[float | None] = ContextVar("cadence_wanted_by", default=None)
# On time.monotonic's scale. None: no deadline (an answer is useful whenever it comes).
ANSWER_DEADLINE: ContextVar[float | None] = ContextVar("cadence_answer_deadline", default=None)


@contextlib.contextmanager
def wanted_in(seconds: float, *, clock=time.monotonic) -> Iterator[None]:
    """Requests made inside are wanted `seconds` from now (0 or less: now)."""
    token = WANTED_BY.set(clock() + max(0.0, seconds))
    try:
        yield
    finally:
        WANTED_BY.reset(token)


@contextlib.contextmanager
def answer_within(seconds: float, *, clock=time.monotonic) -> Iterator[None]:
    """Requests made inside are useless `seconds` from now."""
    token = ANSWER_DEADLINE.set(clock() + seconds)
    try:
        yield
    finally:
        ANSWER_DEADLINE.reset(token)
