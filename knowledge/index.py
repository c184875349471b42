"""Agents' knowledge in SQLite: chunks, a BM25 index (FTS5) and a vector index (sqlite-vec).

Synchronous, over one connection; `KnowledgeBase` runs each instance on a thread of its
own. The file is the server's call store: the store versions its tables with PRAGMA
user_version, so the knowledge tables keep their own version (and the vector length) in
`knowledge_schema`.

    knowledge_documents  one row per uploaded file; (agent, sha256) is unique: a re-upload
                         of the same bytes returns the stored document's id (idempotent, so
                         `cadence ingest` may run over a folder again)
    knowledge_chunks     chunk text and its embedding as float16 (768 B instead of 1536 B;
                         cosine errors ~1e-3, far below the gaps between neighbours)
    knowledge_fts        FTS5, contentless (the text lives once, in knowledge_chunks). The
                         tokenizer is porter over unicode61: callers paraphrase, and stemming
                         matches "appointments"/"appointment", "opening"/"open"; unicode61
                         folds case and (remove_diacritics 2) accents, so "cafe" finds "café".
                         A second column holds one opaque token per agent (`agent_token`), so
                         the match itself is filtered to the agent and BM25 scores only its rows.
    knowledge_vectors    sqlite-vec vec0 of the 384-dim vectors as bits (sign of each
                         dimension), partitioned by agent: a search reads only that agent's
                         vectors. Brute-force KNN at 100k chunks on 2 cores (latency_bench.
                         retrieval_bench): float32 ~67 ms, int8 ~58 ms (no SIMD path for int8
                         cosine), bit ~10 ms for 100 candidates, which are re-scored by exact
                         cosine from the float16 copies (<1 ms). Only bit + re-scoring meets the
                         20 ms p95 goal for embedding + search; on MiniLM vectors it keeps every
                         needle that exact float search ranks in the top 3 (recall@10 against
                         exact search: 0.81 on the bench's near-duplicate notes, ~0.99 on varied text).

Isolation: every query is filtered to one agent twice, in the index (partition key, agent
token) and again when rows are read (`knowledge_chunks.agent = ?`).

Scores: hybrid is, with fusion "convex" (the default), the weighted sum of min-max
normalised scores, in [0, 1] (with "rrf", sum(1 / (rrf_k + rank))); dense is the cosine
similarity; lexical is -bm25 (higher is better in all). The query terms and the fusion are
in knowledge/ranking.py; the sqlite-vec loading in knowledge/connection.py.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from knowledge.chunking import Chunk
from knowledge.errors import DocumentNotFound, KnowledgeError, KnowledgeSchemaError
from knowledge.connection import connect
from knowledge.options import SEARCH_MODES, KnowledgeOptions
from knowledge.ranking import fuse, query_terms

SCHEMA_VERSION = 1
# version reached -> statements that bring the previous version there
_MIGRATIONS: dict[int, tuple[str, ...]] = {}
_TABLES = """
CREATE TABLE knowledge_documents (
    id TEXT PRIMARY KEY,
    agent TEXT NOT NULL,
    source TEXT NOT NULL,          -- the uploaded file's name
    kind TEXT NOT NULL,            -- text, markdown, html, pdf
    size_bytes INTEGER NOT NULL,
    sha256 TEXT NOT NULL,          -- of the uploaded bytes
    chunk_count INTEGER NOT NULL,
    created_at REAL NOT NULL,
    UNIQUE (agent, sha256)
);
CREATE TABLE knowledge_chunks (
    id INTEGER PRIMARY KEY,
    doc_id TEXT NOT NULL REFERENCES knowledge_documents(id),
    agent TEXT NOT NULL,
    position INTEGER NOT NULL,     -- index of the chunk in its document
    heading TEXT,                  -- heading path, "Clinic > Opening hours"
    text TEXT NOT NULL,            -- heading path + body: what was embedded and indexed
    embedding BLOB NOT NULL        -- float16, L2-normalised
);
CREATE INDEX knowledge_chunks_doc ON knowledge_chunks(doc_id);
CREATE VIRTUAL TABLE knowledge_fts USING fts5(
    text, agent_token, content='', tokenize='porter unicode61 remove_diacritics 2');
CREATE VIRTUAL TABLE knowledge_vectors USING vec0(
    chunk_id INTEGER PRIMARY KEY, agent TEXT PARTITION KEY, embedding bit[{dimensions}]);
