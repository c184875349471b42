"""Shaping an LLM reply as it streams (pure: no I/O, no pipecat frames).

Two filters over the engine's text pieces, each a plain class with `feed(piece)` and
`flush()` (see `pipelines.reply.shaped_reply` for how they are chained):

- `SentenceBudget` cuts a reply after its first N sentences, so a small model that rambles
  is stopped instead of talking over the caller for half a minute.
- `PromptLeakGuard` keeps the system prompt and its secrets out of what is said. A 135M
  model cannot be trusted to keep "never reveal" rules, so the rule is enforced here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from pipelines.text_chunking import split_first_phrase

# A sentence's terminal punctuation and the closing quotes or brackets that belong to it.
_TERMINAL = re.compile(r"([.!?…]+)([\"'”’)\]»]*)")
# Abbreviations after which a full stop never ends a sentence: a name or an example follows.
NEVER_FINAL = frozenset({"dr", "mr", "mrs", "ms", "prof", "st", "mt", "e.g", "i.e", "vs", "approx", "cf", "fig"})
# Abbreviations that end a sentence only when the next word starts with a capital
# ("from 9 a.m. to 5" goes on; "until 5 p.m. See you" ends). Dotted ones ("a.m", "u.s") are matched by shape.
MAYBE_FINAL = frozenset({"etc", "jr", "sr", "inc", "ltd", "co", "ave", "rd", "blvd"})
_DOTTED_ABBREVIATION = re.compile(r"(?:[a-z]\.)+[a-z]")
# Context kept from emitted text to judge the word before a full stop that arrives later.
RECENT_CHARS = 64
# Numbered list items ("1. Call us") are not sentences; items past this are rare in speech.
MAX_LIST_MARKER_DIGITS = 3


class SentenceBudget:
    """Passes streamed text until `max_sentences` sentences are complete, then cuts it.

    `feed(piece)` returns (text to pass on, done). A sentence ends at . ! ? (and the closing
    quotes or brackets after it) followed by whitespace; a full stop in "3.5", "9:30", "Dr.
    Smith", "e.g.", "J. R." or an ellipsis ends none. A piece can end right after a full
    stop, before the text that decides it, so that stop is held until the next piece (or
    `flush()`, which returns it at the reply's end and readies the budget for a new reply).
    Once done, the text after the last allowed sentence's punctuation is dropped and the
    caller stops generation. `max_sentences <= 0`: no limit, pieces pass as they come.
    """

    def __init__(self, max_sentences: int) -> None:
        self._max = max_sentences
        self._reset()

    def _reset(self) -> None:
        self._count = 0
        self._done = False
        self._held = ""
        self._recent = "\n"  # a reply starts at a line's start

    def feed(self, piece: str) -> tuple[str, bool]:
        if self._max <= 0:
            return piece, False
        if self._done:
            return "", True
        text, self._held = self._held + piece, ""
        end = len(text)
        for m in _TERMINAL.finditer(text):
            verdict = self._ends_sentence(self._recent + text[: m.start()], m.group(1), text[m.end():])
            if verdict is None:
                self._held, end = text[m.start():], m.start()
                break
            if verdict:
                self._count += 1
                if self._count >= self._max:
                    self._done, end = True, m.end()
                    break
        self._recent = (self._recent + text[:end])[-RECENT_CHARS:]
        return text[:end], self._done

    def flush(self) -> str:
        """What is held at the reply's end; the budget then starts afresh."""
        held = self._held
        self._reset()
        return held

    @staticmethod
    def _ends_sentence(before: str, run: str, after: str) -> bool | None:
        """Whether `run` (terminal punctuation after `before`) ends a sentence; None: not yet known."""
        if not after:
            return None
        if not after[0].isspace():
            return False  # "3.5", "e.g.,", "example.com"
        if "!" in run or "?" in run:
            return True
        if run != ".":
            return False  # an ellipsis is a pause inside a thought, not its end
        word_match = re.search(r"\S*$", before)
        word = word_match.group(0).lstrip("(\"'“‘[")
        lower = word.lower()
        at_line_start = before[: word_match.start()].endswith("\n")
        if (lower in NEVER_FINAL or (len(word) == 1 and word.isupper())  # initials: "J. R. Tolkien"
                or (at_line_start and word.isdigit() and len(word) <= MAX_LIST_MARKER_DIGITS)):
            return False
        if lower in MAYBE_FINAL or _DOTTED_ABBREVIATION.fullmatch(lower):
            following = after.lstrip()
            return following[0].isupper() if following else None
        return True


# ---- prompt leaks -----------------------------------------------------------------------

# A run of this many consecutive prompt words in a reply is a leak (the bench's judge,
# latency_bench/reply_quality.LEAK_MIN_WORDS, uses the same length). Shorter runs are
# everyday phrases ("how can I help", "the clinic is open").
LEAK_RUN_WORDS = 5
# Words of the prompt that look generated rather than written: secrets planted as canaries.
# Dash or underscore codes ("ZEBRA-4417", "API_KEY1")...
_CODE_SHAPE = re.compile(r"[A-Z]{2,}[-_][A-Z0-9]{3,}")
# ...or tokens this long that mix letters and digits ("CANARY-7f3a", "hunter42x").
MIN_SECRET_CHARS = 6
# Numbers with a unit or suffix mix letters and digits too ("9:30am-5pm", "21st", "10kg",
# "1990s"), as phone numbers and prices do not: facts the agent must be able to say.
_SUFFIX = r"(?:am|pm|st|nd|rd|th|s|k|m|h|x|kg|km|mg|ml|mm|cm|ft|lbs?|oz|hrs?|mins?|secs?|gb|mb)"
_NUMBER_WITH_SUFFIX = re.compile(rf"(?i)[0-9][0-9.,:/]*{_SUFFIX}?(?:[-–/][0-9][0-9.,:/]*{_SUFFIX}?)*")
_EDGE_PUNCTUATION = ".,;:!?\"'()[]{}<>“”‘’«»*`"
# A reply clause ends at one of these followed by whitespace ("1,250", "3.5" and "9:30"
# go on), or at a line break. "—" is where the TTS's first phrase may also end.
_CLAUSE_END = re.compile(r"[,;:.!?…—]+[\"'”’)\]»]*\s+|\n\s*")
# Text without any clause end is released in pieces of this many words, so a reply without
# punctuation is neither held to its end nor buffered without bound.
MAX_CLAUSE_WORDS = 24
# The same bound in characters, for text without spaces.
MAX_CLAUSE_CHARS = 400
REFUSAL = "I can't share that."


def squashed(text: str) -> str:
    """Lower case, letters and digits only: "Zebra 4417" and "ZEBRA-4417" compare equal."""
    return re.sub(r"[\W_]+", "", text.lower())


def prompt_words(text: str) -> list[str]:
    return re.findall(r"[^\W_]+", text.lower().replace("'", "").replace("’", ""))


def canary_tokens(system_prompt: str) -> frozenset[str]:
    """The prompt's secret-looking words, squashed."""
    found = set()
    for raw in system_prompt.split():
        token = raw.strip(_EDGE_PUNCTUATION)
        mixed = (len(token) >= MIN_SECRET_CHARS and any(c.isdigit() for c in token)
                 and any(c.isalpha() for c in token) and not _NUMBER_WITH_SUFFIX.fullmatch(token))
        if mixed or _CODE_SHAPE.fullmatch(token):
            found.add(squashed(token))
    return frozenset(found)


class PromptLeakGuard:
    """Redacts clauses of a streamed reply that quote the system prompt or its secrets.

    A clause is redacted if it contains a canary token of the prompt (`canary_tokens`, plus
    `extra_secrets`), compared letters and digits only, so spacing, case or a split across
    pieces hides nothing; or if it shares a run of `LEAK_RUN_WORDS` consecutive words with
    the prompt (case and punctuation aside). Runs and canaries that straddle a clause
    break count against the later clause. The first redacted clause of a reply becomes
    `replacement`; later ones are dropped; `redactions` counts them all.

    Why clauses: a clause is the smallest unit that still reads whole when replaced, and
    the TTS does not start on less. It releases a reply's first phrase at a clause break
    or at `text_chunking.split_first_phrase`'s other boundaries (which this guard releases
    at too), and every later chunk at a sentence's end, itself a clause end. What holding a
    clause does cost: the TTS confirms a sentence's end only when the next non-space
    character arrives, so a short first sentence ("Sure. I can book that, ...") reaches the
    voice when the next clause is released, a few tokens later than without the guard.
    """

    def __init__(self, system_prompt: str, *, replacement: str = REFUSAL, extra_secrets: Iterable[str] = ()) -> None:
        words = prompt_words(system_prompt)
        self._prompt_runs = frozenset(tuple(words[i:i + LEAK_RUN_WORDS])
                                      for i in range(len(words) - LEAK_RUN_WORDS + 1))
        self._canaries = canary_tokens(system_prompt) | {s for s in map(squashed, extra_secrets) if s}
        self._longest_canary = max(map(len, self._canaries), default=0)
        self._replacement = replacement
        self.redactions = 0
        self._reset()

    def _reset(self) -> None:
        self._pending = ""
        self._before_first_phrase: str | None = ""  # released text until the TTS's first phrase; then None
        self._redacted_in_reply = False
        self._recent_words: list[str] = []  # the last words checked, for runs across clauses
        self._recent_chars = ""  # the last squashed characters, for canaries across clauses

    def feed(self, piece: str) -> str:
        """Safe text to pass on now; a clause still open is held."""
        self._pending += piece
        out = []
        while (cut := self._next_cut()) is not None:
            clause, self._pending = self._pending[:cut], self._pending[cut:]
            out.append(self._checked(clause))
        return "".join(out)

    def flush(self) -> str:
        """The reply's last clause, checked; the guard then starts afresh (`redactions` stays)."""
        tail = self._checked(self._pending) if self._pending else ""
        self._reset()
        return tail

    def _next_cut(self) -> int | None:
        """Where the next clause ends in the pending text, if it has ended."""
        cuts = [m.end()] if (m := _CLAUSE_END.search(self._pending)) else []
        first_phrase_cut = self._first_phrase_cut() if self._before_first_phrase is not None else None
        if first_phrase_cut is not None:
            cuts.append(first_phrase_cut)
        words = list(re.finditer(r"\S+\s+", self._pending))
        if len(words) >= MAX_CLAUSE_WORDS:
            cuts.append(words[MAX_CLAUSE_WORDS - 1].end())
        if len(self._pending) > MAX_CLAUSE_CHARS:
            cuts.append(MAX_CLAUSE_CHARS)
        cut = min(cuts, default=None)
        if cut is not None and self._before_first_phrase is not None:
            released = self._before_first_phrase + self._pending[:cut]
            ends_sentence = released.rstrip().endswith((".", "!", "?"))
            first_phrase = ends_sentence or cut == first_phrase_cut
            self._before_first_phrase = None if first_phrase else released
        return cut

    def _first_phrase_cut(self) -> int | None:
        """Where the TTS will release the reply's first phrase, if within the pending text."""
        for m in re.finditer(r"\S\s", self._pending):
            if split_first_phrase(self._before_first_phrase + self._pending[: m.end()]) is not None:
                return m.end()
        return None

    def _checked(self, clause: str) -> str:
        if not self._leaks(clause):
            return clause
        self.redactions += 1
        if self._redacted_in_reply:
            return ""
        self._redacted_in_reply = True
        lead, trail = clause[: len(clause) - len(clause.lstrip())], clause[len(clause.rstrip()):]
        return lead + self._replacement + trail

    def _leaks(self, clause: str) -> bool:
        recent = len(self._recent_chars)
        words = self._recent_words + prompt_words(clause)
        chars = self._recent_chars + squashed(clause)
        # Kept one short of a whole run or canary: what was already checked cannot match again.
        self._recent_words = words[-(LEAK_RUN_WORDS - 1):]
        self._recent_chars = chars[-(self._longest_canary - 1):] if self._longest_canary > 1 else ""
        runs = (tuple(words[i:i + LEAK_RUN_WORDS]) for i in range(len(words) - LEAK_RUN_WORDS + 1))
        return (any(c in chars[max(0, recent - len(c) + 1):] for c in self._canaries)
                or any(run in self._prompt_runs for run in runs))


class MarkupStop:
    """Ends a reply where the model starts writing prompt markup (`<reference>`, the fence
    its passages came in): a small model that begins to regurgitate its context would read
    the whole block out. `feed(piece)` returns (text to pass on, done); a trailing piece of
    text that could still become a marker is held until the next piece or `flush()`."""

    def __init__(self, markers: Iterable[str]) -> None:
        self._markers = tuple(m.lower() for m in markers)
        self._held = ""
        self._done = False

    def feed(self, piece: str) -> tuple[str, bool]:
        if self._done:
            return "", True
        text, self._held = self._held + piece, ""
        lowered = text.lower()
        found = [i for i in (lowered.find(m) for m in self._markers) if i >= 0]
        if found:
            self._done = True
            return text[: min(found)].rstrip(), True
        keep = max((k for m in self._markers for k in range(1, len(m)) if lowered.endswith(m[:k])), default=0)
        if keep:
            text, self._held = text[:-keep], text[-keep:]
        return text, False

    def flush(self) -> str:
        held, self._held, self._done = self._held, "", False
        return held
