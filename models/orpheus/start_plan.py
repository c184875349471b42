"""When a streamed utterance's audio starts, and what is decoded when: a pure core, no I/O.

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

`StartPlanner` makes these choices for one utterance. It is told what happened (frames
arrived at a clock reading, the stream ended, a decode ran from one reading to another and
gave so many samples) and answers what to do next (a head start to decode now, the next
step, whether to play the audio held so far). `streaming.stream_audio` does the I/O.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from models.orpheus.tokens import FRAME_TOKENS, SAMPLE_RATE, SAMPLES_PER_FRAME

FRAME_SECONDS = SAMPLES_PER_FRAME / SAMPLE_RATE
RECENT_ARRIVALS = 4  # frames the frame interval is averaged over (frames come in bursts)


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


@dataclass(frozen=True)
class HeadStart:
    """Decode frames [0, window_frames) on their own now and play the audio of the first
    `frames_covered`; the exact stream then starts at `samples`."""

    frames_covered: int
    window_frames: int  # frames_covered plus the plan's look-ahead

    @property
    def samples(self) -> int:
        return self.frames_covered * SAMPLES_PER_FRAME


@dataclass(frozen=True)
class Step:
    """Feed frames [first, first + count) to the exact stream; a `final` step also flushes
    it. A final step of no frames is the flush alone, or nothing at all when no frame ever
    came (an empty utterance)."""

    first: int
    count: int
    final: bool

    @property
    def end(self) -> int:
        return self.first + self.count


def frames_for_exact_audio_past(sample: int, delay_samples: int) -> int:
    """Frames fed before the exact stream's audio reaches past `sample` (it trails the
    codes by `delay_samples`)."""
    return (sample + delay_samples) // SAMPLES_PER_FRAME + 1


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


class StartPlanner:
    """One utterance's decisions, fed step by step. Per round: report the frames that came
    (`frames_arrived`, `end_of_stream`), ask `head_start()` (decode it, then report it with
    `head_start_decoded`), ask `next_step()` and report its decode with `decoded()`, which
    says whether the audio held so far is to be played. Until `done`."""

    def __init__(self, plan: StreamPlan, delay_samples: int, flush_frames: float,
                 stats: StreamStats | None = None) -> None:
        self.plan, self.stats = plan, stats if stats is not None else StreamStats()
        self._delay_samples, self._flush_frames = delay_samples, flush_frames
        self._arrived = self._stepped = 0
        self._recent_arrivals: deque[float] = deque(maxlen=RECENT_ARRIVALS)
        self._ended = self.done = False
        self._deciding = plan.head_start  # the head start is still to be chosen or ruled out
        self._playing = False  # audio has gone out: nothing is held any more
        self._held_samples = 0
        self._step_seconds = self._frame_seconds = 0.0  # the last step's decode time, in all and per frame

    # --- what happened ---------------------------------------------------------------------

    def frames_arrived(self, count: int, at: float) -> None:
        self._arrived += count
        self._recent_arrivals.extend([at] * count)

    def end_of_stream(self) -> None:
        self._ended = True

    @property
    def ended(self) -> bool:
        return self._ended

    @property
    def needs_frames(self) -> bool:
        """Every frame that came is decoded and more are to come: wait for the next."""
        return self._stepped == self._arrived and not self._ended

    @property
    def frame_interval(self) -> float:
        """Seconds between frames lately (frames come in bursts: averaged over a few)."""
        window = self._recent_arrivals
        return (window[-1] - window[0]) / (len(window) - 1) if len(window) > 1 else FRAME_SECONDS

    # --- what to do ------------------------------------------------------------------------

    def head_start(self) -> HeadStart | None:
        """The shortest head start that hands over seamlessly, to decode now; none while it
        may still come, and none for good once the exact stream has spoken, the utterance
        ended, or even the longest one would not hand over."""
        if not self._deciding:
            return None
        plan = self.plan
        available = min(self._arrived - plan.head_start_lookahead, plan.head_start_max_frames)
        covered = next((h for h in range(1, available + 1) if head_start_is_seamless(
            plan, h, self.frame_interval, self._step_seconds, self._delay_samples)), None)
        exact_spoke = self._stepped >= frames_for_exact_audio_past(0, self._delay_samples)
        if covered is not None and not exact_spoke:
            self._deciding = False
            return HeadStart(covered, covered + plan.head_start_lookahead)
        if self._ended or available >= plan.head_start_max_frames or exact_spoke:
            self._deciding = False  # the steady start
        return None

    def head_start_decoded(self, head: HeadStart) -> None:
        """Its audio is going out: playback has started."""
        self._playing = True
        self.stats.decoded_frames += head.window_frames
        self.stats.head_start = True
        self.stats.frames_for_first_audio = head.window_frames

    def next_step(self) -> Step | None:
        """The frames waiting, in the largest step size that has arrived; the last frames
        and the flush go in one pass (a stream's end waits no extra round). None: no frame
        waits and the stream goes on (wait for frames)."""
        waiting = self._arrived - self._stepped
        if waiting:
            count = self.plan.step_frames(waiting)
            return Step(self._stepped, count, final=self._ended and count == waiting)
        return Step(self._stepped, 0, final=True) if self._ended else None

    def decoded(self, step: Step, began_at: float, finished_at: float, samples: int) -> bool:
        """`step` ran from one clock reading to the other and gave `samples` of exact audio.
        True: play everything held so far (this step's audio included); False: hold it."""
        if step.count:
            self._step_seconds = finished_at - began_at
            self._frame_seconds = self._step_seconds / step.count  # decode wall time per frame, at the current load
            self._stepped += step.count
        # The flush runs through the decoder with the final step; a lone one only if a frame was fed.
        self.stats.decoded_frames += step.count + (self._flush_frames if step.final and self._stepped else 0)
        if step.final:
            self.done = True
            self.stats.frames = self._stepped
            if not self._playing:
                self.stats.frames_for_first_audio = self._stepped
            return True
        if self._playing or not samples:
            return self._playing
        self._held_samples += samples
        if self._held_samples / SAMPLE_RATE < self.start_buffer:
            return False
        self._playing, self._held_samples = True, 0
        self.stats.frames_for_first_audio = self._stepped
        return True

    @property
    def start_buffer(self) -> float:
        """Seconds of audio to hold before playback starts: enough to cover the wait for the
        next step (the next frame, then its decode), and the stream's last step, which also
        decodes the flush (under load, the longest wait of the stream)."""
        return max(self.frame_interval + self._frame_seconds, self._frame_seconds * (1 + self._flush_frames))
