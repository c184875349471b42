"""The start planning of a streamed Orpheus utterance (`StartPlanner`), driven without a codec,
an event loop or a real clock: frames arrive on a fake timeline, decodes take scripted
times, and a model of the exact stream says how much audio each step makes final."""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections import deque
from dataclasses import dataclass, field

import pytest

from models.orpheus.start_plan import (
    FRAME_SECONDS, HeadStart, StartPlanner, Step, StreamPlan, StreamStats, frames_for_exact_audio_past,
    head_start_is_seamless)
from models.orpheus.tokens import SAMPLE_RATE, SAMPLES_PER_FRAME

DELAY = 4757  # SNAC 24 kHz's look-ahead in samples (~2.3 frames), as the real streamer measures it
FLUSH = 2.5  # frames' worth of zeros its flush decodes
EXACT_START = frames_for_exact_audio_past(0, DELAY)  # 3: frames fed before the exact stream's first sample


def planner(plan: StreamPlan = StreamPlan(), stats: StreamStats | None = None) -> StartPlanner:
    return StartPlanner(plan, DELAY, FLUSH, stats)


class ExactStream:
    """How much audio the exact streaming decoder makes final: it trails the frames fed by
    DELAY samples until the final step, and skips what a head start already played."""

    def __init__(self) -> None:
        self.fed = self.next_sample = 0

    def step(self, step: Step) -> int:
        self.fed += step.count
        reach = self.fed * SAMPLES_PER_FRAME if step.final else max(0, self.fed * SAMPLES_PER_FRAME - DELAY)
        out = max(0, reach - self.next_sample)
        self.next_sample = max(self.next_sample, reach)
        return out


@dataclass
class Run:
    """What `stream_audio` would have done: each decode and each piece of audio played, on
    the fake timeline."""

    steps: list[Step] = field(default_factory=list)
    head: HeadStart | None = None
    played: list[tuple[float, int, int]] = field(default_factory=list)  # (when, samples, frames stepped by then)
    stats: StreamStats = field(default_factory=StreamStats)

    @property
    def frames_for_first_audio(self) -> int:
        return self.head.window_frames if self.head else self.played[0][2]


