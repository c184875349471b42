"""Sections -> chunks: sentence boundaries, sizes, overlap and headings, exhaustively."""

from __future__ import annotations

import random

import pytest

from knowledge.chunking import Chunk, chunk_document, fit_sentence, split_sentences
from knowledge.documents import Document, Section


def doc(*sections: Section, source: str = "notes.md") -> Document:
    return Document(source=source, kind="markdown", sections=tuple(sections))


def body(chunk: Chunk) -> str:
    """The chunk's text without its heading line."""
    return chunk.text[len(chunk.heading) + 1:] if chunk.heading else chunk.text


@pytest.mark.parametrize(("text", "sentences"), [
    ("One. Two! Three? Four", ["One.", "Two!", "Three?", "Four"]),
    ("Dr. Lee and Mrs. Park see you. Then pay.", ["Dr. Lee and Mrs. Park see you.", "Then pay."]),
    ("Bring ID, e.g. a passport. Or i.e. anything.", ["Bring ID, e.g. a passport.", "Or i.e. anything."]),
    ("The fee is $12.50 today. It rose 3.5% in 2024.", ["The fee is $12.50 today.", "It rose 3.5% in 2024."]),
    ("We open at 9:30 a.m. Monday to Friday. Late on Thursdays.",
     ["We open at 9:30 a.m. Monday to Friday.", "Late on Thursdays."]),
    ("Closes at 5 p.m. on Fridays.", ["Closes at 5 p.m. on Fridays."]),
    ("Ask for J. R. Smith at reception. He helps.", ["Ask for J. R. Smith at reception.", "He helps."]),
    ('She said "come in." Then we began.', ['She said "come in."', "Then we began."]),
    ("Open (mostly.) Closed Sundays.", ["Open (mostly.)", "Closed Sundays."]),
    ("Wait... What? Really!! Yes.", ["Wait...", "What?", "Really!!", "Yes."]),
    ("approx. five minutes. Fine.", ["approx. five minutes.", "Fine."]),
    ("Room no. 4 is upstairs. St. Mary's is next door.", ["Room no. 4 is upstairs.", "St. Mary's is next door."]),
    ("Visit www.example.com today. Thanks.", ["Visit www.example.com today.", "Thanks."]),
    ("No full stop at all", ["No full stop at all"]),
    ("   ", []),
    (". Odd start. Fine.", [". Odd start.", "Fine."]),
])
def test_sentence_splitting(text, sentences):
    assert split_sentences(text) == sentences


def test_a_short_sentence_fits_as_it_is():
    assert fit_sentence("one two three", 3) == ["one two three"]


def test_a_long_sentence_is_cut_after_clause_marks_first():
    sentence = "alpha beta gamma, delta epsilon; zeta eta theta: iota kappa"
    # Clauses are packed greedily: "alpha beta gamma," + "delta epsilon;" is 5 words.
    assert fit_sentence(sentence, 5) == ["alpha beta gamma, delta epsilon;", "zeta eta theta: iota kappa"]
    assert fit_sentence(sentence, 4) == ["alpha beta gamma,", "delta epsilon;", "zeta eta theta:", "iota kappa"]


def test_a_long_clause_is_cut_at_word_boundaries():
    words = [f"w{i}" for i in range(23)]
    pieces = fit_sentence(" ".join(words), 10)
    assert pieces == [" ".join(words[:10]), " ".join(words[10:20]), " ".join(words[20:])]


def test_dashes_are_clause_boundaries():
    assert fit_sentence("one two - three four \u2014 five six", 3) == ["one two", "- three four", "\u2014 five six"]


def test_fit_sentence_loses_no_words_and_respects_the_limit():
    rng = random.Random(7)
    for _ in range(200):
        words = [rng.choice(["a", "bb,", "c;", "dd", "e:", "-", "f"]) for _ in range(rng.randint(1, 80))]
        limit = rng.randint(1, 15)
        pieces = fit_sentence(" ".join(words), limit)
        assert " ".join(pieces).split() == words
        assert all(1 <= len(p.split()) <= limit for p in pieces)


def test_short_section_is_one_chunk_with_its_heading_prefixed():
    chunks = chunk_document(doc(Section("Clinic > Hours", "We open at nine. We close at five.")),
                            target_words=50, overlap_sentences=1)
    assert chunks == [Chunk("Clinic > Hours\nWe open at nine. We close at five.", "Clinic > Hours", 0, "notes.md")]


def test_no_heading_no_prefix():
    (chunk,) = chunk_document(doc(Section(None, "Just text.")), target_words=50, overlap_sentences=1)
    assert chunk.text == "Just text." and chunk.heading is None


