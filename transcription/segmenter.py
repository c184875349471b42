"""Speech probabilities in, segments out: pure, fed a block of frames at a time.

Stretches of speech (frames above `threshold`, held through dips that stay above
`neg_threshold`, ended by `min_silence_s` of silence) are padded by `pad_s` and packed into
segments of at most `max_segment_s`: consecutive stretches share a segment while they fit,
so Whisper gets full windows (fewer passes, more context) and the silence between
segments is never transcribed. A stretch that would outgrow a segment on its own is cut at
its quietest frame in the segment's last part: at a pause, never at a fixed time inside a word.

Times are frame indices (32 ms frames); the caller turns them into samples and seconds.
Memory: the probabilities of the open segment only (at most `max_segment_s` of frames).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from transcription.options import SegmentingOptions

FRAME_SECONDS = 512 / 16_000


@dataclass(frozen=True)
class Segment:
    start: int  # first frame
    end: int  # one past the last frame
    probabilities: np.ndarray = field(repr=False, compare=False)  # per frame of the segment

    @property
    def start_s(self) -> float:
        return self.start * FRAME_SECONDS

    @property
    def end_s(self) -> float:
        return self.end * FRAME_SECONDS


class Segmenter:
    def __init__(self, options: SegmentingOptions = SegmentingOptions()) -> None:
        self._o = options
        frames_per_s = 1.0 / FRAME_SECONDS
        self._max = int(options.max_segment_s * frames_per_s)
        self._pad = int(round(options.pad_s * frames_per_s))
        self._min_silence = max(1, int(round(options.min_silence_s * frames_per_s)))
        self._min_speech = int(round(options.min_speech_s * frames_per_s))
        self._seen = 0  # frames fed so far
        self._speaking = False
        self._silence_run = 0
        self._stretch_start = 0  # first frame of the stretch of speech in progress
        self._last_speech = 0  # one past its last speech frame
        # The open segment [open_start, open_end): whole stretches, not yet emitted.
        self._open_start: int | None = None
        self._open_end = 0  # also: where the last emitted segment ended (segments never overlap)
        self._probs: list[float] = []  # every frame from `_probs_from` on
        self._probs_from = 0

    @property
    def keep_from(self) -> int:
        """No frame before this will be in a segment: its audio may be dropped."""
        return self._probs_from

    def feed(self, probabilities: Iterable[float]) -> list[Segment]:
        done: list[Segment] = []
        for p in probabilities:
            frame = self._seen
            self._seen += 1
            self._probs.append(float(p))
            if p >= self._o.threshold or (self._speaking and p >= self._o.neg_threshold):
                if not self._speaking:
                    self._speaking = True
                    self._stretch_start = frame
                self._silence_run = 0
                self._last_speech = frame + 1
                done += self._cut_if_too_long(frame + 1)
                continue
            if self._speaking:
                self._silence_run += 1
                if self._silence_run >= self._min_silence:
                    self._speaking = False
                    done += self._close_stretch()
            if not self._speaking:
                if self._open_start is not None and frame + 1 - self._open_start >= self._max:
                    done.append(self._emit(self._open_start, self._open_end))  # nothing more could join it
                if self._open_start is None:
                    self._forget_before(frame + 1 - self._pad)
        return done

    def finish(self) -> list[Segment]:
        """The segments still open at the end of the audio."""
        done = self._close_stretch() if self._speaking else []
        self._speaking = False
        if self._open_start is not None:
            done.append(self._emit(self._open_start, self._open_end))
        return done

    def _stretch_begins(self) -> int:
        return max(0, self._stretch_start - self._pad, self._open_end)

    def _close_stretch(self) -> list[Segment]:
        if self._last_speech - self._stretch_start < self._min_speech:
            return []  # a click, not speech
        start, end = self._stretch_begins(), min(self._seen, self._last_speech + self._pad)
        done: list[Segment] = []
        if self._open_start is not None and end - self._open_start > self._max:
            done.append(self._emit(self._open_start, self._open_end))
            start = self._stretch_begins()
        if self._open_start is None:
            self._open_start = start
        self._open_end = end
        return done

    def _cut_if_too_long(self, now: int) -> list[Segment]:
        """The open segment plus the stretch in progress has reached the maximum: the
        earlier stretches go out alone; a stretch that long on its own is cut at its
        quietest frame, and the rest of it goes on."""
        start = self._open_start if self._open_start is not None else self._stretch_begins()
        if now - start < self._max:
            return []
        if self._open_start is not None:
            return [self._emit(self._open_start, self._open_end)] + self._cut_if_too_long(now)
        search_from = start + int(self._max * self._o.cut_search_from)
        window = self._window(search_from, now)
        cut = search_from + int(np.argmin(window)) if window else now
        segment = self._emit(start, max(cut, start + 1))
        self._stretch_start = segment.end  # the rest of the stretch begins at the cut
        return [segment]

    def _emit(self, start: int, end: int) -> Segment:
        segment = Segment(start, end, np.asarray(self._window(start, end), np.float32))
        self._open_start = None
        self._open_end = end
        self._forget_before(end)
        return segment

    def _window(self, start: int, end: int) -> list[float]:
        return self._probs[max(0, start - self._probs_from): max(0, end - self._probs_from)]

    def _forget_before(self, frame: int) -> None:
        drop = frame - self._probs_from
        if drop > 0:
            del self._probs[:drop]
            self._probs_from = frame
