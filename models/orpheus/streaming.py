"""One utterance's codes in as they are generated, its audio out as soon as it is final.

Every frame goes once through the exact streaming decoder (`snac_stream`), whose audio
trails the codes by ~2.3 frames (SNAC's look-ahead). Three choices on top:
- head start: the first frame(s) are decoded on their own (one frame of look-ahead) and
  played while the exact stream catches up, which then continues where they end. It is
  taken only when, at the measured token speed and decode time, the exact stream will
  have the audio that follows before the head start has played out: one frame (14 tokens)
  when tokens come at ~2.5x real time or faster, two frames (21 tokens) from ~1.15x (a
  GPU token server at full load), none at real time.
- self-clocking steps: a step takes the frames that arrived while the last one ran, in
  the largest size from `step_sizes` that has arrived, so that steps of many streams
  share forward passes. Under light load each frame is decoded as it comes; under heavy load
  steps grow and the fixed cost per step is shared by more audio.
- a steady start: without a head start, the exact stream's first audio is held until it
  covers the longest wait ahead, predicted from the recent frame interval and decode time
  per frame: the next frame and its decode, or the last step, which also decodes the
  flush. Playback, once started, then does not stall; the first fragment alone (~0.7
  frame) would run dry before the next frame came at real time. The hold grows with the
  decoder's load: ~1.7 frames when idle, more when many streams share it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import numpy as np

from models.orpheus.codec import SnacCodec
from models.orpheus.snac_stream import frames_for_exact_audio_past
from models.orpheus.tokens import FRAME_TOKENS, SAMPLE_RATE, SAMPLES_PER_FRAME, FrameAssembler

FRAME_SECONDS = SAMPLES_PER_FRAME / SAMPLE_RATE


@dataclass(frozen=True)
class StreamPlan:
    head_start: bool = True
    head_start_lookahead: int = 1  # frames after the head start's last frame that its decode sees
    head_start_max_frames: int = 2  # frames a head start may cover (a longer one is taken at slower speeds)
    head_start_margin_s: float = 0.015  # spare time the predicted hand-over must leave (token jitter)
    step_sizes: tuple[int, ...] = (1, 2, 4)  # frames per step; the largest that has arrived is taken

    def __post_init__(self) -> None:
        if self.head_start_lookahead < 0 or self.head_start_max_frames < 1 or self.head_start_margin_s < 0 \
                or not self.step_sizes or min(self.step_sizes) != 1:
            raise ValueError(f"invalid stream plan {self}")

    @property
    def tokens_to_first_audio(self) -> int:
        """With the shortest head start (tokens much faster than real time)."""
        return (1 + self.head_start_lookahead) * FRAME_TOKENS

    def step_frames(self, waiting: int) -> int:
        return max(size for size in self.step_sizes if size <= waiting)


@dataclass
class StreamStats:
    """What one utterance cost: for tests, the bench and the metrics."""

    frames: int = 0
    decoded_frames: int = 0  # frames through the decoder: steps, head start, flush
    head_start: bool = False
    frames_for_first_audio: int | None = None  # frames the first audio waited for (tokens to first audio / 7)


async def stream_audio(tokens: AsyncIterator[list[int]], service: SnacCodec, plan: StreamPlan = StreamPlan(),
                       *, clock: Callable[[], float] = time.monotonic,
                       stats: StreamStats | None = None) -> AsyncIterator[np.ndarray]:
    """Token chunks in, float audio chunks out: every frame exactly once, in order.
    Closing the generator (barge-in) stops the token source too."""
    stats = stats if stats is not None else StreamStats()
    arrivals: asyncio.Queue = asyncio.Queue()  # unbounded: one utterance's frames at most
    reader = asyncio.create_task(_read_frames(tokens, arrivals, clock), name="orpheus-frames")
    state = service.open_stream()
    frames: list[np.ndarray] = []  # every frame so far (the head start decodes the first ones)
    arrived_at: list[float] = []
    stepped = 0
    decided = not plan.head_start
    ended = False
    held: list[np.ndarray] = []  # exact audio kept back until playback can start without a stall
    started = False
    frame_seconds = step_seconds = 0.0
    try:
        while True:
            if stepped == len(frames) and not ended:
                ended = _take(await arrivals.get(), frames, arrived_at)
            while not arrivals.empty() and not ended:
                ended = _take(arrivals.get_nowait(), frames, arrived_at)
            if not decided:
                # The shortest head start that hands over seamlessly; none once the exact stream
                # has spoken, the utterance ended, or even the longest one would not hand over.
                available = min(len(frames) - plan.head_start_lookahead, plan.head_start_max_frames)
                covered = next((h for h in range(1, available + 1) if head_start_is_seamless(
                    plan, h, _frame_interval(arrived_at), step_seconds, service.delay_samples)), None)
                exact_spoke = stepped >= frames_for_exact_audio_past(0, service.delay_samples)
                if covered is not None and not exact_spoke:
                    decided = True
                    window = np.stack(frames[: covered + plan.head_start_lookahead])
                    audio = await service.decode(window, 0, stream=state)
                    state.next_sample = covered * SAMPLES_PER_FRAME
                    stats.decoded_frames += len(window)
                    stats.head_start = started = True
                    stats.frames_for_first_audio = len(window)
                    yield audio[: state.next_sample]
                elif ended or available >= plan.head_start_max_frames or exact_spoke:
                    decided = True  # the steady start
            if stepped < len(frames):
                n = plan.step_frames(len(frames) - stepped)
                # The last frames and the flush go in one pass: a stream's end waits no extra round.
                final = ended and stepped + n == len(frames)
                began = clock()
                audio = await service.step(state, np.stack(frames[stepped : stepped + n]), final=final)
                step_seconds = clock() - began
                frame_seconds = step_seconds / n  # decode wall time per frame, at the current load
                stepped += n
                stats.decoded_frames += n + (service.flush_frames if final else 0)
            elif ended:  # nothing fed (an empty utterance); or frames ran out with no end yet seen
                final = True
                audio = await service.step(state, None) if stepped else np.zeros(0, np.float32)
                stats.decoded_frames += service.flush_frames if stepped else 0
            else:
                continue
            if final:
                stats.frames = stepped
                audio = np.concatenate(held + [audio])
                if not started:
                    stats.frames_for_first_audio = stepped
                if len(audio):
                    yield audio
                return
            if not started and len(audio):
                held.append(audio)
                if sum(map(len, held)) / SAMPLE_RATE < _start_buffer(arrived_at, frame_seconds, service.flush_frames):
                    continue
                audio, held, started = np.concatenate(held), [], True
                stats.frames_for_first_audio = stepped
            if len(audio):
                yield audio
    finally:
        service.release(state)
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        if hasattr(tokens, "aclose"):
            await tokens.aclose()  # barge-in: stop the generation too, not just the decoding


async def _read_frames(tokens: AsyncIterator[list[int]], arrivals: asyncio.Queue, clock: Callable[[], float]) -> None:
    """Whole frames onto the queue as tokens complete them; then None, or the error."""
    assembler = FrameAssembler()
    try:
        async for chunk in tokens:
            done = assembler.push(chunk)
            if len(done):
                arrivals.put_nowait((done, clock()))
            if assembler.ended:
                break
        arrivals.put_nowait(None)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a broken source or a misaligned token: raised in the consumer
        arrivals.put_nowait(exc)


def _take(item, frames: list[np.ndarray], arrived_at: list[float]) -> bool:
    """Adds an arrival; True at the end of the stream."""
    if item is None:
        return True
    if isinstance(item, Exception):
        raise item
    done, at = item
    frames.extend(done)
    arrived_at.extend([at] * len(done))
    return False


def _start_buffer(arrived_at: list[float], frame_seconds: float, flush_frames: float) -> float:
    """Seconds of audio to hold before playback starts: enough to cover the wait for the
    next step (the next frame, then its decode), and the stream's last step, which also
    decodes the flush (under load, the longest wait of the stream)."""
    return max(_frame_interval(arrived_at) + frame_seconds, frame_seconds * (1 + flush_frames))


def _frame_interval(arrived_at: list[float], recent: int = 4) -> float:
    """Seconds between frames lately (frames come in bursts: averaged over a few)."""
    window = arrived_at[-recent:]
    return (window[-1] - window[0]) / (len(window) - 1) if len(window) > 1 else FRAME_SECONDS


def head_start_is_seamless(plan: StreamPlan, frames_covered: int, frame_interval: float, step_seconds: float,
                           delay_samples: int) -> bool:
    """Would a head start over `frames_covered` frames (decoded now, with the plan's
    look-ahead) play out only after the exact stream has the audio that follows it?
    The exact stream needs the frames up to `delay_samples` past the head start's end;
    they come `frame_interval` apart, then take about `step_seconds` to decode."""
    frames_needed = frames_for_exact_audio_past(frames_covered * SAMPLES_PER_FRAME, delay_samples)
    frames_to_wait = frames_needed - (frames_covered + plan.head_start_lookahead)
    wait = frames_to_wait * frame_interval + step_seconds + plan.head_start_margin_s
    return wait <= frames_covered * FRAME_SECONDS