def test_chunks_never_cross_sections_and_positions_count_through_the_document():
    chunks = chunk_document(doc(Section("A", "One. Two."), Section("B", "Three. Four.")),
                            target_words=100, overlap_sentences=1)
    assert [(c.heading, body(c), c.position) for c in chunks] == [("A", "One. Two.", 0), ("B", "Three. Four.", 1)]


def test_overlap_repeats_the_last_sentence_of_the_previous_chunk():
    text = "S1 aa bb. S2 cc dd. S3 ee ff. S4 gg hh. S5 ii jj."
    chunks = chunk_document(doc(Section(None, text)), target_words=6, overlap_sentences=1)
    assert [body(c) for c in chunks] == ["S1 aa bb. S2 cc dd.", "S2 cc dd. S3 ee ff.", "S3 ee ff. S4 gg hh.",
                                         "S4 gg hh. S5 ii jj."]


def test_no_overlap_when_zero():
    text = "S1 aa bb. S2 cc dd. S3 ee ff."
    chunks = chunk_document(doc(Section(None, text)), target_words=6, overlap_sentences=0)
    assert [body(c) for c in chunks] == ["S1 aa bb. S2 cc dd.", "S3 ee ff."]


def test_overlap_that_would_crowd_out_new_text_is_dropped():
    # The carried sentence has 4 words, over half the 6-word target: not repeated.
    text = "Aa bb cc dd. Ee ff gg hh. Ii jj."
    chunks = chunk_document(doc(Section(None, text)), target_words=6, overlap_sentences=1)
    assert [body(c) for c in chunks] == ["Aa bb cc dd.", "Ee ff gg hh. Ii jj."]


def test_the_last_chunk_is_never_only_overlap():
    chunks = chunk_document(doc(Section(None, "Aa bb. Cc dd. Ee ff.")), target_words=4, overlap_sentences=2)
    assert [body(c) for c in chunks] == ["Aa bb. Cc dd.", "Cc dd. Ee ff."]


def test_blocks_stay_on_their_own_lines_within_a_chunk():
    chunks = chunk_document(doc(Section("Hours", "Monday 9-5\nTuesday 9-5\nWe close on holidays. Sorry.")),
                            target_words=50, overlap_sentences=1)
    assert body(chunks[0]) == "Monday 9-5\nTuesday 9-5\nWe close on holidays. Sorry."


def test_a_sentence_longer_than_the_target_is_split_not_dropped():
    long = " ".join(f"w{i}" for i in range(25)) + "."
    chunks = chunk_document(doc(Section(None, f"Short one. {long} After.")), target_words=10, overlap_sentences=1)
    assert all(len(body(c).split()) <= 10 for c in chunks)
    seen = " ".join(body(c) for c in chunks).split()
    for word in ["Short", *(f"w{i}" for i in range(25)), "After."]:
        assert any(word.strip(".") == w.strip(".") for w in seen)


def test_an_empty_document_has_no_chunks():
    assert chunk_document(doc(), target_words=10, overlap_sentences=1) == []
    assert chunk_document(doc(Section("H", "  \n ")), target_words=10, overlap_sentences=1) == []


@pytest.mark.parametrize(("target", "overlap"), [(0, 1), (10, -1)])
def test_bad_parameters_are_refused(target, overlap):
    with pytest.raises(ValueError):
        chunk_document(doc(Section(None, "x.")), target_words=target, overlap_sentences=overlap)


@pytest.mark.parametrize("seed", range(30))
def test_invariants_on_random_documents(seed):
    """Every sentence lands in some chunk, in order; no body exceeds the target; sources and
    positions are right; consecutive chunks of a section share exactly the overlap or nothing."""
    rng = random.Random(seed)
    vocabulary = ["clinic", "opens", "at", "nine", "Dr.", "Lee", "e.g.", "9:30", "a.m.", "fee", "$12.50",
                  "parking", "free", "on", "weekends", "and", "holidays"]
    sections = []
    for s in range(rng.randint(1, 4)):
        blocks = []
        for _ in range(rng.randint(1, 4)):
            sentences = [" ".join(rng.choice(vocabulary) for _ in range(rng.randint(1, 30))) + "."
                         for _ in range(rng.randint(1, 8))]
            blocks.append(" ".join(sentences))
        sections.append(Section(rng.choice([None, f"H{s}"]), "\n".join(blocks)))
    target, overlap = rng.randint(5, 60), rng.randint(0, 2)
    chunks = chunk_document(doc(*sections, source="r.md"), target_words=target, overlap_sentences=overlap)
    assert [c.position for c in chunks] == list(range(len(chunks)))
    assert all(c.source == "r.md" and 1 <= len(body(c).split()) <= target for c in chunks)
    for section in sections:
        words = section.text.split()
        mine = [c for c in chunks if c.heading == section.heading]
        joined = " ".join(body(c) for c in mine).split()
        assert set(words) <= set(joined)  # nothing lost (duplicates come only from overlap)
