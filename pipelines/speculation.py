"""The guess made at a caller's pause, as bookkeeping (pure: pipelines/stt.py runs the guess
on the engine and hands its run in as an opaque handle).

When the VAD reports that the caller paused, the audio so far is transcribed at once, while
the VAD is still waiting out `stop_secs` to be sure the turn is over. If the turn does end with
no more speech, that transcript is used and the wait cost no ASR time; if the caller goes on,
it is dropped.

  - One guess per pause, and only while the caller is on a turn with audio buffered; a pause
    with nothing to guess from is left to the default pause (the judge is undecided).
  - The caller going on, a new turn, a long turn's cut or the call's end drops the guess
    (counted: `dropped`).
  - The turn's end takes it: it stands for the turn only if the turn's audio is what it saw plus
    silence (the VAD heard no speech since the pause, else the guess would have been dropped).
  - A finished guess that is plausible is read as the words so far (`read_guess`): retrieval
    starts on them, an eager reply is started from them, the pause judge hears them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeVar

from models.base import Transcript
from pipelines.transcript_check import is_plausible

Run = TypeVar("Run")  # the processor's handle on a guess being made (its task)


class PauseStep(Enum):
    GUESS = "guess"  # transcribe the turn so far now
    WAIT = "wait"  # a guess for this pause is already out: its verdict will come
    UNDECIDED = "undecided"  # nothing to guess from: the pause gets the default length


@dataclass(frozen=True)
class _Guess(Generic[Run]):
    audio_bytes: int  # how much of the turn's audio the guess covers
    run: Run


@dataclass(frozen=True)
class GuessReading:
    """What a finished guess is used for."""

    words: str | None  # the plausible guess (retrieval, an eager reply, the judge); None: implausible
    shown: str | None  # shown as the words so far (only with streaming partials on)


def read_guess(transcript: Transcript, *, partials_on: bool) -> GuessReading:
    """A guess is shown as the words so far while partials are on: partial passes wait behind it
    and are dropped when the turn ends, so on a loaded machine it is often the only pass that
    finishes while the caller is still on the turn."""
    if not is_plausible(transcript):
        return GuessReading(words=None, shown=None)
    return GuessReading(words=transcript.text, shown=transcript.text if partials_on else None)


class Speculation(Generic[Run]):
    def __init__(self) -> None:
        self._guess: _Guess[Run] | None = None
        self.used = 0  # guesses that stood for their turn, over the call
        self.dropped = 0  # guesses dropped because the caller went on (or the turn was cut)

    @property
    def pending(self) -> bool:
        return self._guess is not None

    def at_pause(self, *, speaking: bool, buffered: int) -> PauseStep:
        """The caller paused, `buffered` bytes of the turn held: what to do."""
        if self._guess is not None:
            return PauseStep.WAIT
        if not speaking or not buffered:
            return PauseStep.UNDECIDED
        return PauseStep.GUESS

    def started(self, audio_bytes: int, run: Run) -> None:
        """A guess on the turn's first `audio_bytes` is being made by `run`."""
        self._guess = _Guess(audio_bytes, run)

    def drop(self) -> Run | None:
        """The guess is missing words: returns its run (to be cancelled), if one was out."""
        guess, self._guess = self._guess, None
        if guess is None:
            return None
        self.dropped += 1
        return guess.run

    def take(self, audio_bytes: int) -> Run | None:
        """The turn ended with `audio_bytes` of audio: the run whose result may stand for it, or
        None. The guess is taken either way: one that saw more audio than the turn has is not of it."""
        guess, self._guess = self._guess, None
        return guess.run if guess is not None and audio_bytes >= guess.audio_bytes else None

    def stood_for_turn(self) -> None:
        self.used += 1
