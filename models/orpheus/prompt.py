"""Orpheus prompts: `[start of human] tokens("{voice}: {text}") [end of text, end of human,
start of AI, start of speech]`; the model then speaks audio tokens until end of speech.

Emotion tags (`<laugh>`, `<sigh>`, ...) are plain text to the tokenizer and pass through.
The tokenizer is injected: Orpheus' own (Llama 3, which adds its BOS) in production,
anything with the same contract in tests.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from models.orpheus.tokens import END_OF_HUMAN, END_OF_TEXT, START_OF_AI, START_OF_HUMAN, START_OF_SPEECH

# The English voices of canopylabs/orpheus-3b-0.1-ft; fine-tunes add their own names.
VOICES = ("tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe")
EMOTION_TAGS = ("<laugh>", "<chuckle>", "<sigh>", "<cough>", "<sniffle>", "<groan>", "<yawn>", "<gasp>")
MAX_PROMPT_CHARS = 1000  # one sentence-sized request; see pipelines' sentence splitting
_VOICE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,32}$")


def prompt_text(voice: str, text: str) -> str:
    if not _VOICE_NAME.match(voice):
        raise ValueError(f"voice name {voice!r} must be 1-32 letters, digits, '_' or '-'")
    text = " ".join(text.split())
    if not text:
        raise ValueError("nothing to say: empty text")
    if len(text) > MAX_PROMPT_CHARS:
        raise ValueError(f"text of {len(text)} characters is over {MAX_PROMPT_CHARS}; split it into sentences")
    return f"{voice}: {text}"


def prompt_ids(tokenize: Callable[[str], list[int]], voice: str, text: str) -> list[int]:
    return [START_OF_HUMAN, *tokenize(prompt_text(voice, text)), END_OF_TEXT, END_OF_HUMAN, START_OF_AI,
            START_OF_SPEECH]