def simulate(frames: int, interval: float, step_s: float, plan: StreamPlan = StreamPlan(), *,
             burst: int = 1, end_after_s: float = 0.0) -> Run:
    """Drive a planner as `stream_audio` does: `frames` arrive `burst` at a time, a burst
    every `burst * interval` seconds; every decode (the head start's too) takes `step_s`; the
    end of the stream is seen `end_after_s` after the last frames."""
    arrivals = deque(((i + 1) * interval * burst, min(burst, frames - i * burst))
                     for i in range((frames + burst - 1) // burst))
    ended_at = (arrivals[-1][0] if arrivals else 0.0) + end_after_s
    run, exact = Run(), ExactStream()
    core = planner(plan, run.stats)
    now, held, stepped = 0.0, 0, 0

    def take_one() -> None:
        if arrivals:
            at, count = arrivals.popleft()
            core.frames_arrived(count, at)
        else:
            core.end_of_stream()

    def next_at() -> float:
        return arrivals[0][0] if arrivals else ended_at

    while not core.done:
        if core.needs_frames:
            now = max(now, next_at())
            take_one()
        while not core.ended and next_at() <= now:
            take_one()
        if (head := core.head_start()) is not None:
            assert run.head is None and not run.played  # once, and before any exact audio
            now += step_s
            exact.next_sample = head.samples
            core.head_start_decoded(head)
            run.head = head
            run.played.append((now, head.samples, stepped))
        step = core.next_step()
        assert step is not None  # after the intake there is always a step: frames waiting, or the end
        began, now = now, now + step_s
        run.steps.append(step)
        stepped += step.count
        samples = exact.step(step)
        held += samples
        if core.decoded(step, began, now, samples):
            run.played.append((now, held, stepped))
            held = 0
    assert held == 0  # nothing left behind
    return run


def stalls(run: Run) -> list[float]:
    """How long playback, started at its first audio, would run dry before each late piece."""
    gaps, runs_dry_at = [], None
    for at, samples, _ in run.played:
        if not samples:
            continue
        if runs_dry_at is not None and at > runs_dry_at + 1e-9:
            gaps.append(at - runs_dry_at)
        runs_dry_at = max(runs_dry_at if runs_dry_at is not None else at, at) + samples / SAMPLE_RATE
    return gaps


# --- the whole utterance, whatever the speeds ---------------------------------------------------

SPEEDS = (0.8, 1.0, 1.25, 2.0, 3.0, 10.0)  # token speed, in multiples of real time
STEP_TIMES = (0.0, 0.005, 0.02, 0.05, 0.09)  # one decode step: a GPU at rest ... a busy CPU
PLANS = (StreamPlan(), StreamPlan(head_start=False), StreamPlan(step_sizes=(1,)),
         StreamPlan(head_start_max_frames=4, head_start_lookahead=2))


@pytest.mark.parametrize("plan", PLANS)
def test_every_frame_is_decoded_once_in_order_and_every_sample_played_once(plan):
    for speed, step_s, frames, burst, end_after in itertools.product(
            SPEEDS, STEP_TIMES, (0, 1, 2, 3, 4, 7, 20), (1, 3), (0.0, 0.3)):
        run = simulate(frames, FRAME_SECONDS / speed, step_s, plan, burst=burst, end_after_s=end_after)
        case = (speed, step_s, frames, burst, end_after)
        firsts = list(itertools.accumulate([s.count for s in run.steps], initial=0))[:-1]
        assert [s.first for s in run.steps] == firsts, case
        assert sum(s.count for s in run.steps) == frames, case
        assert [s.final for s in run.steps] == [False] * (len(run.steps) - 1) + [True], case
        assert all(s.count in plan.step_sizes or (s.final and not s.count) for s in run.steps), case
        assert sum(samples for _, samples, _ in run.played) == frames * SAMPLES_PER_FRAME, case
        head = run.head.window_frames if run.head else 0
        assert run.stats.frames == frames and run.stats.head_start == (run.head is not None), case
        assert run.stats.decoded_frames == frames + head + (FLUSH if frames else 0), case
        assert run.stats.frames_for_first_audio == run.frames_for_first_audio, case
        if run.head is not None:
            assert plan.head_start and run.head.window_frames == run.head.frames_covered + plan.head_start_lookahead
            assert 1 <= run.head.frames_covered <= plan.head_start_max_frames, case


@pytest.mark.parametrize("plan", PLANS)
def test_playback_never_stalls_where_tokens_and_decoder_keep_up_with_real_time(plan):
    # Frames one at a time. (Frames in bursts of three read as a zero frame interval until the
    # second burst: the start is then planned too short and playback stalls once, ~30-200 ms.)
    for speed, step_s in itertools.product(SPEEDS, STEP_TIMES):
        if speed >= 1.0 and step_s <= FRAME_SECONDS / speed:
            run = simulate(20, FRAME_SECONDS / speed, step_s, plan)
            assert stalls(run) == [], (speed, step_s)
    assert stalls(simulate(20, FRAME_SECONDS * 1.25, 0.005, plan))  # slower than real time: no plan helps


@pytest.mark.parametrize("speed, step_s, frames_for_first_audio", [
    (10.0, 0.005, 2),  # fast tokens: a one-frame head start, 14 tokens
    (3.0, 0.005, 2),
    (1.25, 0.005, 3),  # a loaded GPU token server: two frames, 21 tokens
    (1.25, 0.05, None),  # ... unless the decoder is slow to follow
    (1.0, 0.0, None),  # real time: the exact stream could never catch up in time
])
def test_the_head_start_is_the_shortest_that_hands_over_at_the_measured_speeds(speed, step_s, frames_for_first_audio):
    run = simulate(20, FRAME_SECONDS / speed, step_s)
    assert run.stats.head_start == (frames_for_first_audio is not None)
    if frames_for_first_audio is not None:
        assert run.stats.frames_for_first_audio == frames_for_first_audio
        assert run.played[0][1] == (frames_for_first_audio - 1) * SAMPLES_PER_FRAME  # the frames it covers


def test_the_head_start_waits_for_its_frames_and_is_chosen_once():
    core, interval = planner(), FRAME_SECONDS / 1.25
    core.frames_arrived(1, interval)
    assert core.head_start() is None  # its look-ahead frame has not come
    _step(core, interval, 0.005)
    core.frames_arrived(1, 2 * interval)
    assert core.head_start() is None  # one frame of head start would not hand over at this speed; two might
    _step(core, 2 * interval, 0.005)
    core.frames_arrived(1, 3 * interval)
    assert core.head_start() == HeadStart(frames_covered=2, window_frames=3)
    assert core.head_start() is None  # chosen: never again
    core.head_start_decoded(HeadStart(2, 3))
    assert core.stats.head_start and core.stats.frames_for_first_audio == 3 and core.stats.decoded_frames == 5


def test_a_head_start_is_ruled_out_once_the_exact_stream_has_spoken():
    plan = StreamPlan(head_start_max_frames=10)
    run = simulate(20, FRAME_SECONDS, 0.0, plan)
    # Four frames in, a three-frame head start would hand over; but three frames were stepped by then.
    assert head_start_is_seamless(plan, 3, FRAME_SECONDS, 0.0, DELAY)
    assert run.head is None and run.stats.frames_for_first_audio >= EXACT_START


def test_the_longest_head_start_failing_rules_it_out_for_good():
    core = planner()
    for i in range(3):  # real time: neither one frame nor two would hand over
        core.frames_arrived(1, (i + 1) * FRAME_SECONDS)
        assert core.head_start() is None
    core.frames_arrived(4, 4 * FRAME_SECONDS)  # a burst: now one frame would hand over, but it was decided
    assert core.head_start() is None


def test_the_end_of_the_stream_settles_the_start():
    core = planner(StreamPlan(head_start_max_frames=4, step_sizes=(1,)))
    core.frames_arrived(1, 0.0)
    assert core.head_start() is None
    _step(core, 0.0, 0.2)  # a slow first step
    core.frames_arrived(2, 0.01)
    core.end_of_stream()
    assert core.head_start() is None  # at a 200 ms step, no head start hands over; and no frame is to come
    _step(core, 0.3, 0.001)
    # A fast step now would make a one-frame head start look seamless: too late, it was decided.
    assert head_start_is_seamless(core.plan, 1, core.frame_interval, 0.001, DELAY)
    assert core.head_start() is None


def test_an_utterance_too_short_for_a_head_start_plays_whole_at_its_end():
    run = simulate(1, FRAME_SECONDS / 10, 0.005)
    assert run.head is None and run.steps == [Step(0, 1, final=True)]
    assert run.played == [(pytest.approx(run.played[0][0]), SAMPLES_PER_FRAME, 1)]
    assert run.stats.frames_for_first_audio == 1 and run.stats.decoded_frames == 1 + FLUSH


def test_a_plan_without_head_start_never_offers_one():
    core = planner(StreamPlan(head_start=False))
    core.frames_arrived(5, 0.0)
    assert core.head_start() is None


def test_steps_take_the_largest_size_that_has_arrived_and_the_end_goes_with_the_last():
    core = planner(StreamPlan(head_start=False))
    core.frames_arrived(3, 0.0)
    assert core.next_step() == Step(0, 2, final=False)
    _step(core, 0.0, 0.01)
    assert core.next_step() == Step(2, 1, final=False)
    core.frames_arrived(2, 0.1)
    core.end_of_stream()
    assert core.next_step() == Step(2, 2, final=False)  # 3 waiting: a step of 2, the last frame then the end
    _step(core, 0.1, 0.01)
    assert core.next_step() == Step(4, 1, final=True)


def test_the_end_seen_after_the_last_step_is_a_lone_flush():
    core = planner(StreamPlan(head_start=False))
    core.frames_arrived(1, 0.0)
    _step(core, 0.0, 0.01)
    assert core.needs_frames and core.next_step() is None  # nothing to decode: wait for frames
    core.end_of_stream()
    assert not core.needs_frames and core.next_step() == Step(1, 0, final=True)
    assert core.decoded(Step(1, 0, final=True), 0.5, 0.6, 2000)
    assert core.done and core.stats.decoded_frames == 1 + FLUSH and core.stats.frames == 1


def test_an_empty_utterance_decodes_nothing():
    core = planner()
    assert core.needs_frames and core.next_step() is None
    core.end_of_stream()
    assert core.head_start() is None and core.next_step() == Step(0, 0, final=True)
    assert core.decoded(Step(0, 0, final=True), 0.0, 0.0, 0) and core.done
    assert core.stats == StreamStats(frames=0, decoded_frames=0, head_start=False, frames_for_first_audio=0)


def test_the_steady_start_holds_the_exact_audio_until_it_covers_the_wait_ahead():
    core = planner(StreamPlan(head_start=False))
    released = []
    for i in range(1, 6):
        core.frames_arrived(1, i * FRAME_SECONDS)
        samples = max(0, min(SAMPLES_PER_FRAME, i * SAMPLES_PER_FRAME - DELAY))  # 0, 0, 1387, 2048, 2048
        released.append(core.decoded(core.next_step(), i * FRAME_SECONDS, i * FRAME_SECONDS + 0.01, samples))
    # 1387 samples (58 ms) do not cover the next frame and its decode (85 + 10 ms); 3435 (143 ms) do.
    assert core.start_buffer == pytest.approx(FRAME_SECONDS + 0.01)
    assert released == [False, False, False, True, True]
    assert core.stats.frames_for_first_audio == 4
    assert core.decoded(Step(5, 0, final=False), 0.0, 0.0, 0)  # once playing, everything goes out


def test_the_start_buffer_grows_with_the_decode_time_per_frame():
    core = planner(StreamPlan(head_start=False))
    core.frames_arrived(4, 0.0)
    core.decoded(core.next_step(), 1.0, 1.16, 0)  # 4 frames in 160 ms: 40 ms a frame
    # the next frame and its decode (0 + 40 ms: they came at once) against the flush step: 40 ms x 3.5
    assert core.start_buffer == pytest.approx(0.04 * (1 + FLUSH))


def test_the_frame_interval_is_averaged_over_the_last_four_frames():
    core = planner()
    assert core.frame_interval == FRAME_SECONDS  # nothing measured yet: assume real time
    core.frames_arrived(1, 1.0)
    assert core.frame_interval == FRAME_SECONDS
    core.frames_arrived(2, 1.1)
    assert core.frame_interval == pytest.approx(0.05)  # 1.0, 1.1, 1.1
    core.frames_arrived(1, 1.4)
    core.frames_arrived(1, 1.5)
    assert core.frame_interval == pytest.approx((1.5 - 1.1) / 3)  # 1.1, 1.1, 1.4, 1.5


def test_the_core_imports_neither_torch_nor_asyncio():
    code = ("import sys, models.orpheus.start_plan; "
            "print(sorted(m for m in ('torch', 'asyncio', 'snac') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def _step(core: StartPlanner, at: float, seconds: float, samples: int = 0) -> bool:
    return core.decoded(core.next_step(), at, at + seconds, samples)
