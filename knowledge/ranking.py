"""Ranking pieces of hybrid search, pure: caller text -> a safe FTS5 query, and the fusion
of the lexical (BM25) and dense (cosine) rankings into one."""

from __future__ import annotations

import re
from collections.abc import Sequence

from knowledge.options import KnowledgeOptions

MAX_QUERY_TERMS = 16  # each term costs a count and a posting list; a 1000-char question stops here
# Words too common to tell chunks apart; a question is mostly these ("what time do you ...").
STOP_WORDS = frozenset("""
a about above after again all also am an and any are as at be been before being below between both
but by can could did do does doing down during each few for from further had has have having he her
here hers him his how i if in into is it its just me more most my no nor not now of off on once only
or other our ours out over own same she should so some such than that the their them then there
these they this those through to too under until up very was we were what when where which while
who whom why will with would you your yours yourself hi hello please thanks thank tell know like
s t d ll re ve m don doesn didn isn aren wasn weren won couldn shouldn wouldn haven hasn hadn
""".split())  # the last line: pieces of contractions ("can't" -> "can", "t")


def query_terms(text: str) -> list[str]:
    """Caller text -> its distinct non-stop words (runs of letters and digits), in order, at
    most MAX_QUERY_TERMS. Quotes, NEAR, *, ^, column filters and parentheses cannot pass."""
    terms: list[str] = []
    for word in re.findall(r"[^\W_]+", text.lower()):
        if word not in STOP_WORDS and word not in terms and (len(word) > 1 or word.isdigit()):
            terms.append(word)
    return terms[:MAX_QUERY_TERMS]


def fts_query(text: str) -> str | None:
    """A safe FTS5 OR query of the text's terms, each quoted; None when no term is left
    (punctuation only, stop words only)."""
    terms = query_terms(text)
    return " OR ".join(f'"{term}"' for term in terms) if terms else None


def fuse(lexical: Sequence[tuple[int, float]], dense: Sequence[tuple[int, float]], mode: str,
         options: KnowledgeOptions) -> list[tuple[int, float]]:
    """The ranking a search mode answers with, from the two retrievers' rankings."""
    if mode == "hybrid" and options.fusion == "convex":
        return convex_fuse(dense, lexical, options.dense_weight)
    if mode == "hybrid":
        return rrf_fuse([[i for i, _ in lexical], [i for i, _ in dense]], options.rrf_k)
    return list(lexical if mode == "lexical" else dense)


def convex_fuse(dense: Sequence[tuple[int, float]], lexical: Sequence[tuple[int, float]],
                dense_weight: float) -> list[tuple[int, float]]:
    """Convex combination of min-max normalised scores (Bruch et al., 2023): unlike ranks,
    scores keep the margin by which dense search prefers its best hit, so a paraphrase whose
    only shared word is a common place name is not outvoted by the notes that name it."""
    scores: dict[int, float] = {}
    for ranking, weight in ((dense, dense_weight), (lexical, 1.0 - dense_weight)):
        if not ranking:
            continue
        high, low = max(s for _, s in ranking), min(s for _, s in ranking)
        for item, score in ranking:
            normalised = (score - low) / (high - low) if high > low else 1.0
            scores[item] = scores.get(item, 0.0) + weight * normalised
    return sorted(scores.items(), key=lambda pair: (-pair[1], pair[0]))


def rrf_fuse(rankings: Sequence[Sequence[int]], rrf_k: int) -> list[tuple[int, float]]:
    """Reciprocal rank fusion: ids by sum(1 / (rrf_k + rank)) over the lists, rank from 1."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (rrf_k + rank)
    return sorted(scores.items(), key=lambda pair: (-pair[1], pair[0]))


