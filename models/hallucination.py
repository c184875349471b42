"""Signs that a Whisper transcript was invented rather than heard (openai/whisper's checks)."""

from __future__ import annotations

import gzip
import re

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


# A phrase said this many times in a row: a decoder loop too short for gzip to notice
# ("Hello. Hello. Hello. Hello. Hello."). A single word gets one more ("no, no, no" is speech).
MAX_PHRASE_REPEATS = 3
MAX_PHRASE_WORDS = 4
# A sentence that opens with the previous one's first words (this many, or all of a shorter
# one of at least RESTART_MIN_WORDS): the decoder starting over ("Where is my package right
# now? Where is my package right now?").
RESTART_WORDS = 5
RESTART_MIN_WORDS = 4
_WORD = re.compile(r"[\w']+")
_SENTENCE_END = re.compile(r"(?<=[.?!])\s+")


def repeats_itself(text: str) -> bool:
    """Some phrase of 1-4 words comes more than MAX_PHRASE_REPEATS times in a row (a single
    word: more than MAX_PHRASE_REPEATS + 1)."""
    words = _WORD.findall(text.lower())
    for size in range(1, MAX_PHRASE_WORDS + 1):
        allowed = MAX_PHRASE_REPEATS + (1 if size == 1 else 0)
        for start in range(len(words) - size * (allowed + 1) + 1):
            phrase = words[start : start + size]
            if all(words[start + k * size : start + (k + 1) * size] == phrase for k in range(1, allowed + 1)):
                return True
    return False


def starts_over(text: str) -> bool:
    """A sentence begins with the opening words of the one before it (the decoder went back
    to the start; the copy is often cut short by the token budget)."""
    sentences = [_WORD.findall(s.lower()) for s in _SENTENCE_END.split(text.strip())]
    for previous, following in zip(sentences, sentences[1:]):
        opening = previous[:RESTART_WORDS]
        if len(opening) >= RESTART_MIN_WORDS and following[: len(opening)] == opening:
            return True
    return False
