"""Cutting sentences too long for one synthesis run (models/long_text.py), shared by both voices."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from models.long_text import split_long_text


def test_a_run_on_sentence_is_cut_at_a_clause_break_else_before_a_phrase_opener():
    with_commas = "We open at nine on weekdays, at ten on Saturdays, and we close at noon on Sundays, except in August."
    assert split_long_text(with_commas, 60) == ["We open at nine on weekdays, at ten on Saturdays,",
                                               "and we close at noon on Sundays, except in August."]
    no_commas = "The clinic keeps your records for ten years and sends them to your doctor when you ask for them"
    assert split_long_text(no_commas, 70) == ["The clinic keeps your records for ten years",
                                             "and sends them to your doctor when you ask for them"]


def test_a_cut_never_strands_a_word_or_two_at_a_break_too_early_in_the_piece():
    text = "Yes, the clinic keeps your records for ten years before it deletes every one of them for good"
    pieces = split_long_text(text, 60)
    assert pieces[0] != "Yes," and all(len(p) <= 60 for p in pieces)


def test_short_text_is_one_piece_and_text_without_spaces_is_cut_anywhere():
    assert split_long_text("  Short.\n", 300) == ["Short."]
    assert split_long_text("", 300) == []
    assert split_long_text("x" * 700, 300) == ["x" * 300, "x" * 300, "x" * 100]
    with pytest.raises(ValueError):
        split_long_text("text", 0)


@given(st.text(alphabet=st.sampled_from("ab ,;:.\n"), max_size=400), st.integers(min_value=1, max_value=120))
def test_pieces_fit_and_keep_every_character_in_order(text, max_chars):
    pieces = split_long_text(text, max_chars)
    assert all(0 < len(piece) <= max_chars for piece in pieces)
    assert all(piece == piece.strip() for piece in pieces)
    assert "".join(pieces).replace(" ", "") == "".join(text.split())
