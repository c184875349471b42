"""The plausibility check on a transcript (pipelines/transcript_check.py): pure, no engine."""

import pytest

from models.base import Transcript
from pipelines.transcript_check import MAX_NO_SPEECH_PROBABILITY, counted, is_plausible, rejection


@pytest.mark.parametrize("text, seconds, no_speech, label", [
    ("", 1.0, None, "empty"),
    ("   ", 1.0, 0.1, "empty"),
    ("I'm sorry. " * 30, 5.0, 0.1, "compression_ratio"),
    ("Hello. Hello. Hello. Hello. Hello. Hello.", 2.0, 0.1, "repetition"),
    ("please book me a table for four people at eight tonight near the window seat", 2.0, 0.1,
     "words_per_second"),  # 7.5 words a second
    ("please book me a table for four people at eight tonight near the window seat", 3.0, 0.1, None),
    ("thank you", 1.0, MAX_NO_SPEECH_PROBABILITY + 0.1, "no_speech"),
    ("thanks for watching", 1.5, 0.9, "no_speech"),
    ("please book a table", 1.5, 0.9, None),  # four words: long text is rarely invented from silence
    ("thank you", 1.0, MAX_NO_SPEECH_PROBABILITY, None),  # at the limit, not over it
    ("thank you", 1.0, None, None),  # an engine that gives no probability
    ("what time do you open", 1.5, 0.1, None),
])
def test_each_failure_has_its_label_and_speech_has_none(text, seconds, no_speech, label):
    transcript = Transcript(text, seconds, 0.1, no_speech_probability=no_speech)
    assert rejection(transcript) == label
    assert is_plausible(transcript) == (label is None)


def test_every_rejection_is_counted_but_an_empty_one():
    assert not counted(None) and not counted("empty")
    assert all(counted(label) for label in ("compression_ratio", "repetition", "words_per_second", "no_speech",
                                            "prefixed_pass"))
