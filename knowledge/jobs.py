"""Background ingestion: uploads too large to embed within a request, one job at a time.

Queue policy: bounded (max_pending_jobs waiting, max_pending_bytes of their uploads);
a job that does not fit is refused at once with IngestQueueFull (503, retryable): the
client retries later, nothing waits unseen. One worker task: embedding is CPU-bound, and
on two cores a second worker would only slow the calls in progress.

A job is all or nothing, like a request: if one of its files fails, what it stored is
removed again. Its status (`queued`, `running`, `done`, `failed`) and per-file progress
are kept for the last `job_history` finished jobs. `close()` stops the job in progress
between two embedding batches, cancels the worker and awaits it with a timeout.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from knowledge.base import DocumentInfo, KnowledgeBase, PreparedDocument
from knowledge.errors import DocumentNotFound, IngestQueueFull, KnowledgeError
from knowledge.options import KnowledgeOptions

log = logging.getLogger(__name__)

QUEUED, RUNNING, DONE, FAILED = "queued", "running", "done", "failed"


@dataclass
class FileProgress:
    source: str
    chunks_total: int
    chunks_done: int = 0
    document: DocumentInfo | None = None  # once stored

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "chunks_done": self.chunks_done, "chunks_total": self.chunks_total,
                "document": self.document.as_dict() if self.document else None}


@dataclass
class IngestJob:
    id: str
    agent: str
    created_at: float
    files: list[FileProgress]
    size_bytes: int
    status: str = QUEUED
    error: str | None = None  # why it failed, naming the file
    started_at: float | None = None
    finished_at: float | None = None
    prepared: list[PreparedDocument] = field(default_factory=list, repr=False)  # dropped when finished
    stop: threading.Event = field(default_factory=threading.Event, repr=False)
    finished: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "agent": self.agent, "status": self.status, "error": self.error,
                "created_at": self.created_at, "started_at": self.started_at, "finished_at": self.finished_at,
                "chunks_done": sum(f.chunks_done for f in self.files),
                "chunks_total": sum(f.chunks_total for f in self.files),
                "files": [f.as_dict() for f in self.files]}


class IngestJobs:
    def __init__(self, knowledge: KnowledgeBase, options: KnowledgeOptions | None = None, *,
                 clock: Callable[[], float] = time.time) -> None:
        self._knowledge = knowledge
        self._options = options or knowledge.options
        self._clock = clock
        self._queue: asyncio.Queue[IngestJob] | None = None
        self._jobs: OrderedDict[str, IngestJob] = OrderedDict()  # by id, oldest first
        self._pending_bytes = 0
        self._worker: asyncio.Task | None = None

    def start(self) -> None:
        """Starts the worker; call from the running event loop (the app's lifespan)."""
        if self._worker is None:
            self._queue = asyncio.Queue(maxsize=self._options.max_pending_jobs)
            self._worker = asyncio.create_task(self._run(), name="knowledge-ingest-jobs")

    @property
    def depth(self) -> int:
        """Jobs waiting to run (the metric for this queue)."""
        return self._queue.qsize() if self._queue else 0

    def submit(self, agent: str, prepared: Sequence[PreparedDocument]) -> IngestJob:
        if self._queue is None:
            raise IngestQueueFull("background ingestion is not running; retry when the server is ready")
        size = sum(p.size_bytes for p in prepared)
        if self._pending_bytes + size > self._options.max_pending_bytes or self._queue.full():
            raise IngestQueueFull(f"{self._queue.qsize()} uploads are waiting to be ingested; retry in a minute")
        job = IngestJob(id=uuid.uuid4().hex, agent=agent, created_at=self._clock(), size_bytes=size,
                        files=[FileProgress(p.source, len(p.chunks)) for p in prepared], prepared=list(prepared))
        self._queue.put_nowait(job)
        self._pending_bytes += size
        self._jobs[job.id] = job
        return job

    def get(self, agent: str, job_id: str) -> IngestJob:
        job = self._jobs.get(job_id)
        if job is None or job.agent != agent:
            raise DocumentNotFound(f"agent {agent!r} has no ingestion job {job_id!r} (finished jobs are "
                                   f"kept for the last {self._options.job_history})")
        return job

    async def wait(self, agent: str, job_id: str) -> IngestJob:
        """The job, once finished (done or failed)."""
        job = self.get(agent, job_id)
        await job.finished.wait()
        return job

    def cancel_agent(self, agent: str) -> None:
        """Stops the agent's jobs (its knowledge is being deleted)."""
        for job in self._jobs.values():
            if job.agent == agent and job.status in (QUEUED, RUNNING):
                job.stop.set()

    async def close(self) -> None:
        for job in self._jobs.values():
            job.stop.set()
        if self._worker is not None:
            self._worker.cancel()
            done, _ = await asyncio.wait({self._worker}, timeout=self._options.close_timeout_s)
            if not done:
                log.warning("ingestion worker did not stop within %.0f s", self._options.close_timeout_s)
            self._worker = None
        for job in self._jobs.values():
            if job.status in (QUEUED, RUNNING):
                self._finish(job, FAILED, "the server stopped before this job finished; upload again")

    async def _run(self) -> None:
        assert self._queue is not None
        while True:
            job = await self._queue.get()
            self._pending_bytes -= job.size_bytes
            if job.stop.is_set():
                self._finish(job, FAILED, "cancelled before it started")
                continue
            await self._run_job(job)

    async def _run_job(self, job: IngestJob) -> None:
        job.status, job.started_at = RUNNING, self._clock()

        def progress(index: int, done: int, total: int) -> None:
            job.files[index].chunks_done = done

        try:
            stored = await self._knowledge.store_all(job.agent, job.prepared, progress=progress, stop=job.stop)
        except asyncio.CancelledError:
            self._finish(job, FAILED, "the server stopped before this job finished; upload again")
            raise
        except KnowledgeError as exc:
            self._finish(job, FAILED, str(exc))
        except Exception as exc:
            log.exception("ingestion job %s for agent %s failed", job.id, job.agent)
            self._finish(job, FAILED, f"internal error ({exc.__class__.__name__}); see the server log")
        else:
            for file, info in zip(job.files, stored, strict=True):
                file.document, file.chunks_done = info, file.chunks_total
            self._finish(job, DONE, None)

    def _finish(self, job: IngestJob, status: str, error: str | None) -> None:
        job.status, job.error, job.finished_at = status, error, self._clock()
        job.prepared = []  # the parsed text is no longer needed
        job.finished.set()
        finished = [j for j in self._jobs.values() if j.status in (DONE, FAILED)]
        for old in finished[: max(0, len(finished) - self._options.job_history)]:
            del self._jobs[old.id]
