"""Signs that a Whisper transcript was invented rather than heard (openai/whisper's checks)."""

from __future__ import annotations

import gzip

# Text that gzips this well is a repetition loop ("I'm sorry. I'm sorry. ...").
MAX_COMPRESSION_RATIO = 2.4
# Mean token log-probability below this: the decoder was guessing.
MIN_AVG_LOGPROB = -1.0


def compression_ratio(text: str) -> float:
    raw = text.encode("utf-8")
    return len(raw) / len(gzip.compress(raw)) if raw else 0.0
