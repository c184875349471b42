"""Streaming SNAC decode: which frames to decode, and which samples to emit, as codes arrive.

SNAC's decoder is non-causal: a frame's audio depends on the 3 frames before and after
it (measured by `receptive_field_frames`). Decoding a frame with all of that context
gives exactly the offline audio; less look-ahead gives earlier audio, slightly off.
The plan here:
- the first chunk (one frame) is emitted as soon as `first_lookahead` frames after it
  exist (low TTFB); later chunks grow along `chunk_schedule` (1, 2, then 4 frames), each
  emitted once `lookahead` frames after it exist. Growing slowly keeps the audio ahead of
  playback when tokens come no faster than real time; big chunks amortise the context;
- every window carries `left_context` frames before what it emits;
- at the end of the stream the rest is emitted with the true right edge (as offline);
- every frame is emitted exactly once, first to last.
Decoding several frames per window amortises the context: work per emitted frame is
(left + chunk + lookahead) / chunk frames, against 4 for the public sliding window.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from models.orpheus.tokens import FRAME_TOKENS, SAMPLES_PER_FRAME


@dataclass(frozen=True)
class StreamPlan:
    left_context: int = 2
    lookahead: int = 2
    first_lookahead: int = 1
    chunk_schedule: tuple[int, ...] = (1, 1, 2, 4)  # frames per chunk; the last repeats

    def __post_init__(self) -> None:
        if min(self.left_context, self.lookahead, self.first_lookahead) < 0 or not self.chunk_schedule \
                or min(self.chunk_schedule) < 1:
            raise ValueError(f"invalid stream plan {self}")

    def chunk(self, index: int) -> int:
        return self.chunk_schedule[min(index, len(self.chunk_schedule) - 1)]

    @property
    def tokens_to_first_audio(self) -> int:
        return (self.chunk(0) + self.first_lookahead) * FRAME_TOKENS


@dataclass(frozen=True)
class Window:
    start: int  # first frame decoded
    stop: int  # one past the last frame decoded
    emit_start: int  # first frame whose audio is emitted
    emit_stop: int

    @property
    def frames(self) -> int:
        return self.stop - self.start

    def emitted_samples(self, audio: np.ndarray) -> np.ndarray:
        """The emitted part of this window's decoded audio."""
        lo = (self.emit_start - self.start) * SAMPLES_PER_FRAME
        return audio[lo : lo + (self.emit_stop - self.emit_start) * SAMPLES_PER_FRAME]


class WindowPlanner:
    """Frame counts in, windows to decode out. Pure: no codes, no model."""

    def __init__(self, plan: StreamPlan) -> None:
        self.plan = plan
        self.available = 0
        self.emitted = 0
        self.finished = False
        self.decoded_frames = 0  # work done, for decode-frames-per-emitted-frame
        self.chunks = 0

    def add(self, frames: int) -> list[Window]:
        if self.finished:
            raise RuntimeError("frames added after the stream finished")
        self.available += frames
        return self._ready()

    def finish(self) -> list[Window]:
        self.finished = True
        return self._ready()

    def _ready(self) -> list[Window]:
        windows = []
        while self.emitted < self.available:
            chunk = self.plan.chunk(self.chunks)
            ahead = self.plan.first_lookahead if self.chunks == 0 else self.plan.lookahead
            if not self.finished and self.available < self.emitted + chunk + ahead:
                break
            emit_stop = min(self.emitted + chunk, self.available)
            window = Window(start=max(0, self.emitted - self.plan.left_context),
                            stop=min(self.available, emit_stop + ahead),
                            emit_start=self.emitted, emit_stop=emit_stop)
            windows.append(window)
            self.decoded_frames += window.frames
            self.emitted = emit_stop
            self.chunks += 1
        return windows


def stream_decode(frames: np.ndarray, plan: StreamPlan, decode: Callable[[np.ndarray, int], np.ndarray],
                  *, arrival: int = 1) -> tuple[np.ndarray, WindowPlanner]:
    """Decodes (n, 7) frames as a stream arriving `arrival` frames at a time (offline helper
    for tests and the bench). `decode(window_frames, first_frame_index) -> audio`."""
    planner = WindowPlanner(plan)
    pieces = []
    for start in range(0, len(frames), arrival):
        for w in planner.add(len(frames[start : start + arrival])):
            pieces.append(w.emitted_samples(decode(frames[w.start : w.stop], w.start)))
    for w in planner.finish():
        pieces.append(w.emitted_samples(decode(frames[w.start : w.stop], w.start)))
    return (np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)), planner
