"""Segments' transcripts, finished in any order, back into one timeline. Pure."""

from __future__ import annotations

from collections.abc import Iterable

from transcription.result import Piece


def stitch(segments: Iterable[tuple[float, float, list[Piece]]]) -> list[Piece]:
    """(segment start, segment end, its pieces with times from the segment's start) ->
    pieces on the recording's clock, in order, each inside its segment, never overlapping
    the one before (Whisper's timestamps may spill past a segment's edges)."""
    out: list[Piece] = []
    for start, end, pieces in sorted(segments, key=lambda s: s[0]):
        for piece in pieces:
            text = piece.text.strip()
            if not text:
                continue
            begin = min(max(start + piece.start, start, out[-1].end if out else 0.0), end)
            finish = min(max(start + piece.end, begin), end)
            out.append(Piece(round(begin, 3), round(finish, 3), text, piece.avg_logprob, piece.speaker, piece.suspect))
    return out
