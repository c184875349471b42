"""A caller's turn longer than the engine's window (Whisper's 30 s), as byte offsets in the
turn's audio (pure: pipelines/stt.py holds the audio, pipelines/transcript_plan.py says when).

A caller who talks past one window without a pause has the turn so far cut at its quietest
moment of the last 2 s, transcribed and pushed, and the turn goes on from there: every word is
transcribed, in order, and the buffer never holds more than one window (10 minutes of talk
would otherwise hold 19 MB and lose all but the last 30 s). A segment longer than one window
all the same (a guess at a pause, a turn's end) is given the engine's window of its end,
which the reply is about.
"""

from __future__ import annotations

from pipelines.speech_end import quietest_point

# A turn over the segment limit is cut at its quietest point within this much before the limit.
LONG_TURN_CUT_WITHIN_S = 2.0


def cut_at(window: bytes, sample_rate: int) -> int:
    """Where to cut a turn that has filled one window (`window`: its first window of audio, 16-bit
    PCM): a byte offset between words, most likely, within the last LONG_TURN_CUT_WITHIN_S."""
    return quietest_point(window, sample_rate, within_s=LONG_TURN_CUT_WITHIN_S)


def window_start(length: int, max_segment_bytes: int) -> int:
    """Where the engine's window starts in a segment of `length` bytes: 0 if it fits, else the
    start of its last window."""
    return max(0, length - max_segment_bytes)
