"""Agents' knowledge in the server: the knowledge base, its ingestion jobs and routes, the
search each call's retrieval uses, and the documents YAML agents ship.

One place that composes `knowledge/` for the app, so `app.py` stays routes and wiring.
"""

from __future__ import annotations

import asyncio
import logging
import mimetypes
import time
from collections.abc import Callable
from pathlib import Path

from fastapi import APIRouter

from agent.agent_registry import FileAgent
from agent.config import CadenceConfig
from agent.knowledge_routes import knowledge_router
from agent.metrics import CadenceMetrics
from knowledge.base import KnowledgeBase
from knowledge.jobs import IngestJobs
from models.base import EmbeddingEngine
from pipelines.call_agent import CallAgent
from pipelines.knowledge_context import Passage
from pipelines.retrieval import SearchPassages

log = logging.getLogger(__name__)


class Knowledge:
    def __init__(self, config: CadenceConfig, embedder: EmbeddingEngine | None, metrics: CadenceMetrics,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._config = config
        self._metrics = metrics
        self._clock = clock
        self.base = KnowledgeBase(config.store.path, embedder, config.knowledge) if embedder is not None else None
        self.jobs = IngestJobs(self.base, config.knowledge) if self.base is not None else None

    async def open(self) -> None:
        if self.base is not None:
            await self.base.open()
            self.jobs.start()

    async def close(self) -> None:
        if self.base is not None:
            await self.jobs.close()
            await self.base.close()

    def router(self, *, agent_exists: Callable[[str], bool]) -> APIRouter:
        if self.base is None:
            return APIRouter()  # no embedder configured: no knowledge routes

        async def exists(name: str) -> bool:
            return agent_exists(name)

        return knowledge_router(self.base, self.jobs, exists, self._config.knowledge)

    def search_for(self, agent: CallAgent) -> SearchPassages | None:
        """The search a call (or a chat) of `agent` runs per turn; None without knowledge."""
        if self.base is None or not agent.retrieval.enabled:
            return None
        base, name, k = self.base, agent.name, agent.retrieval.top_k

        async def search(query: str) -> list[Passage]:
            started = self._clock()
            hits = await base.search(name, query, k)
            self._metrics.retrieval_seconds.labels("search").observe(self._clock() - started)
            return [Passage(text=h.text, source=h.source, chunk_id=h.chunk_id, score=h.score) for h in hits]

        return search

    async def forget_agent(self, name: str) -> None:
        if self.base is not None:
            self.jobs.cancel_agent(name)  # a queued upload must not land after the agent is gone
            await self.base.delete_agent(name)

    async def sync_file_agents(self, agents: dict[str, FileAgent]) -> None:
        """Ingests the documents YAML agents name; a document already stored (same content)
        is skipped, so a restart costs nothing, and an edited file replaces its old version.
        A bad document stops startup."""
        if self.base is None:
            return
        for agent in agents.values():
            name = agent.spec.name
            current: dict[str, str] = {}  # file name -> id of its stored version
            for path in agent.knowledge_paths():
                kind = mimetypes.guess_type(path.name)[0]
                data = await asyncio.to_thread(Path(path).read_bytes)
                info = await self.base.ingest(name, path.name, kind, data)
                current[path.name] = info.id
                log.info("agent %s: %s ready (%d chunks)", name, path.name, info.chunk_count)
            for stored in await self.base.list_documents(name):
                if stored.source in current and stored.id != current[stored.source]:
                    await self.base.delete_document(name, stored.id)
                    log.info("agent %s: replaced the old version of %s", name, stored.source)
