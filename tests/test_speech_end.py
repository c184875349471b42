import numpy as np

from pipelines.speech_end import quietest_point, silent_tail_seconds

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


def test_a_long_turn_is_cut_in_the_quiet_between_words_not_through_one():
    rate = 16_000
    speech = (np.random.default_rng(1).normal(0, 4000, rate * 5)).clip(-32768, 32767).astype(np.int16)
    speech[int(3.30 * rate):int(3.38 * rate)] = 0  # an 80 ms gap between two words
    speech[int(4.50 * rate):int(4.52 * rate)] = 200  # a shorter, fainter dip later on
    cut = quietest_point(speech.tobytes(), rate, within_s=2.0)
    assert cut % 2 == 0 and 3.30 <= cut / 2 / rate <= 3.38
    # Outside the last `within_s` seconds nothing is considered; a tiny buffer is cut at its end.
    assert quietest_point(speech.tobytes(), rate, within_s=1.0) / 2 / rate >= 4.0
    assert quietest_point(bytes(40), rate, within_s=2.0) == 40


def test_the_last_voiced_moment_is_the_newest_audio_less_its_silent_tail():
    from pipelines.speech_end import last_voiced_at

    voiced = (8000 * np.sin(2 * np.pi * 220 * np.arange(RATE) / RATE)).astype(np.int16)
    audio = np.concatenate([voiced, np.zeros(int(0.4 * RATE), dtype=np.int16)]).tobytes()
    at = last_voiced_at(audio, RATE, last_audio_at=100.0, vad_estimate=99.0)
    assert abs(at - 99.6) <= 0.01
    silence = np.zeros(RATE, dtype=np.int16).tobytes()
    assert last_voiced_at(silence, RATE, last_audio_at=100.0, vad_estimate=99.0) == 99.0  # nothing voiced
    assert last_voiced_at(b"", RATE, last_audio_at=100.0, vad_estimate=99.0) == 99.0  # nothing buffered
