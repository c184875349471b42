"""The segmenter on made-up speech probabilities: where segments start, end and are cut."""

from __future__ import annotations

import numpy as np
import pytest

from transcription.options import SegmentingOptions
from transcription.segmenter import FRAME_SECONDS, Segmenter

FPS = 1 / FRAME_SECONDS  # 31.25 frames a second


def frames(seconds: float) -> int:
    return int(round(seconds * FPS))


def speech(seconds: float, p: float = 0.9) -> list[float]:
    return [p] * frames(seconds)


def silence(seconds: float) -> list[float]:
    return [0.02] * frames(seconds)


def run(probs: list[float], options: SegmentingOptions = SegmentingOptions(), block: int = 37):
    segmenter, out = Segmenter(options), []
    for i in range(0, len(probs), block):  # blocks of an odd size: no boundary may matter
        out += segmenter.feed(probs[i : i + block])
    return out + segmenter.finish()


def test_silence_gives_nothing_and_a_click_is_not_speech():
    assert run(silence(20)) == []
    assert run(silence(2) + speech(0.05) + silence(2)) == []


def test_nearby_stretches_share_a_segment_padded_and_silence_between_segments_is_dropped():
    probs = silence(1) + speech(3) + silence(1) + speech(2) + silence(40) + speech(1) + silence(1)
    first, second = run(probs)
    pad = SegmentingOptions().pad_s
    assert first.start_s == pytest.approx(1 - pad, abs=2 * FRAME_SECONDS)
    assert first.end_s == pytest.approx(7 + pad, abs=2 * FRAME_SECONDS)  # both stretches, the pause between
    assert second.start_s == pytest.approx(47 - pad, abs=2 * FRAME_SECONDS)
    assert len(first.probabilities) == first.end - first.start


def test_segments_never_pass_the_maximum_and_never_overlap():
    rng = np.random.default_rng(0)
    probs: list[float] = []
    for _ in range(60):  # ~10 minutes of turns and pauses of every length
        probs += speech(float(rng.uniform(0.2, 25))) + silence(float(rng.choice([0.1, 0.4, 1.0, 5.0])))
    segments = run(probs)
    assert all(s.end_s - s.start_s <= 30.0 + 1e-9 for s in segments)
    assert all(a.end <= b.start for a, b in zip(segments, segments[1:]))
    speech_frames = {i for i, p in enumerate(probs) if p > 0.5}
    covered = {f for s in segments for f in range(s.start, s.end)}
    assert speech_frames <= covered  # no speech lost


def test_a_long_stretch_is_cut_at_its_quietest_frame_not_at_the_limit():
    # 50 s of speech with a dip (not a pause long enough to end the stretch) at 21 s.
    probs = speech(21) + [0.4] * 3 + speech(29)
    segments = run(probs)
    assert len(segments) == 2
    assert segments[0].end_s == pytest.approx(21 + 3 * FRAME_SECONDS / 2, abs=2 * FRAME_SECONDS)
    assert segments[1].start == segments[0].end


def test_waiting_stretches_go_out_alone_when_a_long_one_outgrows_the_segment():
    probs = speech(5) + silence(1) + speech(40)
    segments = run(probs)
    assert segments[0].end_s == pytest.approx(5 + SegmentingOptions().pad_s, abs=2 * FRAME_SECONDS)
    assert all(s.end_s - s.start_s <= 30.0 + 1e-9 for s in segments)
    assert len(segments) == 3


def test_memory_holds_only_the_open_segment():
    segmenter = Segmenter()
    for _ in range(100):
        segmenter.feed(speech(3) + silence(2))
    assert len(segmenter._probs) <= frames(31)
    assert segmenter.keep_from > frames(400)


def test_bad_options_are_refused():
    with pytest.raises(ValueError):
        SegmentingOptions(max_segment_s=45)
    with pytest.raises(ValueError):
        SegmentingOptions(threshold=0.3, neg_threshold=0.4)
