"""Cutting a sentence too long for one synthesis run into pieces a voice speaks one after another.

Both voices say a sentence in one model run: Orpheus' quality drops past ~30 s of speech in one
request, and Piper holds a whole sentence's audio (and its workspace, which ONNX Runtime's arena
keeps for good) before the first of it can play. Pure text work, shared by both engines.
"""

from __future__ import annotations

# Where a cut reads most naturally, best first: after a clause's punctuation, then before a
# word that opens a new phrase (a run-on sentence from a small LLM often has no comma at all).
_CLAUSE_BREAKS = (", ", "; ", ": ")
_PHRASE_OPENERS = (" and ", " but ", " or ", " so ", " because ", " which ", " while ")


def split_long_text(text: str, max_chars: int) -> list[str]:
    """`text` with its whitespace squashed, in pieces of at most `max_chars` characters: a
    longer stretch is cut at its last clause break, else before its last phrase opener (either
    only if that leaves the piece at least a third full, so a cut never strands a word or two),
    else at its last space, else anywhere."""
    if max_chars < 1:
        raise ValueError(f"max_chars must be positive, got {max_chars}")
    text = " ".join(text.split())
    parts: list[str] = []
    while len(text) > max_chars:
        window, shortest = text[:max_chars], max_chars // 3
        cut = max(window.rfind(mark) for mark in _CLAUSE_BREAKS) + 1  # after the mark
        if cut <= shortest:
            cut = max(window.rfind(opener) for opener in _PHRASE_OPENERS)  # before the word
        if cut <= shortest:
            cut = window.rfind(" ")
        cut = cut if cut > 0 else max_chars
        parts.append(text[:cut].strip())
        text = text[cut:].strip()
    return parts + ([text] if text else [])
