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


QUIET_SPAN_SECONDS = 0.1


def quietest_point(pcm16: bytes, sample_rate: int, *, within_s: float) -> int:
    """Where to cut a turn too long for one transcription: the byte offset of the middle of the
    quietest 10 ms inside the quietest 100 ms in the last `within_s` seconds of `pcm16` (between
    words, most likely, so no word is cut in two). A whole sample; the end of `pcm16` if it is
    shorter than 100 ms."""
    samples = np.frombuffer(pcm16, dtype=np.int16)
    window = max(1, int(sample_rate * WINDOW_SECONDS))
    span = max(1, int(QUIET_SPAN_SECONDS / WINDOW_SECONDS))
    first = max(0, len(samples) - int(within_s * sample_rate)) // window * window
    count = (len(samples) - first) // window
    if count < span:
        return len(samples) * 2
    frames = samples[first: first + count * window].astype(np.float32).reshape(count, window)
    energy = np.mean(frames * frames, axis=1)
    spans = np.convolve(energy, np.ones(span), mode="valid")  # the energy of each 100 ms from each window
    def latest_min(values: np.ndarray) -> int:  # the latest of equals: segments as long as they can be
        return len(values) - 1 - int(np.argmin(values[::-1]))

    start = latest_min(spans)
    quietest = start + latest_min(energy[start: start + span])  # its quietest 10 ms: between words
    return (first + quietest * window + window // 2) * 2


def last_voiced_at(pcm16: bytes, sample_rate: int, *, last_audio_at: float, vad_estimate: float) -> float:
    """When the caller's last voiced sound reached us: `pcm16` (the turn's audio, its newest
    sample arrived at `last_audio_at`) less its silent tail, or the VAD's own estimate if
    nothing in it is voiced."""
    tail = silent_tail_seconds(pcm16, sample_rate) if pcm16 else None
    return vad_estimate if tail is None else last_audio_at - tail
