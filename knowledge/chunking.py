"""Documents -> retrieval chunks of whole sentences (pure: no I/O).

A chunk never crosses a section (heading) boundary: a fact read with another section's
heading would answer the wrong question. Chunks are packed from whole sentences up to
`target_words` and repeat the last `overlap_sentences` sentences of the chunk before, so
a fact that a cut falls across is still whole in one of them. Each chunk's text starts
with its heading path, so "Saturdays 10-2" is found for "weekend opening hours" when the
heading says "Opening hours"; the heading is kept apart too.

Invariant: a chunk's body (text without the heading line) has at most `target_words` words.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from knowledge.documents import Document

# Words after which a full stop does not end the sentence ("Dr. Lee", "e.g. this", "9 a.m. Monday").
# Merging two short sentences costs nothing; cutting "Dr." from "Lee" splits a name from its fact.
ABBREVIATIONS = frozenset({
    "dr", "mr", "mrs", "ms", "mx", "prof", "rev", "st", "mt", "ft", "jr", "sr", "vs", "v", "e.g", "i.e",
    "a.m", "p.m", "approx", "cf", "fig", "no", "nos", "tel", "ext", "apt", "ave", "blvd", "rd", "dept",
    "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
    "mon", "tue", "tues", "wed", "thu", "thur", "thurs", "fri", "sat", "sun", "u.s", "u.k", "ph.d", "al",
})
# Sentence-ending punctuation (closing quotes and brackets stay with it), then the gap.
_SENTENCE_END = re.compile(r"[.!?\u2026]+[\"'\u201d\u2019)\]]*(\s+)")
# Where an over-long sentence may be cut when it has no full stop: after a clause mark.
_CLAUSE_END = re.compile(r"(?<=[,;:\u2014\u2013])\s+|\s+(?=[\u2014\u2013-]\s)")


@dataclass(frozen=True)
class Chunk:
    text: str  # heading path, a newline, then the body: what is embedded, indexed and quoted
    heading: str | None  # the section's heading path
    position: int  # index of the chunk in its document, from 0
    source: str  # the document's file name


@dataclass(frozen=True)
class _Sentence:
    text: str
    words: int
    starts_block: bool  # first sentence of a paragraph or list item: joined with a newline


def split_sentences(block: str) -> list[str]:
    """One paragraph -> its sentences, without cutting at abbreviations, decimals or times."""
    sentences, start = [], 0
    for match in _SENTENCE_END.finditer(block):
        if _ends_sentence(block, match):
            sentences.append(block[start:match.start(1)].strip())
            start = match.end()
    tail = block[start:].strip()
    return [s for s in [*sentences, tail] if s]


def _ends_sentence(block: str, match: re.Match) -> bool:
    following = block[match.end():match.end() + 1]
    if following.islower():
        return False  # "approx. five", "e.g. this": a sentence does not start in lower case
    punctuation = match.group(0).rstrip()
    if punctuation.rstrip("\"'\u201d\u2019)]") != ".":
        return True  # "?", "!", "..." end a sentence
    before = block[:match.start()].split()
    word = before[-1].lstrip("\"'(\u201c\u2018[").lower() if before else ""
    if word in ABBREVIATIONS:
        return False
    return bool(word) and not (len(word) == 1 and word.isalpha())  # an initial: "J. Smith"


def fit_sentence(sentence: str, max_words: int) -> list[str]:
    """A sentence of at most `max_words` words as it is; a longer one cut after clause
    marks (, ; : and dashes), and a clause still too long cut every `max_words` words."""
    if len(sentence.split()) <= max_words:
        return [sentence]
    pieces: list[str] = []
    current: list[str] = []
    for clause in _CLAUSE_END.split(sentence):
        words = clause.split()
        while len(words) > max_words:
            pieces.extend(filter(None, [" ".join(current)]))
            current = []
            pieces.append(" ".join(words[:max_words]))
            words = words[max_words:]
        if current and len(current) + len(words) > max_words:
            pieces.append(" ".join(current))
            current = []
        current.extend(words)
    pieces.extend(filter(None, [" ".join(current)]))
    return pieces


def _sentences(section_text: str, max_words: int) -> list[_Sentence]:
    out = []
    for block in section_text.split("\n"):
        first = True
        for sentence in split_sentences(block):
            for piece in fit_sentence(sentence, max_words):
                out.append(_Sentence(piece, len(piece.split()), first))
                first = False
    return out


def _join(sentences: list[_Sentence]) -> str:
    parts = [sentences[0].text]
    for sentence in sentences[1:]:
        parts.append(("\n" if sentence.starts_block else " ") + sentence.text)
    return "".join(parts)


def _pack(sentences: list[_Sentence], target_words: int, overlap_sentences: int) -> Iterator[str]:
    """Greedy: add sentences while they fit; on overflow emit, then start from the overlap.
    The overlap is cut from its front until it leaves room for the next sentence and takes
    at most half the target, so every chunk brings mostly new text."""
    current: list[_Sentence] = []
    fresh = 0  # sentences in `current` that the previous chunk did not hold
    for sentence in sentences:
        if fresh and sum(s.words for s in current) + sentence.words > target_words:
            yield _join(current)
            current = current[len(current) - overlap_sentences:] if overlap_sentences else []
            while current and (sum(s.words for s in current) + sentence.words > target_words
                               or sum(s.words for s in current) > target_words // 2):
                current.pop(0)
            fresh = 0
        current.append(sentence)
        fresh += 1
    if fresh:
        yield _join(current)


def chunk_document(document: Document, *, target_words: int, overlap_sentences: int) -> list[Chunk]:
    if target_words < 1 or overlap_sentences < 0:
        raise ValueError("target_words must be >= 1 and overlap_sentences >= 0")
    chunks: list[Chunk] = []
    for section in document.sections:
        for body in _pack(_sentences(section.text, target_words), target_words, overlap_sentences):
            text = f"{section.heading}\n{body}" if section.heading else body
            chunks.append(Chunk(text=text, heading=section.heading, position=len(chunks), source=document.source))
    return chunks
