"""A turn's transcript that did not come: how long it may take, and what the loss means
(pure; pipelines/stt.py waits on the engine and says what is decided here).

A turn's final transcript has a deadline (`TranscriptDeadline`, by the turn's length): a stuck
engine would otherwise leave the caller waiting on a reply that cannot come. When it is lost
(stuck past the deadline, or failed), the caller hears an apology and says it again; a long
turn's part (a cut while the caller talks on) is not apologised for at once: the caller is
still talking, and is told at the turn's end if need be.
"""

from __future__ import annotations

from dataclasses import dataclass

from models.errors import CadenceError, StalledError
from models.stalls import failure_kind
from pipelines.options import TranscriptDeadline


def deadline_s(deadline: TranscriptDeadline | None, audio_seconds: float) -> float | None:
    """How long the transcript of `audio_seconds` of the turn may take; None: no limit."""
    return deadline.seconds_for(audio_seconds) if deadline is not None else None


@dataclass(frozen=True)
class LostTranscript:
    kind: str  # for metrics (`CallEvents.model_failed`): stalled or error
    error: Exception  # what is reported: a timeout named as the stall it is
    known: bool  # one of our failures (a stall, a worker gone): one log line; else a bug, with its traceback
    apologise: bool  # the turn's end: the caller hears an apology; a part: not yet

    @property
    def consequence(self) -> str:
        """For the log line: what the caller hears of it."""
        return "the caller hears an apology" if self.apologise else \
            "the caller is told at the turn's end if need be"


def lost_transcript(exc: Exception, *, deadline_s: float | None, part: bool) -> LostTranscript:
    """`exc` ended the wait for a transcript (a TimeoutError: the deadline passed); `part`: the
    segment was a long turn's cut, not its end."""
    error = StalledError(f"no transcript within {deadline_s:.1f} s") if isinstance(exc, TimeoutError) else exc
    return LostTranscript(kind=failure_kind(exc), error=error, known=isinstance(error, CadenceError),
                          apologise=not part)