"""
MMAP_BYTES = 256 * 1024 * 1024  # reads of vector chunks skip the page cache copy
BUSY_TIMEOUT_S = 10.0  # the call store writes to the same file; wait for its lock this long
@dataclass(frozen=True)
class SearchHit:
    chunk_id: int
    doc_id: str
    text: str
    heading: str | None
    source: str
    score: float  # hybrid: fused RRF score; dense: cosine; lexical: -bm25 (higher is better)


@dataclass(frozen=True)
class StoredDocument:
    id: str
    agent: str
    source: str
    kind: str
    size_bytes: int
    sha256: str
    chunk_count: int
    created_at: float


def agent_token(agent: str) -> str:
    """One FTS token per agent: letters then digits, which no tokenizer splits or stems."""
    return "agent" + str(int.from_bytes(hashlib.sha256(agent.encode()).digest()[:8], "big"))


class KnowledgeIndex:
    def __init__(self, path: str, options: KnowledgeOptions | None = None, *, clock=time.time) -> None:
        self._path = path
        self._options = options or KnowledgeOptions()
        self._clock = clock
        self._db: sqlite3.Connection | None = None

    # --- lifecycle -------------------------------------------------------------------

    def open(self) -> None:
        db = connect(self._path, timeout=BUSY_TIMEOUT_S)
        try:
            db.execute("PRAGMA journal_mode = WAL")
            db.execute(f"PRAGMA mmap_size = {MMAP_BYTES}")
            self._db = db
            self._migrate()
        except BaseException:
            db.close()
            self._db = None
            raise

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def _migrate(self) -> None:
        with self._transaction() as db:
            db.execute("CREATE TABLE IF NOT EXISTS knowledge_schema "
                       "(version INTEGER NOT NULL, dimensions INTEGER NOT NULL)")
            row = db.execute("SELECT version, dimensions FROM knowledge_schema").fetchone()
            dimensions = self._options.dimensions
            if row is None:
                for statement in _TABLES.format(dimensions=dimensions).split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute("INSERT INTO knowledge_schema VALUES (?, ?)", (SCHEMA_VERSION, dimensions))
                return
            version, stored_dimensions = row
            if version > SCHEMA_VERSION:
                raise KnowledgeSchemaError(f"{self._path}: knowledge tables are v{version}, newer than this "
                                           f"Cadence (v{SCHEMA_VERSION}); upgrade Cadence")
            if stored_dimensions != dimensions:
                raise KnowledgeSchemaError(
                    f"{self._path}: knowledge was indexed with {stored_dimensions}-dim vectors but the embedder "
                    f"gives {dimensions}; use the same embedder, or delete every agent's knowledge and re-ingest")
            for target in range(version + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[target]:
                    db.execute(statement)
            db.execute("UPDATE knowledge_schema SET version = ?", (SCHEMA_VERSION,))

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            raise KnowledgeError("the knowledge index is not open; call open() first")
        return self._db

    def _transaction(self):
        return _Transaction(self.db)

    # --- writes ----------------------------------------------------------------------

    def add_document(self, agent: str, source: str, kind: str, data_sha256: str, size_bytes: int,
                     chunks: Sequence[Chunk], vectors: np.ndarray) -> str:
        """Stores a document, its chunks, their FTS rows and vectors in one transaction, and
        returns its id; the same bytes again for the same agent return the stored id."""
        vectors = self._checked_vectors(chunks, vectors)
        with self._transaction() as db:
            existing = self.find_document(agent, data_sha256)
            if existing is not None:
                return existing.id
            doc_id = uuid.uuid4().hex
            db.execute("INSERT INTO knowledge_documents VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       (doc_id, agent, source, kind, size_bytes, data_sha256, len(chunks), self._clock()))
            first = db.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM knowledge_chunks").fetchone()[0]
            ids = list(range(first, first + len(chunks)))
            self._insert_chunks(doc_id, agent, ids, chunks, vectors)
            self._insert_fts(agent, ids, chunks)
            self._insert_vectors(agent, ids, vectors)
            return doc_id

    def _checked_vectors(self, chunks: Sequence[Chunk], vectors: np.ndarray) -> np.ndarray:
        vectors = np.asarray(vectors, dtype=np.float32)
        expected = (len(chunks), self._options.dimensions)
        if vectors.shape != expected or not np.isfinite(vectors).all():
            raise ValueError(f"vectors must be finite, shaped {expected}; got {vectors.shape}")
        return vectors

    def _insert_chunks(self, doc_id: str, agent: str, ids: list[int], chunks: Sequence[Chunk],
                       vectors: np.ndarray) -> None:
        halves = vectors.astype(np.float16)
        self.db.executemany(
            "INSERT INTO knowledge_chunks (id, doc_id, agent, position, heading, text, embedding) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(i, doc_id, agent, c.position, c.heading, c.text, halves[n].tobytes())
             for n, (i, c) in enumerate(zip(ids, chunks, strict=True))])

    def _insert_fts(self, agent: str, ids: list[int], chunks: Sequence[Chunk]) -> None:
        token = agent_token(agent)
        self.db.executemany("INSERT INTO knowledge_fts (rowid, text, agent_token) VALUES (?, ?, ?)",
                            [(i, c.text, token) for i, c in zip(ids, chunks, strict=True)])

    def _insert_vectors(self, agent: str, ids: list[int], vectors: np.ndarray) -> None:
        bits = np.packbits(vectors > 0, axis=1)
        self.db.executemany("INSERT INTO knowledge_vectors (chunk_id, agent, embedding) VALUES (?, ?, vec_bit(?))",
                            [(i, agent, bits[n].tobytes()) for n, i in enumerate(ids)])

    def delete_document(self, agent: str, doc_id: str) -> None:
        with self._transaction() as db:
            found = db.execute("SELECT 1 FROM knowledge_documents WHERE id = ? AND agent = ?",
                               (doc_id, agent)).fetchone()
            if found is None:
                raise DocumentNotFound(f"agent {agent!r} has no document {doc_id!r}; "
                                       f"GET /api/agents/{agent}/knowledge lists them")
            self._delete_documents(agent, [doc_id])

    def delete_agent(self, agent: str) -> int:
        """Removes all of an agent's knowledge; returns how many documents it had."""
        with self._transaction() as db:
            doc_ids = [row[0] for row in db.execute("SELECT id FROM knowledge_documents WHERE agent = ?", (agent,))]
            self._delete_documents(agent, doc_ids)
            return len(doc_ids)

    def _delete_documents(self, agent: str, doc_ids: list[str]) -> None:
        token = agent_token(agent)
        for doc_id in doc_ids:
            rows = self.db.execute("SELECT id, text FROM knowledge_chunks WHERE doc_id = ?", (doc_id,)).fetchall()
            # A contentless FTS row is removed by repeating exactly what was indexed.
            self.db.executemany("INSERT INTO knowledge_fts (knowledge_fts, rowid, text, agent_token) "
                                "VALUES ('delete', ?, ?, ?)", [(i, text, token) for i, text in rows])
            self.db.executemany("DELETE FROM knowledge_vectors WHERE chunk_id = ?", [(i,) for i, _ in rows])
            self.db.execute("DELETE FROM knowledge_chunks WHERE doc_id = ?", (doc_id,))
            self.db.execute("DELETE FROM knowledge_documents WHERE id = ?", (doc_id,))

    # --- reads -----------------------------------------------------------------------

    def find_document(self, agent: str, data_sha256: str) -> StoredDocument | None:
        row = self.db.execute("SELECT * FROM knowledge_documents WHERE agent = ? AND sha256 = ?",
                              (agent, data_sha256)).fetchone()
        return StoredDocument(*row) if row else None

    def list_documents(self, agent: str) -> list[StoredDocument]:
        rows = self.db.execute("SELECT * FROM knowledge_documents WHERE agent = ? ORDER BY created_at, id", (agent,))
        return [StoredDocument(*row) for row in rows]

    def usage(self, agent: str) -> tuple[int, int]:
        """(documents, chunks) the agent holds."""
        row = self.db.execute("SELECT COUNT(*), COALESCE(SUM(chunk_count), 0) FROM knowledge_documents "
                              "WHERE agent = ?", (agent,)).fetchone()
        return int(row[0]), int(row[1])

    def chunk_count(self, agent: str) -> int:
        return self.usage(agent)[1]

    def search(self, agent: str, query_text: str, query_vector: np.ndarray | None, k: int,
               mode: str = "hybrid") -> list[SearchHit]:
        """Both retrievers one after the other (KnowledgeBase runs them side by side)."""
        if mode not in SEARCH_MODES:
            raise ValueError(f"search mode must be one of {', '.join(SEARCH_MODES)}, got {mode!r}")
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        pool = max(self._options.candidate_pool, k)
        lexical = self.lexical_ranking(agent, query_text, pool) if mode != "dense" else []
        dense = self.dense_ranking(agent, query_vector, pool) if mode != "lexical" and query_vector is not None else []
        return self.hits(agent, fuse(lexical, dense, mode, self._options)[:k])

    def lexical_ranking(self, agent: str, query_text: str, limit: int) -> list[tuple[int, float]]:
        """(chunk id, -bm25) best first; [] for a query with no searchable words.

        BM25 costs ~1 us per matching row, so the rows scored are bounded: each term's
        matches among the agent's chunks are counted (up to the budget), and the rarest
        terms are kept while their matches add up to at most `lexical_row_budget`. A word
        in more chunks than that has an IDF near zero; it is left to dense search."""
        terms = query_terms(query_text)
        if not terms:
            return []
        token, budget = agent_token(agent), self._options.lexical_row_budget
        counted = []
        for term in terms:
            matches = self.db.execute(
                "SELECT count(*) FROM (SELECT 1 FROM knowledge_fts WHERE knowledge_fts MATCH ? LIMIT ?)",
                (f'agent_token : "{token}" AND "{term}"', budget + 1)).fetchone()[0]
            if 0 < matches <= budget:
                counted.append((matches, term))
        kept, rows = [], 0
        for matches, term in sorted(counted):
            if rows + matches > budget:
                break
            kept.append(f'"{term}"')
            rows += matches
        if not kept:
            return []
        match = f'agent_token : "{token}" AND ({" OR ".join(kept)})'
        found = self.db.execute("SELECT rowid, bm25(knowledge_fts, 1.0, 0.0) AS score FROM knowledge_fts "
                                "WHERE knowledge_fts MATCH ? ORDER BY score LIMIT ?", (match, limit))
        return [(rowid, -score) for rowid, score in found]

    def dense_ranking(self, agent: str, query_vector: np.ndarray, limit: int) -> list[tuple[int, float]]:
        """(chunk id, cosine) best first: Hamming neighbours re-scored by exact cosine."""
        query = np.asarray(query_vector, dtype=np.float32).reshape(-1)
        candidates = self.db.execute(
            "SELECT chunk_id FROM knowledge_vectors WHERE embedding MATCH vec_bit(?) AND k = ? AND agent = ?",
            (np.packbits(query > 0).tobytes(), self._options.binary_candidates, agent)).fetchall()
        if not candidates:
            return []
        ids = [row[0] for row in candidates]
        rows = self.db.execute(f"SELECT id, embedding FROM knowledge_chunks WHERE id IN ({_marks(ids)}) AND agent = ?",
                               (*ids, agent)).fetchall()
        if not rows:
            return []
        vectors = np.frombuffer(b"".join(row[1] for row in rows), dtype=np.float16).reshape(len(rows), -1)
        cosines = vectors.astype(np.float32) @ query
        order = np.argsort(-cosines, kind="stable")[:limit]
        return [(rows[i][0], float(cosines[i])) for i in order]

    def hits(self, agent: str, ranked: Sequence[tuple[int, float]]) -> list[SearchHit]:
        """The rows of ranked chunk ids, in that order; other agents' ids are dropped."""
        if not ranked:
            return []
        ids = [i for i, _ in ranked]
        rows = self.db.execute(
            "SELECT c.id, c.doc_id, c.text, c.heading, d.source FROM knowledge_chunks c "
            f"JOIN knowledge_documents d ON d.id = c.doc_id WHERE c.id IN ({_marks(ids)}) AND c.agent = ?",
            (*ids, agent)).fetchall()
        by_id = {row[0]: row for row in rows}
        return [SearchHit(i, by_id[i][1], by_id[i][2], by_id[i][3], by_id[i][4], score)
                for i, score in ranked if i in by_id]


def _marks(values: Sequence) -> str:
    return ", ".join("?" * len(values))


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any error: nothing is ever half-stored."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> sqlite3.Connection:
        self._db.execute("BEGIN IMMEDIATE")
        return self._db

    def __exit__(self, kind, value, traceback) -> None:
        self._db.execute("COMMIT" if kind is None else "ROLLBACK")
