"""Whether a transcript is passed on: Whisper's known failures (a repetition loop, words
faster than anyone speaks, text invented over silence) are caught here, on the text and the
engine's own figures alone (pure; pipelines/stt.py drops what fails and counts why)."""

from __future__ import annotations

from models.base import Transcript
from models.hallucination import MAX_COMPRESSION_RATIO, compression_ratio, repeats_itself, too_fast

# Above this mean no-speech probability, short text is most likely noise read as words.
MAX_NO_SPEECH_PROBABILITY = 0.6

# Up to this many words, text over likely silence is taken for noise: long text is rarely
# invented from silence.
MAX_WORDS_FROM_SILENCE = 3


def rejection(transcript: Transcript) -> str | None:
    """Why a transcript is not passed on (a metric label), or None: empty text, a
    repetition loop (long or short), words faster than anyone speaks, text over what was
    likely silence."""
    text = transcript.text.strip()
    if not text:
        return "empty"
    if compression_ratio(text) > MAX_COMPRESSION_RATIO:
        return "compression_ratio"
    if repeats_itself(text):
        return "repetition"
    if too_fast(text, transcript.audio_seconds):
        return "words_per_second"
    if transcript.no_speech_probability is not None and transcript.no_speech_probability > MAX_NO_SPEECH_PROBABILITY \
            and len(text.split()) <= MAX_WORDS_FROM_SILENCE:
        return "no_speech"
    return None


def is_plausible(transcript: Transcript) -> bool:
    return rejection(transcript) is None


def counted(reason: str | None) -> bool:
    """Whether a rejection is counted (`CallEvents.asr_rejected`): an empty transcript is
    silence read as nothing, not a failure of the model."""
    return reason is not None and reason != "empty"
