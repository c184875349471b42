"""LocalAgreement-2 (whisper_streaming's commit policy): a word is settled once two
consecutive hypotheses of the growing utterance agree on it and on every word before it.
Pure: hypotheses in, settled words and the tentative rest out.

Settled words never change afterwards: the next pass is forced to begin with them (or has
them put first), and only the words after them are compared. Comparison ignores case and
punctuation, which Whisper changes between passes ("week." becomes "week, please").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_NOT_WORD = re.compile(r"[^\w']+")


def _key(word: str) -> str:
    return _NOT_WORD.sub("", word.lower())


@dataclass
class LocalAgreement:
    committed: list[str] = field(default_factory=list)  # settled words, as first written
    tentative: list[str] = field(default_factory=list)  # the latest hypothesis' words after them
    _previous: list[str] | None = None  # the tail of the hypothesis before the latest

    @property
    def committed_text(self) -> str:
        return " ".join(self.committed)

    @property
    def text(self) -> str:
        """What the caller has said so far, as best known: settled, then tentative."""
        return " ".join(self.committed + self.tentative)

    def update(self, hypothesis: str) -> list[str]:
        """A new pass over the utterance so far; returns the words it settled."""
        words = hypothesis.split()
        tail = words[len(self.committed):]  # the engine puts the settled words first (transcribe_continuing)
        settled: list[str] = []
        if self._previous is not None:
            for before, now in zip(self._previous, tail):
                if _key(before) != _key(now) or not _key(now):
                    break
                settled.append(now)
        self.committed += settled
        self.tentative = tail[len(settled):]
        self._previous = self.tentative
        return settled

    def reset(self) -> None:
        self.committed, self.tentative, self._previous = [], [], None
