"""When the first words of a reply go to TTS.

pipecat's sentence aggregator holds text until a sentence ends (plus one character of
lookahead). For the *first* chunk of each reply that wait is paid in TTFS twice: the LLM
must write the whole sentence, and a non-streaming voice (Piper, ~0.13 RTF on 2 cores)
must synthesise all of it before the first sample. So the first chunk is released at the
first natural phrase boundary once it has a few words: a clause break ("Sure, ..."), or
just before a conjunction ("The sky is blue | because ..."), or at a word cap. Later
chunks stay whole sentences, which voices phrase better.
"""

from __future__ import annotations

from pipecat.utils.text.base_text_aggregator import Aggregation, TextType
from pipecat.utils.text.simple_text_aggregator import SimpleTextAggregator

CLAUSE_BREAKS = (",", ";", ":", "—")
# Words a spoken phrase naturally starts with: a pause before them sounds intended.
PHRASE_STARTERS = frozenset(
    "and but or so because which who whose that when while where if although though unless until since".split()
)
# Fewer words than this make a clipped, oddly stressed first chunk ("So,").
MIN_FIRST_PHRASE_WORDS = 4
# Past this many words with no boundary, release anyway: ~3 s of speech, ~0.4 s of synthesis.
MAX_FIRST_PHRASE_WORDS = 9


def split_first_phrase(
    text: str, min_words: int = MIN_FIRST_PHRASE_WORDS, max_words: int = MAX_FIRST_PHRASE_WORDS
) -> tuple[str, str] | None:
    """(phrase, rest) if `text`, which just completed a word, ends a good first phrase.

    Called only when `text` ends in whitespace, i.e. a word just completed, so "1,000" or
    "3:30" never split and a word is never cut.
    """
    if not text or not text[-1].isspace():
        return None
    body = text.rstrip()
    words = body.split()
    if len(words) < min_words:
        return None
    if body[-1] in CLAUSE_BREAKS and len(body) >= 2 and body[-2].isalpha():
        return body.strip(), text[len(body):]
    last = words[-1]
    if last.lower() in PHRASE_STARTERS and len(words) - 1 >= min_words:
        cut = body.rfind(last)
        return body[:cut].strip(), body[cut:] + text[len(body):]
    if len(words) >= max_words:
        return body.strip(), text[len(body):]
    return None


class FirstPhraseAggregator(SimpleTextAggregator):
    def __init__(self, *, min_words: int = MIN_FIRST_PHRASE_WORDS, max_words: int = MAX_FIRST_PHRASE_WORDS,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self._min_words = min_words
        self._max_words = max_words
        self._released_in_reply = False

    async def _check_sentence_with_lookahead(self, char: str, *, protected_end: int = 0) -> Aggregation | None:
        result = await super()._check_sentence_with_lookahead(char, protected_end=protected_end)
        if result is None and not self._released_in_reply:
            split = split_first_phrase(self._text, self._min_words, self._max_words)
            if split is not None:
                phrase, self._text = split
                result = Aggregation(text=phrase, type=TextType.SENTENCE)
        if result is not None:
            self._released_in_reply = True
        return result

    async def flush(self) -> Aggregation | None:
        self._released_in_reply = False  # the reply ended; the next one starts afresh
        return await super().flush()

    async def handle_interruption(self) -> None:
        self._released_in_reply = False
        await super().handle_interruption()

    async def reset(self) -> None:
        self._released_in_reply = False
        await super().reset()
