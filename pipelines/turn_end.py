"""How long a pause ends the caller's turn: the words and the voice decide together (pure).

A fixed VAD silence is a bad compromise: long enough not to cut off a caller who stops to
think ("I need to change the delivery address for ... my order from last week"), it makes
every finished question wait it out too. When the caller pauses, two judges look at the
turn so far: the words (the speculative transcript) and the voice (Smart Turn's
probability that the speaker finished, models/smart_turn.py). Then:

  words unfinished (a trailing comma or "...", a last word that needs more)  -> long pause
  words finished (. ? !) and the voice finished                              -> short pause
  no words or no punctuation, and the voice unfinished                       -> long pause
  anything else                                                              -> the agent's pause

Neither judge alone shortens a pause: Whisper tends to punctuate a fragment ("for it.")
and Smart Turn hears any synthesised fragment as finished. Either one alone can lengthen
it, which only costs time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Words a finished English sentence rarely ends on: articles, conjunctions, possessives,
# "to", fillers.
_ALWAYS_DANGLING = frozenset(
    "a an the and or but nor so because if that which whose my your our their his her its "
    "to very than as um uh er".split()
)
# Auxiliaries end a question that asks what something is ("... what the capital of France
# is?"), not a statement ("My order number is"). Prepositions end wh-questions only ("What
# is it for?"); Whisper also marks a rising fragment with "?" ("Can you tell me about?").
_AUXILIARIES = frozenset("is are was were am be been being have has had do does did can could will would "
                         "shall should may might must".split())
_PREPOSITIONS = frozenset("about above after at before between by for from in into like of on over "
                          "through under until up with without".split())
_WH_WORDS = frozenset("what who whom which where when how why whose".split())
_TRAILING_OPEN = ("...", "\u2026", ",", "-", "\u2014", ":", ";")
_FINAL_MARKS = (".", "?", "!")
_WORD = re.compile(r"[\w']+")


@dataclass(frozen=True)
class TurnEndOptions:
    # Pause that ends a turn whose words and voice both sound finished; Smart Turn's authors
    # pair it with a 0.2 s VAD stop.
    complete_pause_s: float = 0.2
    # Pause allowed a turn that sounds unfinished; also the longest any turn waits, while the
    # judges are still out. Callers thinking mid-sentence pause 0.5-1 s.
    incomplete_pause_s: float = 1.0
    # Smart Turn probability at or above which the voice counts as finished.
    complete_probability: float = 0.5

    def __post_init__(self) -> None:
        if not 0.05 <= self.complete_pause_s <= self.incomplete_pause_s <= 3.0:
            raise ValueError("turn_end: need 0.05 <= complete_pause_s <= incomplete_pause_s <= 3")
        if not 0.0 < self.complete_probability < 1.0:
            raise ValueError("turn_end.complete_probability must be in (0, 1)")


@dataclass(frozen=True)
class PauseVerdict:
    pause_s: float  # silence after which this pause ends the turn
    reason: str  # "finished", "words_unfinished", "voice_unfinished" or "undecided" (a metric label)


def words_state(text: str) -> str:
    """'unfinished', 'finished' (closing punctuation, nothing left hanging) or 'unknown'."""
    stripped = text.strip()
    words = _WORD.findall(stripped.lower())
    if not words:
        return "unknown"
    if stripped.endswith(_TRAILING_OPEN):
        return "unfinished"
    last = words[-1]
    question = stripped.endswith("?")
    wh_question = question and words[0] in _WH_WORDS
    if (last in _ALWAYS_DANGLING or (last in _AUXILIARIES and not question)
            or (last in _PREPOSITIONS and not wh_question)):
        return "unfinished"
    return "finished" if stripped.endswith(_FINAL_MARKS) else "unknown"


def judge_pause(words: str | None, probability_complete: float | None, *, default_pause_s: float,
                options: TurnEndOptions) -> PauseVerdict:
    """The pause that ends this turn, from its transcript so far (None: none came) and the
    voice's probability of being finished (None: not judged)."""
    state = words_state(words) if words is not None else "unknown"
    voice_finished = None if probability_complete is None else probability_complete >= options.complete_probability
    if state == "unfinished":
        return PauseVerdict(options.incomplete_pause_s, "words_unfinished")
    if state == "finished" and voice_finished:
        return PauseVerdict(min(options.complete_pause_s, default_pause_s), "finished")
    if state == "unknown" and voice_finished is False:
        return PauseVerdict(options.incomplete_pause_s, "voice_unfinished")
    return PauseVerdict(default_pause_s, "undecided")
