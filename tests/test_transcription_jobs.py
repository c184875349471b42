"""Transcription jobs and their HTTP API: uploads to disk with limits, one job at a time,
progress as events, cancellation; a fake pool (the pool's interface) where the test must
hold a job, the real Whisper workers end to end."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest

from latency_bench.callers import recordings
from latency_bench.quality.wer import word_error_rate
from tests.conftest import running_server
from transcription.errors import BadTranscriptionRequest, JobNotFound, JobQueueFull, UploadTooLarge
from transcription.jobs import CANCELLED, DONE, FAILED, JobLimits, TranscriptionJobs
from transcription.options import TranscriptionOptions
from transcription.result import Piece

WAIT_S = 60.0


class GatedPool:
    """The pool's interface: each segment waits for `gate`; says when it was entered."""

    workers = 1

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()

    async def transcribe(self, audio: np.ndarray, temperature: float = 0.0) -> list[Piece]:
        self.entered.set()
        await self.gate.wait()
        return [Piece(0.0, len(audio) / 16_000, "words that were said", -0.2)]

    def close(self) -> None:
        pass


async def chunks(data: bytes, size: int = 65536):
    for i in range(0, len(data), size):
        yield data[i : i + size]


@pytest.fixture(scope="module")
def short_recording(tmp_path_factory) -> tuple[bytes, recordings.Recording]:
    recording = recordings.build(20)
    path = recordings.write(recording, tmp_path_factory.mktemp("rec") / "short.wav")
    return path.read_bytes(), recording


def jobs_with(pool, folder: Path, **limits) -> TranscriptionJobs:
    return TranscriptionJobs(TranscriptionOptions(), JobLimits(**limits), folder, make_pool=lambda options: pool)


async def test_a_job_reports_progress_then_its_result_and_leaves_no_upload_behind(short_recording, tmp_path):
    data, _ = short_recording
    pool = GatedPool()
    pool.gate.set()
    jobs = jobs_with(pool, tmp_path)
    try:
        job = await jobs.submit(chunks(data), filename="short.wav", declared_bytes=len(data), diarize=False,
                                speakers=None)
        seen = []
        async with asyncio.timeout(WAIT_S):
            async for state in jobs.watch(job.id):
                seen.append((state.status, state.audio_seconds_read))
        assert seen[-1][0] == DONE and seen[-1][1] == pytest.approx(20, abs=1.5)
        assert any(0 < read < seen[-1][1] for _, read in seen)  # progress came before the end
        assert "words that were said" in job.result["text"] and not list(tmp_path.iterdir())
    finally:
        await jobs.close()


async def test_limits_refuse_at_once_and_keep_nothing(short_recording, tmp_path):
    data, _ = short_recording
    pool = GatedPool()
    jobs = jobs_with(pool, tmp_path, max_upload_bytes=len(data) - 1, max_pending_jobs=1)
    try:
        with pytest.raises(UploadTooLarge):
            await jobs.submit(chunks(data), filename="a.wav", declared_bytes=len(data), diarize=False, speakers=None)
        with pytest.raises(UploadTooLarge):  # no length declared: refused as the stream passes the limit
            await jobs.submit(chunks(data), filename="a.wav", declared_bytes=None, diarize=False, speakers=None)
        with pytest.raises(BadTranscriptionRequest, match="empty"):
            await jobs.submit(chunks(b""), filename="a.wav", declared_bytes=0, diarize=False, speakers=None)
        with pytest.raises(BadTranscriptionRequest, match="diarize"):
            await jobs.submit(chunks(data[:100]), filename="a.wav", declared_bytes=100, diarize=False, speakers=2)
        assert not list(tmp_path.iterdir())
        small = data[: len(data) // 2]
        running = await jobs.submit(chunks(small), filename="1.wav", declared_bytes=None, diarize=False, speakers=None)
        await asyncio.wait_for(pool.entered.wait(), WAIT_S)
        waiting = await jobs.submit(chunks(small), filename="2.wav", declared_bytes=None, diarize=False, speakers=None)
        with pytest.raises(JobQueueFull):
            await jobs.submit(chunks(small), filename="3.wav", declared_bytes=None, diarize=False, speakers=None)
        await jobs.cancel(waiting.id)
        again = await jobs.submit(chunks(small), filename="4.wav", declared_bytes=None, diarize=False, speakers=None)
        await jobs.cancel(again.id)  # the cancelled job gave its place back at once
        await jobs.cancel(running.id)
        async with asyncio.timeout(WAIT_S):
            async for _ in jobs.watch(running.id):
                pass
        assert (running.status, waiting.status) == (CANCELLED, CANCELLED)
        assert not list(tmp_path.iterdir())  # both uploads deleted
        with pytest.raises(JobNotFound):
            jobs.get("nope")
    finally:
        await jobs.close()


async def test_a_file_that_is_not_audio_fails_its_job_with_the_reason(tmp_path):
    jobs = jobs_with(GatedPool(), tmp_path)
    try:
        job = await jobs.submit(chunks(b"%PDF-1.7 not a recording" * 100), filename="report.pdf",
                                declared_bytes=None, diarize=False, speakers=None)
        async with asyncio.timeout(WAIT_S):
            async for _ in jobs.watch(job.id):
                pass
        assert job.status == FAILED and job.error_status == 422 and "report.pdf" in job.error
        assert ".upload" not in job.error  # the server's file name is not shown
    finally:
        await jobs.close()


@pytest.mark.slow
@pytest.mark.e2e
async def test_the_api_transcribes_an_upload_with_events_and_counts_it(short_recording, server_config,
                                                                       embedded_engines):
    data, recording = short_recording
    config = replace(server_config, transcription=replace(server_config.transcription, workers=1,
                                                          max_upload_bytes=len(data) + 10))
    with running_server(config, embedded_engines) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=WAIT_S) as http:
            too_big = await http.post("/api/transcriptions", content=data + b"\x00" * 20)
            assert too_big.status_code == 413, too_big.text
            bad = await http.post("/api/transcriptions?diarize=maybe", content=data)
            assert bad.status_code == 400 and "diarize" in bad.json()["error"]
            created = await http.post("/api/transcriptions?filename=short.wav", content=data)
            assert created.status_code == 202
            location = created.headers["location"]
            states = []
            async with http.stream("GET", f"{location}/events") as events:
                async for line in events.aiter_lines():
                    if line.startswith("data: "):
                        states.append(json.loads(line[6:])["job"])
            assert states[-1]["status"] == "done"
            final = (await http.get(location)).json()["job"]
            assert word_error_rate(recording.reference, final["result"]["text"]) < 0.15
            assert (await http.get("/api/transcriptions/nope")).status_code == 404
            metrics = (await http.get("/metrics")).text
            assert 'cadence_transcriptions_total{status="done"} 1.0' in metrics
