"""The knowledge base the server uses: async facade over the index, the parser and the embedder.

Threads (each a single-thread executor, so nothing here ever runs on the event loop):
  read    dense search, row fetches and listings, on a connection of their own: in WAL
          mode reads never wait for a write, neither ours (a large document is one
          transaction) nor the call store's;
  lexical BM25 search, on a second read connection, so it runs while the query is being
          embedded and dense search follows: a search costs embedding + dense, not the sum
          of all three;
  write   adds and deletes, one at a time (SQLite has one writer);
  parse   parsing and chunking uploads, so a slow PDF does not hold up embedding;
  embed   embedding uploads, one batch per task: CPU-bound, so one at a time (on two cores a
          second would only slow the calls in progress), and batch by batch, so a small
          upload's batches take turns with a large background job's instead of waiting for it.
The embedder is passed in, loaded by its owner; queries go through its async `embed()`,
ingestion through `embed_blocking()` on the embed thread.
"""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import numpy as np

from knowledge.chunking import Chunk, chunk_document
from knowledge.documents import parse_document
from knowledge.errors import (EmbedderUnavailable, EmptyDocument, IngestCancelled, KnowledgeBusy, KnowledgeError,
                              KnowledgeFull, KnowledgeSchemaError)
from knowledge.index import KnowledgeIndex, SearchHit, StoredDocument
from knowledge.ranking import fuse
from knowledge.options import SEARCH_MODES, KnowledgeOptions
from models.base import EmbeddingEngine

# (chunks embedded so far, chunks in the document); called on the event loop
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class DocumentInfo(StoredDocument):
    """A stored document as the API reports it."""

    duplicate: bool = False  # the agent already had these exact bytes; nothing new was stored

    @classmethod
    def from_stored(cls, stored: StoredDocument, *, duplicate: bool = False) -> DocumentInfo:
        return cls(**asdict(stored), duplicate=duplicate)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PreparedDocument:
    """An upload parsed and chunked, not embedded or stored yet."""

    source: str
    kind: str
    size_bytes: int
    sha256: str
    chunks: tuple[Chunk, ...]


