"""The caller's ear: TTFB/TTFS, underruns and barge-in stop time from timed audio chunks."""

import numpy as np
import pytest

from latency_bench.callers.listen import JITTER_BUFFER_S, LONG_SILENCE_S, ReplyTracker, TurnRecord

RATE = 8000
FRAME = 160  # 20 ms


def tone(seconds: float = 0.02, level: float = 0.3) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    return (np.sin(2 * np.pi * 440 * t) * level * 32767).astype(np.int16)


def quiet(seconds: float = 0.02, level: int = 0) -> np.ndarray:
    return np.full(int(RATE * seconds), level, dtype=np.int16)


def turn(index: int = 0) -> TurnRecord:
    return TurnRecord(caller=0, index=index, text="q", voice="v", utterance_seconds=2.0)


def test_ttfb_is_the_first_non_silent_audio_and_ttfs_the_first_audible():
    t = turn()
    t.speech_end_at = 100.0
    t.hear(100.2, quiet(), RATE, keep_audio=False)  # line silence before the reply: ignored
    t.hear(100.5, quiet(level=200), RATE, keep_audio=False)  # the reply's quiet onset: bytes, not yet heard
    t.hear(100.52, tone(), RATE, keep_audio=False)
    assert t.ttfb_ms == pytest.approx(500)
    assert t.ttfs_ms == pytest.approx(520)
    assert t.reply_audio_seconds == pytest.approx(0.04)


def test_packets_paced_in_real_time_have_no_underrun():
    t = turn()
    t.speech_end_at = 0.0
    for i in range(100):
        t.hear(1.0 + i * 0.02, tone(), RATE, keep_audio=False)
    assert t.underruns == 0


def test_a_packet_later_than_the_jitter_buffer_is_one_underrun():
    t = turn()
    t.speech_end_at = 0.0
    for i in range(10):
        t.hear(1.0 + i * 0.02, tone(), RATE, keep_audio=False)
    # 0.2 s of audio + the prebuffer are played by 1.3 s; the next packet comes 0.3 s later.
    late = 1.0 + 0.2 + JITTER_BUFFER_S + 0.3
    t.hear(late, tone(), RATE, keep_audio=False)
    t.hear(late + 0.02, tone(), RATE, keep_audio=False)
    assert t.underruns == 1
    assert t.underrun_seconds == pytest.approx(0.3, abs=0.01)


def test_a_caller_whose_clock_runs_fast_plays_audio_out_sooner():
    """Its prebuffer runs down as the packets come at true time: 1 s of audio against a clock
    3 % fast (the soak uses 0.1 %) leaves it ~30 ms less ahead; a hole is counted only past
    one frame of lateness, as for any caller."""
    on_time, fast = turn(), turn()
    for t, rate in ((on_time, 1.0), (fast, 1.03)):
        t.speech_end_at = 0.0
        for i in range(50):
            t.hear(1.0 + i * 0.02, tone(), RATE, keep_audio=False, clock_rate=rate)
    assert on_time.playout_end - fast.playout_end == pytest.approx(1.0 - 1.0 / 1.03, abs=1e-6)
    assert fast.reply_audio_seconds == pytest.approx(on_time.reply_audio_seconds)  # the audio, not its playout


def test_a_burst_ahead_of_real_time_is_no_underrun():
    t = turn()
    t.speech_end_at = 0.0
    for i in range(50):  # 1 s of audio arrives at once, then the rest in real time
        t.hear(1.0, tone(), RATE, keep_audio=False)
    for i in range(20):
        t.hear(1.9 + i * 0.02, tone(), RATE, keep_audio=False)
    assert t.underruns == 0


def test_a_long_silence_inside_a_reply_is_an_underrun_but_a_sentence_pause_is_not():
    t = turn()
    t.speech_end_at = 0.0
    now = 1.0
    for chunk in [tone()] * 10 + [quiet()] * 10 + [tone()] * 10 + [quiet()] * int(LONG_SILENCE_S / 0.02 + 10) \
            + [tone()] * 10:
        t.hear(now, chunk, RATE, keep_audio=False)
        now += 0.02
    assert t.underruns == 1  # the 0.2 s pause is speech; the ~0.9 s hole is not


def test_a_clear_after_a_barge_in_stops_the_reply_and_late_audio_is_counted():
    tracker = ReplyTracker()
    first, second = turn(0), turn(1)
    tracker.begin(first, 0.0, barging_in=False)
    tracker.speech_ended(first, 2.0)
    tracker.hear(3.0, tone(), RATE)
    tracker.begin(second, 4.0, barging_in=True)
    tracker.hear(4.1, tone(), RATE)  # still the first reply, under the caller's voice
    tracker.clear(4.6)
    tracker.hear(4.62, tone(), RATE)  # already in flight when the server cleared
    tracker.speech_ended(second, 6.0)
    tracker.hear(7.0, tone(), RATE)
    assert first.barge_in_stop_ms == pytest.approx(600)
    assert first.late_reply_seconds == pytest.approx(0.02)
    assert second.ttfs_ms == pytest.approx(1000)
    assert second.barge_in_at is None


def test_a_clear_at_the_start_of_an_ordinary_turn_stops_nothing():
    tracker = ReplyTracker()
    first = turn()
    tracker.begin(first, 0.0, barging_in=False)
    tracker.clear(0.5)  # pipecat clears when any caller turn starts
    tracker.speech_ended(first, 2.0)
    tracker.hear(3.0, tone(), RATE)
    assert first.reply_stopped_at is None and first.ttfs_ms == pytest.approx(1000)


def test_without_a_clear_the_reply_stops_at_its_last_audible_frame():
    tracker = ReplyTracker()
    first, second = turn(0), turn(1)
    tracker.begin(first, 0.0, barging_in=False)
    tracker.speech_ended(first, 2.0)
    now = 3.0
    while now < 5.0:  # the reply plays on for 0.7 s after the caller starts talking at 4.3
        tracker.hear(now, tone() if now < 5.0 else quiet(), RATE)
        now += 0.02
        if abs(now - 4.3) < 0.01:
            tracker.begin(second, now, barging_in=True)
    while now < 6.0:
        tracker.hear(now, quiet(), RATE)
        now += 0.02
    tracker.speech_ended(second, 6.0)
    assert first.barge_in_stop_ms == pytest.approx(680, abs=25)


def test_reply_audio_is_kept_only_when_asked():
    kept, dropped = ReplyTracker(keep_audio=True), ReplyTracker()
    for tracker in (kept, dropped):
        t = turn()
        tracker.begin(t, 0.0, barging_in=False)
        tracker.speech_ended(t, 1.0)
        tracker.hear(1.5, tone(), RATE)
    assert len(kept.turns[0].reply_audio()) == FRAME
    assert len(dropped.turns[0].reply_audio()) == 0
