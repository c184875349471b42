"""A turn longer than the engine's window (pipelines/long_turn.py): pure, on synthetic PCM."""

import numpy as np

from pipelines.long_turn import LONG_TURN_CUT_WITHIN_S, cut_at, window_start

RATE = 16_000


def _tone(seconds: float, amplitude: int = 8000) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (amplitude * np.sin(2 * np.pi * 220 * t)).astype(np.int16)


def test_a_full_window_is_cut_in_the_gap_between_words_near_its_end():
    gap_at = 9.0  # seconds; 0.2 s of near-silence there, inside the last 2 s of a 10 s window
    audio = np.concatenate([_tone(gap_at), np.zeros(int(0.2 * RATE), dtype=np.int16), _tone(0.8)])
    cut = cut_at(audio.tobytes(), RATE)
    assert cut % 2 == 0  # a whole sample
    assert gap_at * RATE * 2 <= cut <= (gap_at + 0.2) * RATE * 2


def test_a_gap_before_the_last_seconds_is_not_looked_at():
    early_gap = np.zeros(int(0.2 * RATE), dtype=np.int16)
    audio = np.concatenate([_tone(3.0), early_gap, _tone(7.0)])
    cut = cut_at(audio.tobytes(), RATE)
    assert cut >= (len(audio) - LONG_TURN_CUT_WITHIN_S * RATE) * 2  # within the last 2 s, wherever is quietest


def test_the_engine_sees_the_end_of_a_segment_longer_than_one_window():
    assert window_start(0, 960_000) == 0
    assert window_start(960_000, 960_000) == 0  # exactly one window fits
    assert window_start(960_002, 960_000) == 2
    assert window_start(2_000_000, 960_000) == 1_040_000
