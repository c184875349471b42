"""Transcription jobs behind the HTTP API: uploads on disk, one job at a time, progress.

An upload is streamed to a file as it arrives (never held in memory) and refused (413) as
soon as it passes `max_upload_bytes`; the file is deleted when its job ends, however it
ends. Queue policy: at most `max_pending_jobs` wait; one more is refused at once
(JobQueueFull, 503, retryable). One job runs at a time: its segments already use every
worker process. The worker processes start with the first job and stay for the next.
Finished jobs are kept for `job_history` lookups, the oldest forgotten first. Every change
of a job (progress, its end) wakes whoever watches it (`watch`, for server-sent events).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transcription.diarization import Diarizer
from transcription.errors import (
    BadTranscriptionRequest, JobNotFound, JobQueueFull, TranscriptionError, UploadTooLarge)
from transcription.options import TranscriptionOptions
from transcription.pool import WhisperPool
from transcription.transcriber import Transcriber

log = logging.getLogger(__name__)

QUEUED, RUNNING, DONE, FAILED, CANCELLED = "queued", "running", "done", "failed", "cancelled"
ENDED = (DONE, FAILED, CANCELLED)
MIB = 1024 * 1024


@dataclass(frozen=True)
class JobLimits:
    max_upload_bytes: int = 1024 * MIB  # ~9 h of 256 kbit/s audio, ~30 min of 16-bit 48 kHz stereo WAV
    max_pending_jobs: int = 4
    job_history: int = 50
    max_speakers: int = 16  # a `speakers` parameter above this is refused

    def __post_init__(self) -> None:
        if min(self.max_upload_bytes, self.max_pending_jobs, self.job_history, self.max_speakers) < 1:
            raise ValueError("transcription job limits must be >= 1")


@dataclass
class TranscriptionJob:
    id: str
    filename: str
    size_bytes: int
    diarize: bool
    speakers: int | None
    created_at: float
    path: Path = field(repr=False)
    status: str = QUEUED
    audio_seconds_read: float = 0.0
    audio_seconds_total: float | None = None
    result: dict[str, Any] | None = None
    error: str | None = None
    error_status: int | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def touch(self) -> None:
        """Wakes every watcher; they wait on a fresh event for the next change."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def as_dict(self, *, with_result: bool = True) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id, "filename": self.filename, "size_bytes": self.size_bytes, "status": self.status,
            "diarize": self.diarize, "speakers": self.speakers,
            "progress": {"audio_seconds_read": round(self.audio_seconds_read, 1),
                         "audio_seconds_total": None if self.audio_seconds_total is None
                         else round(self.audio_seconds_total, 1)}}
        if self.error is not None:
            body["error"] = {"message": self.error, "status": self.error_status}
        if with_result and self.result is not None:
            body["result"] = self.result
        return body


