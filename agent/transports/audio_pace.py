"""How far a caller's audio may run ahead of the clock (pure; the clock is injected).

A phone or a microphone sends audio as it is spoken; a client may send some ahead (a jitter
buffer, a pre-roll, a file played in), but a client that sends an hour of audio in three
seconds makes the call's pipeline queue it all: measured, +160 MB and other calls' replies a
second slower. Audio beyond `max_ahead_s` of the wall clock is refused; the transport says so
and drops it, and the call goes on at the pace of real speech.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class AudioPace:
    """The audio admitted so far ends at `_audio_end` on the wall clock: each chunk plays after
    the one before, or now if the line was quiet (silence is never banked as credit)."""

    def __init__(self, max_ahead_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._max_ahead_s = max_ahead_s
        self._clock = clock
        self._audio_end = float("-inf")

    def admit(self, seconds: float) -> bool:
        """True if `seconds` more audio keeps the call within `max_ahead_s` of real time (and
        counts it); False if it would not (and does not count it)."""
        now = self._clock()
        start = max(self._audio_end, now)
        if start + seconds > now + self._max_ahead_s:
            return False
        self._audio_end = start + seconds
        return True

    @property
    def max_ahead_s(self) -> float:
        return self._max_ahead_s

    @property
    def ahead_s(self) -> float:
        """How far the audio admitted so far runs ahead of the clock (0 if it does not)."""
        return max(0.0, self._audio_end - self._clock())
