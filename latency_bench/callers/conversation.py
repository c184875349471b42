"""One caller's side of a conversation, the same over any transport.

A transport gives a `Line`: something that speaks audio in real time and reports when
the caller's last voiced frame went out. The conversation speaks each planned turn,
pauses as people do (or talks over the reply, for a barge-in), and waits for the reply
to finish before the next turn; what it hears goes to a `ReplyTracker`.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from latency_bench.callers.audio import last_voiced_sample, resample
from latency_bench.callers.listen import ReplyTracker, TurnRecord
from latency_bench.callers.speech import Utterance, utterance_for

POLL_S = 0.02


@dataclass(frozen=True)
class PlannedTurn:
    utterance: Utterance
    pause_before_s: float  # silence before speaking (after the previous reply ended)
    barge_in_after_s: float | None = None  # speak this long after the previous reply began, over it

    @classmethod
    def of(cls, samples: np.ndarray, rate: int, text: str = "", *, pause_before_s: float = 0.6,
           barge_in_after_s: float | None = None) -> PlannedTurn:
        return cls(Utterance(text, "given", samples, rate), pause_before_s, barge_in_after_s)


def plan_caller(caller: int, turns: int, *, seed: int = 0, barge_in_every: int = 0) -> list[PlannedTurn]:
    """`turns` questions in this caller's voice, with think-time pauses of 0.5-2.0 s.

    With `barge_in_every` = k > 0, every k-th turn (never the first) talks over the
    previous reply 0.8-1.5 s after it began, as impatient callers do.
    """
    rng = random.Random(seed * 100_003 + caller)
    plan = []
    for i in range(turns):
        barge = barge_in_every > 0 and i > 0 and i % barge_in_every == 0
        plan.append(PlannedTurn(
            utterance_for(caller, i),
            pause_before_s=0.6 if i == 0 else rng.uniform(0.5, 2.0),
            barge_in_after_s=rng.uniform(0.8, 1.5) if barge else None,
        ))
    return plan


class PacedLine:
    """A `Line` that sends one frame every `frame_seconds` on an absolute schedule, so slow sends
    don't drift: speech when the caller talks, silence otherwise, as a phone or microphone does.
    A subclass sends one frame of int16 samples at `rate` in its own protocol (`_send`)."""

    rate: int
    frame_seconds = 0.02
    max_lag_s = 0.1  # a caller this far behind its schedule (loaded machine) restarts it

    def __init__(self, clock_rate: float = 1.0) -> None:
        """`clock_rate`: how fast the caller's clock runs against true time (1.001: a crystal
        0.1 % fast sends each 20 ms frame after 19.98 ms)."""
        self._next_at = time.monotonic()
        self.frame_samples = int(self.rate * self.frame_seconds)
        self._frame_interval_s = self.frame_seconds / clock_rate

    async def _send(self, frame: np.ndarray) -> None:
        raise NotImplementedError

    async def send_frame(self, frame: np.ndarray) -> float:
        """Sends `frame` when its turn comes; returns when (wall clock) it went."""
        delay = self._next_at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        elif delay < -self.max_lag_s:
            self._next_at = time.monotonic()
        await self._send(frame)
        self._next_at += self._frame_interval_s
        return time.time()

    async def say(self, samples: np.ndarray, rate: int, on_first_frame: Callable[[float], None]) -> float:
        samples = resample(samples, rate, self.rate)
        end_index = last_voiced_sample(samples, self.rate)
        voiced_sent_at = time.time()
        for start in range(0, len(samples), self.frame_samples):
            frame = samples[start:start + self.frame_samples]
            if len(frame) < self.frame_samples:
                frame = np.pad(frame, (0, self.frame_samples - len(frame)))
            sent_at = await self.send_frame(frame)
            if start == 0:
                on_first_frame(sent_at)
            if start < end_index:
                voiced_sent_at = sent_at
        return voiced_sent_at

    async def pause(self, seconds: float) -> None:
        silence = np.zeros(self.frame_samples, dtype=np.int16)
        for _ in range(max(1, round(seconds / self.frame_seconds))):
            await self.send_frame(silence)


class Line(Protocol):
    async def say(self, samples: np.ndarray, rate: int, on_first_frame: Callable[[float], None]) -> float:
        """Speaks `samples` in real time; returns when (wall clock) the last voiced frame went out."""

    async def pause(self, seconds: float) -> None:
        """Keeps the line open (silence) for `seconds`."""


async def converse(
    line: Line,
    tracker: ReplyTracker,
    plan: list[PlannedTurn],
    *,
    caller: int = 0,
    transport: str = "",
    reply_timeout_s: float = 20.0,
    reply_quiet_s: float = 1.5,
    max_reply_s: float = 60.0,
    on_turn: Callable[[TurnRecord], None] | None = None,
    stop_when: Callable[[], bool] = lambda: False,
) -> list[TurnRecord]:
    """Goes through `plan`, or until `stop_when()` says so before a turn. A turn fails if no
    reply is heard within `reply_timeout_s` of the caller's end of speech, or if the reply is
    still going `max_reply_s` after it began."""
    for i, planned in enumerate(plan):
        if stop_when():
            break
        barging_in = planned.barge_in_after_s is not None and i > 0 and bool(tracker.turns)
        if barging_in:
            previous = tracker.turns[-1]
            await _until(line, lambda: previous.first_audible_at is not None, reply_timeout_s)
            await line.pause(planned.barge_in_after_s)
        else:
            await line.pause(planned.pause_before_s)
        u = planned.utterance
        turn = TurnRecord(caller, i, u.text, u.voice, u.seconds, transport=transport)
        end_at = await line.say(u.samples, u.rate, lambda now: tracker.begin(turn, now, barging_in=barging_in))
        tracker.speech_ended(turn, end_at)
        talks_over_reply = i + 1 < len(plan) and plan[i + 1].barge_in_after_s is not None
        if talks_over_reply:
            if on_turn:
                on_turn(turn)
            continue
        if not await _until(line, lambda: turn.first_audible_at is not None, reply_timeout_s):
            turn.error = f"no reply within {reply_timeout_s:.0f} s"
        elif not await _until(line, lambda: _reply_over(turn, reply_quiet_s), max_reply_s):
            turn.error = f"reply still going after {max_reply_s:.0f} s"
        if on_turn:
            on_turn(turn)
    return tracker.turns


def _reply_over(turn: TurnRecord, quiet_s: float) -> bool:
    return turn.last_audible_at is not None and time.time() - turn.last_audible_at > quiet_s


async def _until(line: Line, condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        await line.pause(POLL_S)
    return True


async def gather_calls(calls: list, *, stagger_s: float = 0.0) -> list:
    """Starts the call coroutines `stagger_s` apart (a ramp) and waits for all of them."""
    async def start(i: int, coro):
        await asyncio.sleep(i * stagger_s)
        return await coro
    return await asyncio.gather(*(start(i, c) for i, c in enumerate(calls)), return_exceptions=True)
