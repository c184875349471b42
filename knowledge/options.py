"""Limits and retrieval settings of agents' knowledge, validated when built."""

from __future__ import annotations

from dataclasses import dataclass, field

from models.embedding import EmbeddingOptions

MIB = 1024 * 1024
KIB = 1024
SEARCH_MODES = ("hybrid", "dense", "lexical")
FUSIONS = ("rrf", "convex")


@dataclass(frozen=True)
class KnowledgeOptions:
    # Largest single upload; a bigger file is refused (413) before the rest of it is read.
    max_file_bytes: int = 10 * MIB
    # Files in one upload request; more are refused (413) and nothing of the request is stored.
    max_files_per_request: int = 20
    # Documents one agent may hold; the next upload is refused (409) until some are deleted.
    max_documents_per_agent: int = 1000
    # Chunks one agent may hold (~120 words each: 200k is ~24M words); bounds its search time.
    max_chunks_per_agent: int = 200_000
    # Target chunk length in words: ~160 MiniLM word pieces with the heading, under its 256.
    chunk_words: int = 120
    # Sentences each chunk repeats from the one before, so a fact split by a cut is still whole.
    chunk_overlap_sentences: int = 1
    # A file above this size, or a request above it in total, is ingested as a background
    # job (202 + a job to poll); smaller ones are embedded within the request (201).
    background_threshold_bytes: int = 256 * KIB
    # Background jobs waiting to run; one more is refused (503, retryable).
    max_pending_jobs: int = 8
    # Upload bytes held by waiting jobs; bounds their memory (parsed text waits in RAM).
    max_pending_bytes: int = 256 * MIB
    # Finished jobs kept for status lookups; the oldest is forgotten first.
    job_history: int = 100
    # Seconds close() waits for a cancelled ingestion job to stop.
    close_timeout_s: float = 10.0
    # The embedder that turns chunks and questions into vectors (models/embedding.py).
    embedding: EmbeddingOptions = field(default_factory=EmbeddingOptions)
    # Length of the embedder's vectors; the vector table is created with it (MiniLM: 384).
    dimensions: int = 384
    # Candidates each retriever (BM25, vectors) gives to the fusion, best first.
    candidate_pool: int = 50
    # Binary (Hamming) neighbours re-scored by exact cosine to pick the dense candidates;
    # more raises recall and costs ~0.1 ms per candidate at 100k chunks (knowledge/index.py).
    binary_candidates: int = 100
    # Rows BM25 may score per query (~1 us each): terms matching more of the agent's chunks
    # than this are left to dense search (their IDF is near zero); knowledge/index.py.
    lexical_row_budget: int = 5000
    # Reciprocal rank fusion constant: score = sum of 1 / (rrf_k + rank); 60 is the value of
    # Cormack et al. (2009), where a rank-1 hit in one list and absence in the other still counts.
    rrf_k: int = 60
    # How hybrid search merges its two lists: "convex" (dense_weight * normalised cosine + the
    # rest * normalised BM25) or "rrf" (ranks only). Convex is the default by measurement
    # (latency_bench.components.retrieval_bench, 15 needles among 1k same-topic chunks): recall@3 1.0
    # against RRF's 0.73 and dense-only's 0.93. RRF lets notes that merely name a place
    # outvote dense search's clear first hit; scores keep that margin. Equal at 10k and 100k.
    fusion: str = "convex"
    # Share of the dense score under "convex" fusion; 0.7 favours meaning over shared words.
    dense_weight: float = 0.7

    def __post_init__(self) -> None:
        positive = ("max_file_bytes", "max_files_per_request", "max_documents_per_agent",
                    "max_chunks_per_agent", "chunk_words", "max_pending_jobs", "max_pending_bytes",
                    "job_history", "dimensions", "candidate_pool", "rrf_k", "lexical_row_budget")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"knowledge.{name} must be >= 1, got {getattr(self, name)}")
        if self.chunk_overlap_sentences < 0:
            raise ValueError(f"knowledge.chunk_overlap_sentences must be >= 0, got {self.chunk_overlap_sentences}")
        if self.background_threshold_bytes < 0:
            raise ValueError("knowledge.background_threshold_bytes must be >= 0, "
                             f"got {self.background_threshold_bytes}")
        if self.close_timeout_s <= 0:
            raise ValueError(f"knowledge.close_timeout_s must be > 0, got {self.close_timeout_s}")
        if self.binary_candidates < self.candidate_pool:
            raise ValueError(f"knowledge.binary_candidates ({self.binary_candidates}) must be >= "
                             f"knowledge.candidate_pool ({self.candidate_pool})")
        if self.fusion not in FUSIONS:
            raise ValueError(f"knowledge.fusion must be one of {', '.join(FUSIONS)}, got {self.fusion!r}")
        if not 0.0 <= self.dense_weight <= 1.0:
            raise ValueError(f"knowledge.dense_weight must be in [0, 1], got {self.dense_weight}")
        if self.dimensions % 8:
            raise ValueError(f"knowledge.dimensions must be a multiple of 8 (bit vectors), got {self.dimensions}")
