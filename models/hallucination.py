"""Signs that a Whisper transcript was invented rather than heard (openai/whisper's checks)."""

from __future__ import annotations

import gzip

# Text that gzips this well is a repetition loop ("I'm sorry. I'm sorry. ...").
MAX_COMPRESSION_RATIO = 2.4
# Mean token log-probability below this: the decoder was guessing.
MIN_AVG_LOGPROB = -1.0
# Fast speakers reach ~4.5 words a second (270 wpm); text faster than this over a second or
# more of audio was not spoken.
MAX_WORDS_PER_SECOND = 6.0


def too_fast(text: str, audio_seconds: float) -> bool:
    return audio_seconds >= 1.0 and len(text.split()) / audio_seconds > MAX_WORDS_PER_SECOND


def compression_ratio(text: str) -> float:
    raw = text.encode("utf-8")
    return len(raw) / len(gzip.compress(raw)) if raw else 0.0
