"""AudioPace: a caller's audio may run ahead of the clock by a bounded amount, never bank silence."""

from agent.transports.audio_pace import AudioPace


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_real_time_audio_is_always_admitted():
    clock = Clock()
    pace = AudioPace(2.0, clock=clock)
    for _ in range(500):  # 10 s of 20 ms frames, each as it is spoken
        assert pace.admit(0.02)
        clock.now += 0.02
    assert pace.ahead_s <= 0.02 + 1e-9


def test_a_burst_is_admitted_up_to_the_allowance_and_refused_beyond_it():
    clock = Clock()
    pace = AudioPace(2.0, clock=clock)
    admitted = sum(pace.admit(0.02) for _ in range(1000))  # 20 s at once
    assert admitted == 100 and abs(pace.ahead_s - 2.0) < 1e-9
    clock.now += 0.5  # as time passes, room for as much again
    assert sum(pace.admit(0.02) for _ in range(1000)) == 25


def test_silence_is_not_banked_as_credit_for_a_later_burst():
    clock = Clock()
    pace = AudioPace(2.0, clock=clock)
    assert pace.admit(0.02)
    clock.now += 600  # ten minutes with nothing sent (a muted microphone)
    assert sum(pace.admit(0.02) for _ in range(1000)) == 100  # still only the allowance