class TranscriptionJobs:
    def __init__(self, options: TranscriptionOptions, limits: JobLimits, folder: Path, *,
                 make_pool: Callable[[TranscriptionOptions], Any] = WhisperPool,
                 make_diarizer: Callable[[], Diarizer] = Diarizer,
                 on_end: Callable[[str, dict[str, Any] | None], None] = lambda status, result: None) -> None:
        """`on_end(status, result)`: told when a job ends (the server's metrics)."""
        self._options, self._limits, self._folder = options, limits, folder
        self._on_end = on_end
        self._make_pool, self._make_diarizer = make_pool, make_diarizer
        self._pool: Any = None
        self._diarizer: Diarizer | None = None
        self._jobs: OrderedDict[str, TranscriptionJob] = OrderedDict()
        self._queue: asyncio.Queue[TranscriptionJob] = asyncio.Queue()
        self._runner: asyncio.Task | None = None
        self._running: TranscriptionJob | None = None
        self._current: asyncio.Task | None = None

    @property
    def limits(self) -> JobLimits:
        return self._limits

    async def submit(self, body: AsyncIterator[bytes], *, filename: str, declared_bytes: int | None,
                     diarize: bool, speakers: int | None) -> TranscriptionJob:
        if speakers is not None and not 1 <= speakers <= self._limits.max_speakers:
            raise BadTranscriptionRequest(f"speakers must be in 1..{self._limits.max_speakers}")
        if speakers is not None and not diarize:
            raise BadTranscriptionRequest("speakers goes with diarize=true")
        if declared_bytes is not None and declared_bytes > self._limits.max_upload_bytes:
            raise UploadTooLarge(f"the upload is {declared_bytes} bytes; at most {self._limits.max_upload_bytes}")
        waiting = sum(1 for job in self._jobs.values() if job.status == QUEUED)  # a cancelled one frees its place
        if waiting >= self._limits.max_pending_jobs:
            raise JobQueueFull(f"{waiting} transcriptions are waiting; retry later")
        self._folder.mkdir(parents=True, exist_ok=True)
        job_id = uuid.uuid4().hex[:16]
        path = self._folder / f"{job_id}.upload"
        size = await self._store(body, path)
        if size == 0:
            path.unlink(missing_ok=True)
            raise BadTranscriptionRequest("the upload is empty: send the recording as the request body")
        job = TranscriptionJob(job_id, filename, size, diarize, speakers, time.time(), path)
        self._jobs[job_id] = job
        self._forget_old()
        self._queue.put_nowait(job)
        if self._runner is None:
            self._runner = asyncio.create_task(self._run(), name="transcription-jobs")
        return job

    async def _store(self, body: AsyncIterator[bytes], path: Path) -> int:
        size = 0
        try:
            with open(path, "wb") as out:
                async for chunk in body:
                    size += len(chunk)
                    if size > self._limits.max_upload_bytes:
                        raise UploadTooLarge(f"the upload is over {self._limits.max_upload_bytes} bytes, the limit")
                    await asyncio.to_thread(out.write, chunk)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return size

    def get(self, job_id: str) -> TranscriptionJob:
        job = self._jobs.get(job_id)
        if job is None:
            raise JobNotFound(f"no transcription job {job_id}")
        return job

    async def watch(self, job_id: str) -> AsyncIterator[TranscriptionJob]:
        """The job now, then after every change, until it has ended."""
        job = self.get(job_id)
        while True:
            changed = job._changed
            yield job
            if job.status in ENDED:
                return
            await changed.wait()

    async def cancel(self, job_id: str) -> TranscriptionJob:
        job = self.get(job_id)
        if job.status == QUEUED:
            self._finish(job, CANCELLED)
        elif job.status == RUNNING and self._current is not None:
            self._current.cancel()
        return job

    async def _run(self) -> None:
        while True:
            job = await self._queue.get()
            if job.status != QUEUED:
                continue  # cancelled while it waited
            job.status = RUNNING
            job.touch()
            self._current = asyncio.create_task(self._transcribe(job))
            try:
                await self._current
            except asyncio.CancelledError:
                if self._current.cancelled() and job.status == RUNNING:
                    self._finish(job, CANCELLED)
                    continue
                raise
            finally:
                self._current = None

    async def _transcribe(self, job: TranscriptionJob) -> None:
        def progress(read: float, total: float | None) -> None:
            job.audio_seconds_read, job.audio_seconds_total = read, total
            job.touch()

        try:
            if self._pool is None:
                self._pool = self._make_pool(self._options)
            diarizer = None
            if job.diarize:
                if self._diarizer is None:
                    self._diarizer = self._make_diarizer()
                    await asyncio.to_thread(self._diarizer.load)
                diarizer = self._diarizer
            result = await Transcriber(self._options, self._pool).transcribe(
                job.path, progress=progress, diarizer=diarizer, speakers=job.speakers)
            job.result = result.to_json()
            self._finish(job, DONE)
        except TranscriptionError as exc:
            job.error, job.error_status = str(exc).replace(job.path.name, job.filename), exc.http_status
            self._finish(job, FAILED)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("transcription job %s failed", job.id)
            job.error, job.error_status = f"transcription failed: {type(exc).__name__}: {exc}", 500
            self._finish(job, FAILED)

    def _finish(self, job: TranscriptionJob, status: str) -> None:
        job.status = status
        job.path.unlink(missing_ok=True)
        job.touch()
        self._on_end(status, job.result)

    def _forget_old(self) -> None:
        ended = [j for j in self._jobs.values() if j.status in ENDED]
        for job in ended[: max(0, len(ended) - self._limits.job_history)]:
            del self._jobs[job.id]

    async def close(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        if self._current is not None:
            self._current.cancel()
            await asyncio.gather(self._current, return_exceptions=True)
        for job in self._jobs.values():
            if job.status not in ENDED:
                self._finish(job, CANCELLED)
        if self._pool is not None:
            await asyncio.to_thread(self._pool.close)
