"""What to transcribe of the caller's turn, and when: the STT's bookkeeping, apart from its audio
and tasks (pure: fed the turn's length in bytes, step by step; pipelines/stt.py does the I/O).

  - A streaming partial is due every `partial_every_bytes` of new speech, one pass at a time,
    never during a pause (the turn may be ending: the final must find the engine free), and
    not past one window of audio.
  - A turn longer than one window (`max_segment_bytes`) is cut while the caller speaks on;
    the processor picks the cut (its quietest moment) and says how much audio is left.
  - Each segment handed to the engine is queued here: whether it ends the turn or is a cut,
    and the words streaming partials had settled, which its transcript must begin with
    (LocalAgreement-2, pipelines/local_agreement.py).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from enum import Enum

from pipelines.local_agreement import LocalAgreement


class AudioStep(Enum):
    CUT = "cut"  # the turn reached one window: cut it now
    PARTIAL = "partial"  # start a partial pass on the turn so far


@dataclass(frozen=True)
class QueuedSegment:
    settled: str  # the words streaming partials had settled, which its transcript must begin with
    whole_turn_end: bool  # the end of a turn (a guess made at its last pause may stand for it), not a cut


_TURN_END_UNQUEUED = QueuedSegment("", whole_turn_end=True)  # a segment nobody queued (pipecat's own)


class TranscriptPlan:
    def __init__(self, *, max_segment_bytes: int, partial_every_bytes: int) -> None:
        """`partial_every_bytes`: new speech between partial passes (0: no partials)."""
        self.max_segment_bytes = max_segment_bytes
        self.partial_every_bytes = partial_every_bytes
        self.paused = False  # the VAD heard a pause: the turn may be ending, the final comes first
        self.cuts = 0  # long turns cut, over the call
        self._agreement = LocalAgreement()
        self._partial_from = 0  # the turn's length when the last partial pass started
        self._queued: collections.deque[QueuedSegment] = collections.deque()  # one per segment queued

    @property
    def settled(self) -> str:
        """The words of this turn two partial passes agreed on."""
        return self._agreement.committed_text

    def turn_starting(self) -> None:
        """The caller started a turn: nothing of the last one carries over."""
        self._agreement.reset()
        self.paused = False

    def partials_from(self, buffered: int) -> None:
        """The first partial waits for `partial_every_bytes` past `buffered` (the audio from
        before the VAD spoke, mostly silence: a fraction of a word turns into a guess)."""
        self._partial_from = buffered

    def audio(self, buffered: int, *, speaking: bool, partial_running: bool) -> AudioStep | None:
        """A frame of audio came; the turn holds `buffered` bytes. What it calls for, if anything."""
        if not speaking or self.paused:
            return None
        if buffered >= self.max_segment_bytes:
            return AudioStep.CUT
        if (self.partial_every_bytes and not partial_running
                and buffered - self._partial_from >= self.partial_every_bytes):
            self._partial_from = buffered
            return AudioStep.PARTIAL
        return None

    def heard(self, text: str) -> str:
        """A partial pass's plausible text; returns the partial to show (settled + tentative)."""
        self._agreement.update(text)
        return self._agreement.text

    def cut(self, remaining: int) -> None:
        """The turn was cut, `remaining` bytes left buffered. No settled words are forced on the
        part: partials saw the audio past the cut too, and words they settled there would be
        transcribed twice (once in the part, again in the rest). Partials start afresh on the rest."""
        self._queued.append(QueuedSegment("", whole_turn_end=False))
        self._agreement.reset()
        self._partial_from = remaining
        self.cuts += 1

    def needs_cut_at_end(self, buffered: int) -> bool:
        """The turn grew past one window during a pause (no cut then): cut before it ends."""
        return buffered > self.max_segment_bytes

    def turn_ended(self) -> None:
        """The VAD ended the turn: its last segment is queued with the words settled so far."""
        self._queued.append(QueuedSegment(self.settled, whole_turn_end=True))
        self._agreement.reset()

    @property
    def next_is_part(self) -> bool:
        """The next segment the engine takes is a cut of a turn that goes on."""
        return bool(self._queued) and not self._queued[0].whole_turn_end

    def next_segment(self) -> QueuedSegment:
        """The segment the engine takes now, in the order they were queued."""
        return self._queued.popleft() if self._queued else _TURN_END_UNQUEUED
