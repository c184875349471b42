"""HTTP routes for long recordings: upload, progress, result.

    POST   /api/transcriptions?filename=call.mp3&diarize=true&speakers=2
                         the recording as the raw request body (any format ffmpeg reads):
                         202 {"job": {...}} + Location; 413 over the upload limit (refused
                         from Content-Length before reading, or as soon as the stream passes it)
    GET    /api/transcriptions/{id}          {"job": {..., "result": {...}}}: status, progress, result
    GET    /api/transcriptions/{id}/events   server-sent events: the job after each change, until it ends
    DELETE /api/transcriptions/{id}          cancels it (queued or running); 200 {"job": {...}}

Errors are {"error": ..., "retryable": ...} with the status the exception carries; a job
that fails keeps its error (e.g. 422 "not audio ffmpeg can read") in `job.error`.
"""

from __future__ import annotations

import json
import re

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect

from agent.http_util import error_response
from transcription.errors import BadTranscriptionRequest, TranscriptionError
from transcription.jobs import TranscriptionJobs

_SAFE_NAME = re.compile(r"[^A-Za-z0-9._ -]")
MAX_FILENAME_CHARS = 255


def transcription_router(jobs: TranscriptionJobs) -> APIRouter:
    router = APIRouter()

    @router.post("/api/transcriptions")
    async def submit(request: Request) -> Response:
        try:
            params = request.query_params
            diarize = _flag(params.get("diarize"))
            speakers = _int(params.get("speakers"), "speakers")
            declared = request.headers.get("content-length")
            job = await jobs.submit(request.stream(), filename=_filename(params.get("filename")),
                                    declared_bytes=int(declared) if declared and declared.isdigit() else None,
                                    diarize=diarize, speakers=speakers)
        except TranscriptionError as exc:
            return error_response(exc.http_status, str(exc), retryable=exc.retryable)
        except ClientDisconnect:
            return error_response(400, "the client went away before the upload was complete")
        return JSONResponse({"job": job.as_dict()}, status_code=202,
                            headers={"Location": f"/api/transcriptions/{job.id}"})

    @router.get("/api/transcriptions/{job_id}")
    async def status(job_id: str) -> Response:
        try:
            return JSONResponse({"job": jobs.get(job_id).as_dict()})
        except TranscriptionError as exc:
            return error_response(exc.http_status, str(exc))

    @router.get("/api/transcriptions/{job_id}/events")
    async def events(job_id: str) -> Response:
        try:
            jobs.get(job_id)
        except TranscriptionError as exc:
            return error_response(exc.http_status, str(exc))

        async def stream():
            async for job in jobs.watch(job_id):
                yield f"data: {json.dumps({'job': job.as_dict(with_result=job.status == 'done')})}\n\n".encode()
        return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @router.delete("/api/transcriptions/{job_id}")
    async def cancel(job_id: str) -> Response:
        try:
            return JSONResponse({"job": (await jobs.cancel(job_id)).as_dict(with_result=False)})
        except TranscriptionError as exc:
            return error_response(exc.http_status, str(exc))

    return router


def _flag(raw: str | None) -> bool:
    if raw is None or raw.lower() in ("0", "false", "no", ""):
        return False
    if raw.lower() in ("1", "true", "yes"):
        return True
    raise BadTranscriptionRequest(f"diarize must be true or false, not {raw[:20]!r}")


def _int(raw: str | None, name: str) -> int | None:
    if raw is None or raw == "":
        return None
    if not raw.isdigit():
        raise BadTranscriptionRequest(f"{name} must be a whole number, not {raw[:20]!r}")
    return int(raw)


def _filename(raw: str | None) -> str:
    """Shown back in the job and its errors only; never used as a path."""
    name = _SAFE_NAME.sub("_", (raw or "upload")[:MAX_FILENAME_CHARS]).strip() or "upload"
    return name
