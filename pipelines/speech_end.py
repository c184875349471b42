"""Where the caller's speech really ended, from the audio itself (pure numpy, no I/O).

The VAD declares the end of a turn `stop_secs` after it stops hearing speech, but Silero's
confidence and pipecat's smoothed volume gate both trail the audio by tens of milliseconds,
so "VAD decision minus stop_secs" lands after the last voiced sample and TTFS measured from
it reads short of what the caller hears. Measuring the silent tail of the turn's audio
fixes the start of the clock to the audio.
"""

from __future__ import annotations

import numpy as np

WINDOW_SECONDS = 0.01
# A window counts as voiced above 5 % of the turn's loudest window (-26 dB), with a floor
# for near-silent lines: quiet syllable tails count, line hiss does not.
RELATIVE_THRESHOLD = 0.05
ABSOLUTE_FLOOR = 0.005  # full scale = 1.0


def silent_tail_seconds(pcm16: bytes, sample_rate: int) -> float | None:
    """Seconds from the last voiced 10 ms window to the end of `pcm16`; None if nothing is voiced."""
    samples = np.frombuffer(pcm16, dtype=np.int16)
    window = max(1, int(sample_rate * WINDOW_SECONDS))
    count = len(samples) // window
    if count == 0:
        return None
    frames = samples[: count * window].astype(np.float32).reshape(count, window) / 32768.0
    rms = np.sqrt(np.mean(frames * frames, axis=1))
    threshold = max(ABSOLUTE_FLOOR, RELATIVE_THRESHOLD * float(rms.max()))
    voiced = np.nonzero(rms > threshold)[0]
    if len(voiced) == 0:
        return None
    return (len(samples) - (int(voiced[-1]) + 1) * window) / sample_rate
