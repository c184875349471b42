import numpy as np

from pipelines.speech_end import silent_tail_seconds

RATE = 16_000


def tone(seconds: float, amplitude: float) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    return (np.sin(2 * np.pi * 220 * t) * amplitude * 32767).astype(np.int16)


def test_silent_tail_after_speech_is_measured_to_the_window():
    audio = np.concatenate([tone(0.2, 0.0), tone(1.0, 0.5), tone(0.4, 0.0)])
    assert abs(silent_tail_seconds(audio.tobytes(), RATE) - 0.4) <= 0.01


def test_line_hiss_does_not_count_as_voice_but_a_quiet_tail_does():
    rng = np.random.default_rng(0)
    hiss = (rng.normal(0, 0.001, int(RATE * 0.5)) * 32767).astype(np.int16)
    audio = np.concatenate([tone(0.8, 0.5), tone(0.1, 0.05), hiss])  # a soft syllable, then hiss
    assert abs(silent_tail_seconds(audio.tobytes(), RATE) - 0.5) <= 0.01


def test_no_voice_at_all_gives_none():
    assert silent_tail_seconds(np.zeros(RATE, dtype=np.int16).tobytes(), RATE) is None
    assert silent_tail_seconds(b"", RATE) is None