class KnowledgeBase:
    def __init__(self, path: str, embedder: EmbeddingEngine, options: KnowledgeOptions | None = None) -> None:
        self.options = options or KnowledgeOptions()
        self._embedder = embedder
        self._reader = KnowledgeIndex(path, self.options)
        self._lexical_reader = KnowledgeIndex(path, self.options)
        self._writer = KnowledgeIndex(path, self.options)
        self._read = ThreadPoolExecutor(max_workers=1, thread_name_prefix="knowledge-read")
        self._read_lexical = ThreadPoolExecutor(max_workers=1, thread_name_prefix="knowledge-lexical")
        self._write = ThreadPoolExecutor(max_workers=1, thread_name_prefix="knowledge-write")
        self._parse = ThreadPoolExecutor(max_workers=1, thread_name_prefix="knowledge-parse")
        self._embed = ThreadPoolExecutor(max_workers=1, thread_name_prefix="knowledge-embed")

    async def open(self) -> None:
        await self._on(self._write, self._writer.open)  # creates or migrates the tables first
        await self._on(self._read, self._reader.open)
        await self._on(self._read_lexical, self._lexical_reader.open)

    async def close(self) -> None:
        await self._on(self._write, self._writer.close)
        await self._on(self._read, self._reader.close)
        await self._on(self._read_lexical, self._lexical_reader.close)
        for executor in (self._read, self._read_lexical, self._write, self._parse, self._embed):
            # An embedding batch may still be running: wait for it off the event loop.
            await asyncio.to_thread(executor.shutdown, wait=True, cancel_futures=True)

    @staticmethod
    async def _on(executor: ThreadPoolExecutor, fn: Callable, *args: Any) -> Any:
        try:
            return await asyncio.get_running_loop().run_in_executor(executor, partial(fn, *args))
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):  # waited BUSY_TIMEOUT_S for the other writer
                raise KnowledgeBusy("the database is busy with another write; retry shortly") from exc
            raise

    # --- search --------------------------------------------------------------------

    async def search(self, agent: str, query: str, k: int, mode: str = "hybrid") -> list[SearchHit]:
        if mode not in SEARCH_MODES:
            raise ValueError(f"search mode must be one of {', '.join(SEARCH_MODES)}, got {mode!r}")
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        pool = max(self.options.candidate_pool, k)
        lexical = None
        if mode != "dense":  # starts now, beside the embedding
            lexical = asyncio.ensure_future(
                self._on(self._read_lexical, self._lexical_reader.lexical_ranking, agent, query, pool))
        try:
            dense = []
            if mode != "lexical":
                vector = self._checked(await self._embed_query(query), 1)[0]
                dense = await self._on(self._read, self._reader.dense_ranking, agent, vector, pool)
            ranked = fuse(await lexical if lexical else [], dense, mode, self.options)
        finally:
            if lexical is not None and not lexical.done():
                lexical.cancel()  # the thread finishes its query; nobody waits for it
            elif lexical is not None and not lexical.cancelled():
                lexical.exception()  # retrieved, so an error here is not logged as unhandled
        return await self._on(self._read, self._reader.hits, agent, ranked[:k])

    async def _embed_query(self, query: str) -> np.ndarray:
        try:
            return await self._embedder.embed([query])
        except KnowledgeError:
            raise
        except Exception as exc:  # the engine's own errors: not loaded yet, failed to load
            raise EmbedderUnavailable(f"the embedder cannot run ({exc}); retry when the server is ready") from exc

    def _checked(self, vectors: np.ndarray, rows: int) -> np.ndarray:
        if vectors.shape != (rows, self.options.dimensions):
            raise KnowledgeSchemaError(f"the embedder gave vectors shaped {vectors.shape}; knowledge.dimensions "
                                       f"is {self.options.dimensions}: configure the embedder it was built for")
        return vectors

    # --- ingestion -----------------------------------------------------------------

    async def ingest(self, agent: str, filename: str, content_type: str | None, data: bytes) -> DocumentInfo:
        prepared = await self.prepare(filename, content_type, data)
        return (await self.store_all(agent, [prepared]))[0]

    async def prepare(self, filename: str, content_type: str | None, data: bytes) -> PreparedDocument:
        """Parses and chunks on the parse thread; raises a KnowledgeError naming the file."""
        return await self._on(self._parse, self._prepare, filename, content_type, data)

    def _prepare(self, filename: str, content_type: str | None, data: bytes) -> PreparedDocument:
        document = parse_document(filename, content_type, data, max_bytes=self.options.max_file_bytes)
        chunks = chunk_document(document, target_words=self.options.chunk_words,
                                overlap_sentences=self.options.chunk_overlap_sentences)
        if not chunks:
            raise EmptyDocument(f"{filename}: no sentences found; upload a file with text in it")
        return PreparedDocument(filename, document.kind, len(data), hashlib.sha256(data).hexdigest(), tuple(chunks))

    async def check_room(self, agent: str, prepared: Sequence[PreparedDocument]) -> set[str]:
        """KnowledgeFull if storing these would pass the agent's document or chunk cap; else
        the sha256 of those the agent does not hold yet."""
        return await self._on(self._write, self._check_room, agent, prepared)

    def _check_room(self, agent: str, prepared: Sequence[PreparedDocument]) -> set[str]:
        documents, chunks = self._writer.usage(agent)
        new: dict[str, int] = {}
        for document in prepared:
            if self._writer.find_document(agent, document.sha256) is None:
                new[document.sha256] = len(document.chunks)
        if documents + len(new) > self.options.max_documents_per_agent:
            raise KnowledgeFull(f"agent {agent!r} holds {documents} documents; {len(new)} more would pass the "
                                f"limit of {self.options.max_documents_per_agent}: delete some first")
        if chunks + sum(new.values()) > self.options.max_chunks_per_agent:
            raise KnowledgeFull(f"agent {agent!r} holds {chunks} chunks; {sum(new.values())} more would pass the "
                                f"limit of {self.options.max_chunks_per_agent}: delete some documents first")
        return set(new)

    async def store_all(self, agent: str, prepared: Sequence[PreparedDocument], *,
                        progress: Callable[[int, int, int], None] | None = None,
                        stop: threading.Event | None = None) -> list[DocumentInfo]:
        """Embeds and stores each document; all or nothing: on any error (cancellation too)
        what this call added is deleted again. `progress(file_index, done, total)` per batch."""
        new = await self.check_room(agent, prepared)
        stored: list[DocumentInfo] = []
        try:
            for index, document in enumerate(prepared):
                report = partial(progress, index) if progress else None
                stored.append(await self.store(agent, document, progress=report, stop=stop))
        except BaseException:
            # Queued behind any add still running on the write thread, so that one goes too.
            await asyncio.shield(self._on(self._write, self._forget, agent, new))
            raise
        return stored

    async def store(self, agent: str, document: PreparedDocument, *, progress: Progress | None = None,
                    stop: threading.Event | None = None) -> DocumentInfo:
        existing = await self._on(self._write, self._writer.find_document, agent, document.sha256)
        if existing is not None:
            if progress:
                progress(existing.chunk_count, existing.chunk_count)
            return DocumentInfo.from_stored(existing, duplicate=True)
        vectors = await self._embed_chunks(document.chunks, progress, stop)
        return await self._on(self._write, self._add, agent, document, vectors)

    async def _embed_chunks(self, chunks: Sequence[Chunk], progress: Progress | None,
                            stop: threading.Event | None) -> np.ndarray:
        batch = self.options.embedding.batch_size
        pieces = []
        for start in range(0, len(chunks), batch):
            if stop is not None and stop.is_set():
                raise IngestCancelled("ingestion was cancelled; nothing of it was stored")
            texts = [c.text for c in chunks[start:start + batch]]
            pieces.append(await self._on(self._embed, self._embed_batch, texts))
            if progress:
                progress(start + len(texts), len(chunks))
        return self._checked(np.concatenate(pieces), len(chunks))

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        try:
            return self._embedder.embed_blocking(texts)
        except Exception as exc:
            raise EmbedderUnavailable(f"the embedder cannot run ({exc}); retry when the server is ready") from exc

    def _add(self, agent: str, document: PreparedDocument, vectors: np.ndarray) -> DocumentInfo:
        self._check_room(agent, [document])  # again: another upload may have filled the agent meanwhile
        doc_id = self._writer.add_document(agent, document.source, document.kind, document.sha256,
                                           document.size_bytes, document.chunks, vectors)
        stored = self._writer.find_document(agent, document.sha256)
        assert stored is not None and stored.id == doc_id
        return DocumentInfo.from_stored(stored)

    def _forget(self, agent: str, sha256s: set[str]) -> None:
        for sha256 in sha256s:
            stored = self._writer.find_document(agent, sha256)
            if stored is not None:
                self._writer.delete_document(agent, stored.id)

    # --- documents -----------------------------------------------------------------

    async def list_documents(self, agent: str) -> list[DocumentInfo]:
        stored = await self._on(self._read, self._reader.list_documents, agent)
        return [DocumentInfo.from_stored(s) for s in stored]

    async def delete_document(self, agent: str, doc_id: str) -> None:
        await self._on(self._write, self._writer.delete_document, agent, doc_id)

    async def delete_agent(self, agent: str) -> int:
        return await self._on(self._write, self._writer.delete_agent, agent)

    async def usage(self, agent: str) -> tuple[int, int]:
        """(documents, chunks) the agent holds."""
        return await self._on(self._read, self._reader.usage, agent)
