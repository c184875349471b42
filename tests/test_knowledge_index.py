"""KnowledgeIndex on a real SQLite file: schema, atomic writes, deletes, isolation, query
sanitising, fusion; and (slow) the needle test with the real embedder."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from knowledge.chunking import Chunk
from knowledge.errors import DocumentNotFound, KnowledgeSchemaError
from knowledge.index import KnowledgeIndex, agent_token
from knowledge.ranking import convex_fuse, fts_query, rrf_fuse
from knowledge.options import KnowledgeOptions
from tests.fakes import HashingEmbedder

EMBEDDER = HashingEmbedder()
CLINIC = ["Dr. Lee sees patients on Mondays.", "Parking is behind the bakery.", "A check-up costs 40 pounds.",
          "Flu jabs are given on Thursdays."]
SHOP = ["Returns of unworn shoes within 30 days.", "Parking is free after six.", "Gift cards never expire."]


def chunks(texts: list[str], source: str = "notes.txt") -> list[Chunk]:
    return [Chunk(text, None, n, source) for n, text in enumerate(texts)]


def add(index: KnowledgeIndex, agent: str, texts: list[str], sha: str | None = None) -> str:
    sha = sha or f"{agent}-{hash(tuple(texts))}"
    return index.add_document(agent, "notes.txt", "text", sha, 100, chunks(texts), EMBEDDER.embed_blocking(texts))


def search(index: KnowledgeIndex, agent: str, query: str, mode: str = "hybrid", k: int = 10):
    return index.search(agent, query, EMBEDDER.embed_blocking([query])[0], k, mode)


@pytest.fixture
def index(tmp_path):
    knowledge = KnowledgeIndex(str(tmp_path / "cadence.sqlite3"))
    knowledge.open()
    yield knowledge
    knowledge.close()


def counts(index: KnowledgeIndex) -> dict[str, int]:
    db = index.db
    return {"documents": db.execute("SELECT COUNT(*) FROM knowledge_documents").fetchone()[0],
            "chunks": db.execute("SELECT COUNT(*) FROM knowledge_chunks").fetchone()[0],
            "vectors": db.execute("SELECT COUNT(*) FROM knowledge_vectors").fetchone()[0],
            "fts": db.execute("SELECT COUNT(*) FROM knowledge_fts_docsize").fetchone()[0]}


def test_tables_live_beside_the_call_store_without_touching_its_version(tmp_path):
    path = str(tmp_path / "cadence.sqlite3")
    store = sqlite3.connect(path)
    store.execute("CREATE TABLE calls (id TEXT PRIMARY KEY)")
    store.execute("PRAGMA user_version = 5")
    store.commit()
    index = KnowledgeIndex(path)
    index.open()
    add(index, "clinic", CLINIC)
    assert index.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    index.close()
    index.open()  # reopening finds its own version and migrates nothing
    assert index.db.execute("SELECT version, dimensions FROM knowledge_schema").fetchall() == [(1, 384)]
    assert index.usage("clinic") == (1, len(CLINIC))
    index.close()
    assert store.execute("PRAGMA user_version").fetchone()[0] == 5
    assert store.execute("SELECT COUNT(*) FROM calls").fetchone()[0] == 0
    store.close()


def test_a_different_vector_length_is_refused_on_open(tmp_path):
    path = str(tmp_path / "k.sqlite3")
    KnowledgeIndex(path).open()
    with pytest.raises(KnowledgeSchemaError, match="384-dim"):
        KnowledgeIndex(path, KnowledgeOptions(dimensions=256, binary_candidates=100)).open()


def test_a_newer_schema_is_refused(tmp_path):
    path = str(tmp_path / "k.sqlite3")
    index = KnowledgeIndex(path)
    index.open()
    index.db.execute("UPDATE knowledge_schema SET version = 99")
    index.close()
    with pytest.raises(KnowledgeSchemaError, match="v99"):
        KnowledgeIndex(path).open()


def test_add_list_usage_and_duplicates(index):
    doc_id = add(index, "clinic", CLINIC, sha="abc")
    (listed,) = index.list_documents("clinic")
    assert (listed.id, listed.source, listed.kind, listed.sha256, listed.chunk_count) == (
        doc_id, "notes.txt", "text", "abc", len(CLINIC))
    assert add(index, "clinic", ["other text"], sha="abc") == doc_id  # same bytes: the stored id
    assert counts(index) == {"documents": 1, "chunks": 4, "vectors": 4, "fts": 4}
    assert index.find_document("shop", "abc") is None  # per agent


def test_vectors_of_the_wrong_shape_are_refused_before_writing(index):
    with pytest.raises(ValueError, match="shaped"):
        index.add_document("clinic", "a.txt", "text", "x", 1, chunks(CLINIC), np.zeros((2, 384), np.float32))
    with pytest.raises(ValueError):
        index.add_document("clinic", "a.txt", "text", "x", 1, chunks(["a"]), np.full((1, 384), np.nan, np.float32))
    assert counts(index) == {"documents": 0, "chunks": 0, "vectors": 0, "fts": 0}


class FailingIndex(KnowledgeIndex):
    """Fails after the document, its chunks and its FTS rows (and half its vectors) are written."""

    def _insert_vectors(self, agent, ids, vectors):
        super()._insert_vectors(agent, ids[: len(ids) // 2], vectors[: len(ids) // 2])
        raise RuntimeError("disk on fire")


def test_a_failure_mid_transaction_stores_nothing(tmp_path):
    path = str(tmp_path / "k.sqlite3")
    first = KnowledgeIndex(path)
    first.open()
    add(first, "clinic", SHOP, sha="kept")
    first.close()
    failing = FailingIndex(path)
    failing.open()
    before = counts(failing)
    with pytest.raises(RuntimeError, match="disk on fire"):
        add(failing, "clinic", CLINIC, sha="lost")
    assert counts(failing) == before
    assert failing.find_document("clinic", "lost") is None
    failing.close()
    index = KnowledgeIndex(path)  # and the index still works: the next add and search are whole
    index.open()
    add(index, "clinic", CLINIC, sha="again")
    assert counts(index) == {"documents": 2, "chunks": 7, "vectors": 7, "fts": 7}
    assert search(index, "clinic", "check-up cost")[0].text == "A check-up costs 40 pounds."
    index.close()


def test_delete_removes_from_both_indexes(index):
    doc_id = add(index, "clinic", CLINIC)
    kept = add(index, "clinic", ["Dr. Lee also sees patients on Fridays."])
    index.delete_document("clinic", doc_id)
    assert [d.id for d in index.list_documents("clinic")] == [kept]
    assert counts(index) == {"documents": 1, "chunks": 1, "vectors": 1, "fts": 1}
    for mode in ("lexical", "dense", "hybrid"):
        assert {h.doc_id for h in search(index, "clinic", "Dr. Lee Mondays parking", mode)} == {kept}
    index.db.execute("INSERT INTO knowledge_fts (knowledge_fts) VALUES ('integrity-check')")


def test_delete_of_another_agents_or_unknown_document_is_not_found(index):
    doc_id = add(index, "clinic", CLINIC)
    with pytest.raises(DocumentNotFound, match="shop"):
        index.delete_document("shop", doc_id)
    with pytest.raises(DocumentNotFound):
        index.delete_document("clinic", "nope")
    assert index.usage("clinic") == (1, 4)


def test_delete_agent_removes_only_that_agent(index):
    add(index, "clinic", CLINIC)
    add(index, "clinic", ["More clinic notes."])
    add(index, "shop", SHOP)
    assert index.delete_agent("clinic") == 2
    assert index.usage("clinic") == (0, 0) and index.usage("shop") == (1, 3)
    assert counts(index) == {"documents": 1, "chunks": 3, "vectors": 3, "fts": 3}
    assert search(index, "clinic", "parking") == []
    assert index.delete_agent("nobody") == 0


@pytest.mark.parametrize("names", [("clinic", "shop"), ("front-desk", "front_desk"), ("desk", "desk-2")])
@pytest.mark.parametrize("mode", ["hybrid", "dense", "lexical"])
def test_one_agents_chunks_never_answer_for_another(index, names, mode):
    """Agent names that tokenize alike ("front-desk", "front_desk") stay apart too."""
    first, second = names
    mine = add(index, first, CLINIC)
    theirs = add(index, second, CLINIC)  # identical text: only the agent differs
    for agent, own in ((first, mine), (second, theirs)):
        hits = search(index, agent, "parking Dr. Lee check-up flu jabs", mode)
        assert hits and {h.doc_id for h in hits} == {own}


def test_search_modes_scores_and_k(index):
    add(index, "clinic", CLINIC)
    dense = search(index, "clinic", "check-up costs", "dense", k=2)
    lexical = search(index, "clinic", "check-up costs", "lexical")
    hybrid = search(index, "clinic", "check-up costs", "hybrid", k=1)
    assert len(dense) == 2 and len(hybrid) == 1
    assert dense[0].text == lexical[0].text == hybrid[0].text == "A check-up costs 40 pounds."
    assert -1.0 <= dense[1].score <= dense[0].score <= 1.0001  # cosine
    assert lexical[0].score > 0  # -bm25
    assert hybrid[0].score == pytest.approx(1.0)  # convex (the default): first in both normalised lists
    assert hybrid[0].source == "notes.txt" and hybrid[0].heading is None
    with pytest.raises(ValueError):
        search(index, "clinic", "x", "magic")
    with pytest.raises(ValueError):
        search(index, "clinic", "x", k=0)


def test_reciprocal_rank_fusion_is_an_option(tmp_path):
    index = KnowledgeIndex(str(tmp_path / "k.sqlite3"), KnowledgeOptions(fusion="rrf"))
    index.open()
    add(index, "clinic", CLINIC)
    (best,) = search(index, "clinic", "check-up costs", k=1)
    assert best.text == "A check-up costs 40 pounds." and best.score == pytest.approx(2 / 61)  # 1/(60+1) twice
    index.close()


NASTY = ['"', "'", '"unclosed', "NEAR(parking bakery)", "parking NEAR/2 bakery", "*", "park*", "^parking",
         "(((", ")", "parking OR", "AND", "NOT parking", "parking AND NOT", "text:parking", "agent_token:x",
         "'; DROP TABLE knowledge_chunks; --", "\x00", "\u2603 \U0001F600", "-parking", "+parking",
         "{text agent_token}: parking", "parking\" OR \"1\"=\"1", "a" * 1000, "%_%", "\\", "?!.,;:"]


@pytest.mark.parametrize("query", NASTY)
def test_caller_text_never_breaks_the_fts_query(index, query):
    add(index, "clinic", CLINIC)
    add(index, "shop", SHOP)
    for mode in ("lexical", "hybrid", "dense"):
        hits = search(index, "clinic", query, mode)
        assert all(h.source == "notes.txt" and h.doc_id == index.list_documents("clinic")[0].id for h in hits)
    assert index.usage("clinic") == (1, 4)  # nothing dropped


@pytest.mark.parametrize("query", ["?!.,;:", "", "   ", "the what is it", "'\"()*^"])
def test_a_query_without_search_words_gets_dense_results_only(index, query):
    add(index, "clinic", CLINIC)
    assert fts_query(query) is None
    assert search(index, "clinic", query, "lexical") == []
    vector = EMBEDDER.embed_blocking(["parking"])[0]
    hybrid = index.search("clinic", query, vector, 3, "hybrid")
    dense = index.search("clinic", query, vector, 3, "dense")
    assert [h.chunk_id for h in hybrid] == [h.chunk_id for h in dense]


@pytest.mark.parametrize(("text", "query"), [
    ("Where is the parking?", '"parking"'),
    ('He said "NEAR(ab cd)" OR ef*', '"said" OR "near" OR "ab" OR "cd" OR "ef"'),
    ("a b c 7", '"7"'),  # single letters say nothing; single digits may (room 7)
    ("Caf\u00e9 opens at 9:30 a.m.", '"caf\u00e9" OR "opens" OR "9" OR "30"'),
    ("snake_case and x-ray x-ray", '"snake" OR "case" OR "ray"'),
    ("I can't, I don't", None),
])
def test_fts_query_quotes_distinct_non_stop_words(text, query):
    assert fts_query(text) == query


def test_fts_query_is_bounded():
    query = fts_query(" ".join(f"word{n}" for n in range(100)))
    assert query.count(" OR ") == 15


def test_lexical_search_leaves_words_in_too_many_chunks_to_dense(tmp_path):
    index = KnowledgeIndex(str(tmp_path / "k.sqlite3"), KnowledgeOptions(lexical_row_budget=3))
    index.open()
    notes = ["Parking at the clinic.", "The clinic opens early.", "The clinic closes late.",
             "The clinic has a lift.", "Dr. Okonkwo works at the clinic on Fridays."]
    add(index, "clinic", notes)
    add(index, "shop", ["Okonkwo shoes are sold here.", "Okonkwo boots too.", "Okonkwo socks.", "Okonkwo hats."])
    assert index.lexical_ranking("clinic", "clinic", 10) == []  # in 5 of the agent's chunks: over 3
    (hit,) = index.lexical_ranking("clinic", "clinic Okonkwo", 10)  # the shop's four do not count
    assert index.hits("clinic", [hit])[0].text == notes[4]
    assert [h.text for h in index.search("clinic", "clinic", EMBEDDER.embed_blocking(["clinic"])[0], 10)]
    index.close()


def test_agent_tokens_are_distinct_single_tokens():
    tokens = {agent_token(name) for name in ("front-desk", "front_desk", "front desk", "frontdesk", "desk")}
    assert len(tokens) == 5 and all(t.isalnum() for t in tokens)


def test_rrf_fuse_sums_reciprocal_ranks():
    fused = rrf_fuse([[1, 2, 3], [3, 1]], 60)
    assert [item for item, _ in fused] == [1, 3, 2]
    assert dict(fused)[1] == pytest.approx(1 / 61 + 1 / 62) and dict(fused)[2] == pytest.approx(1 / 62)
    assert rrf_fuse([[], []], 60) == []


def test_convex_fuse_keeps_score_margins():
    dense = [(1, 0.9), (2, 0.5), (3, 0.45)]
    lexical = [(3, 12.0), (2, 11.0), (9, 2.0)]
    fused = dict(convex_fuse(dense, lexical, 0.7))
    assert fused[1] == pytest.approx(0.7)
    assert fused[3] == pytest.approx(0.3)
    assert max(fused, key=fused.get) == 1
    assert convex_fuse([(5, 0.3)], [], 0.7) == [(5, pytest.approx(0.7))]


@pytest.mark.slow
def test_the_needle_is_found_among_same_topic_notes_with_the_real_embedder(tmp_path):
    """500 near-identical clinic notes (places, rooms, loans) and one note about a place named
    nowhere else; the question shares only the place's name with it."""
    from latency_bench.components.retrieval_bench import NEEDLE, distractor_notes
    from models.embedding import EmbeddingOptions, build_embedder

    embedder = build_embedder(EmbeddingOptions())
    embedder.load()
    notes = [*distractor_notes(500), NEEDLE[0]]
    index = KnowledgeIndex(str(tmp_path / "needle.sqlite3"))
    index.open()
    index.add_document("clinic", "notes.txt", "text", "n", 1, chunks(notes), embedder.embed_blocking(notes))
    question = embedder.embed_blocking([NEEDLE[1]])[0]
    ranks = {}
    for mode in ("dense", "lexical", "hybrid"):
        texts = [h.text for h in index.search("clinic", NEEDLE[1], question, 50, mode)]
        ranks[mode] = texts.index(NEEDLE[0]) + 1 if NEEDLE[0] in texts else None
    print(f"needle rank: dense {ranks['dense']}, lexical {ranks['lexical']}, hybrid {ranks['hybrid']}")
    index.close()
    assert ranks["hybrid"] is not None and ranks["hybrid"] <= 3
