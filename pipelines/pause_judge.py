"""At each pause of the caller, how long a silence ends their turn.

The STT calls `listen` when the caller pauses (it starts the speculative transcript at the
same moment), and `decide` with that transcript. The voice model runs beside Whisper, so
judging adds no wait of its own; the verdict (turn_end.judge_pause) goes to the VAD, which
ends the turn at once if the pause is already that long. Until a verdict comes, the VAD
allows the longest pause: the transcript is needed to answer anyway.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from models.base import TurnEndEngine
from models.errors import CadenceError
from pipelines.turn_end import PauseVerdict, TurnEndOptions, judge_pause

log = logging.getLogger(__name__)


class PauseAllowance(Protocol):
    """Where a verdict goes: the VAD, which ends the turn after this much of the current pause."""

    def allow_pause(self, seconds: float) -> None: ...


class PauseJudge:
    def __init__(self, *, options: TurnEndOptions, default_pause_s: float, allowance: PauseAllowance,
                 engine: TurnEndEngine | None = None,
                 on_verdict: Callable[[PauseVerdict], None] = lambda verdict: None) -> None:
        """`default_pause_s`: the agent's own pause, for turns neither judge is sure of.
        `allowance`: the VAD, told each pause's length. `engine`: the voice model (None: the
        words alone decide, and never shorten a pause)."""
        self._options = options
        self._default_pause_s = default_pause_s
        self._allowance = allowance
        self._engine = engine
        self._on_verdict = on_verdict

    def listen(self, pcm16: bytes) -> asyncio.Task | None:
        """Starts the voice model on the turn so far; the task gives its probability or None."""
        if self._engine is None:
            return None
        task = asyncio.get_running_loop().create_task(self._probability(pcm16), name="smart-turn")
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return task

    async def _probability(self, pcm16: bytes) -> float | None:
        try:
            return await self._engine.probability_complete(pcm16)
        except CadenceError as exc:  # busy: the words decide alone this time
            log.debug("turn-end model skipped: %s", exc)
            return None

    async def decide(self, words: str | None, voice: asyncio.Task | None) -> PauseVerdict:
        """The verdict for this pause (not yet applied). `words`: the transcript so far, None
        if there is none worth reading."""
        probability = await voice if voice is not None else None
        return judge_pause(words, probability, default_pause_s=self._default_pause_s, options=self._options)

    def apply(self, verdict: PauseVerdict) -> None:
        self._on_verdict(verdict)
        self._allowance.allow_pause(verdict.pause_s)

    def undecided(self) -> None:
        """No verdict will come for this pause (no transcript): the agent's pause applies."""
        self._allowance.allow_pause(self._default_pause_s)
