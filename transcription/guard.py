"""Is a segment's transcript what was said, or something Whisper made up? Pure checks
(openai/whisper's, plus a words-per-second bound): a repetition loop compresses too well,
invented text comes faster than anyone speaks, a guess has a low average log-probability."""

from __future__ import annotations

from collections.abc import Sequence

from models.hallucination import MAX_COMPRESSION_RATIO, MIN_AVG_LOGPROB, compression_ratio, too_fast
from transcription.result import Piece

MIN_TEXT_FOR_COMPRESSION = 40  # characters: shorter texts compress badly whatever they say


def rejection(pieces: Sequence[Piece], audio_seconds: float) -> str | None:
    """Why the segment's transcript is not to be trusted (a metric label), or None."""
    text = " ".join(p.text for p in pieces)
    texts = [text] + [p.text for p in pieces]
    if any(len(t) >= MIN_TEXT_FOR_COMPRESSION and compression_ratio(t) > MAX_COMPRESSION_RATIO for t in texts):
        return "compression_ratio"
    if too_fast(text, audio_seconds):
        return "words_per_second"
    scored = [(p.avg_logprob, max(p.end - p.start, 0.01)) for p in pieces if p.avg_logprob is not None]
    if scored and sum(lp * d for lp, d in scored) / sum(d for _, d in scored) < MIN_AVG_LOGPROB:
        return "avg_logprob"
    return None
