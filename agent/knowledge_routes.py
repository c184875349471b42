"""HTTP routes for agents' knowledge: upload, list, delete, job status, search.

    POST   /api/agents/{name}/knowledge                multipart field `file`, one or more files:
                                                       201 {"documents": [...]} when embedded at once,
                                                       202 {"job": {...}} + Location for large uploads
    GET    /api/agents/{name}/knowledge                {"documents": [...]}
    DELETE /api/agents/{name}/knowledge/{doc_id}       204
    GET    /api/agents/{name}/knowledge/jobs/{job_id}  {"job": {...}}: status and per-file progress
    GET    /api/agents/{name}/search?q=...&k=5         {"results": [{"text", "score", "source", "chunk_id"}]}

Uploads are parsed from the request stream as they arrive: a file over the size limit
or one file too many is refused (413) without reading the rest. Every file of a request is
parsed and checked before any is stored, so a bad file stores nothing of its request.
Errors are {"error": ..., "retryable": ...} with the status the exception carries.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect
from python_multipart.multipart import MultipartParser, parse_options_header

from agent.http_util import error_response
from knowledge.base import KnowledgeBase
from knowledge.errors import BadQuery, BadUpload, DocumentTooLarge, KnowledgeError, TooManyFiles, UnknownAgent
from knowledge.jobs import IngestJobs
from knowledge.options import SEARCH_MODES, KnowledgeOptions

FILE_FIELD = "file"
MAX_QUERY_CHARS = 1000
MAX_K = 20
DEFAULT_K = 5
MAX_FIELD_BYTES = 64 * 1024  # other form fields are ignored, but not read without end
MAX_PARTS = 64  # parts of any kind in one form
MAX_FILENAME_CHARS = 255


@dataclass(frozen=True)
class Upload:
    filename: str
    content_type: str | None
    data: bytes


class UploadReader:
    """Feeds request bytes to a streaming multipart parser; keeps the files of field `file`
    and raises as soon as a limit is passed (callbacks raise out of `feed`)."""

    def __init__(self, boundary: bytes, options: KnowledgeOptions) -> None:
        self.uploads: list[Upload] = []
        self._options = options
        self._parser = MultipartParser(boundary, {
            "on_part_begin": self._part_begin, "on_header_field": self._header_field,
            "on_header_value": self._header_value, "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished, "on_part_data": self._part_data,
            "on_part_end": self._part_end,
        })
        self._parts = 0
        self._field_bytes = 0
        self._headers: dict[bytes, bytes] = {}
        self._name, self._value = bytearray(), bytearray()
        self._file: tuple[str, str | None] | None = None  # (filename, content type) of the part
        self._data = bytearray()

    def feed(self, chunk: bytes) -> None:
        try:
            self._parser.write(chunk)
        except KnowledgeError:
            raise
        except Exception as exc:  # python-multipart's parse errors
            raise BadUpload(f"the upload is not a valid multipart form ({exc}); "
                            "send it as multipart/form-data") from None

    def finish(self) -> list[Upload]:
        self._parser.finalize()
        if not self.uploads:
            raise BadUpload(f"no files in the upload; send them in the multipart field {FILE_FIELD!r}")
        return self.uploads

    def _part_begin(self) -> None:
        self._parts += 1
        if self._parts > MAX_PARTS:
            raise BadUpload(f"more than {MAX_PARTS} form parts; send at most "
                            f"{self._options.max_files_per_request} files per request")
        self._headers, self._file, self._data = {}, None, bytearray()

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._name += data[start:end]

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]

    def _header_end(self) -> None:
        self._headers[bytes(self._name).lower()] = bytes(self._value)
        self._name, self._value = bytearray(), bytearray()

    def _headers_finished(self) -> None:
        _, params = parse_options_header(self._headers.get(b"content-disposition", b""))
        filename = params.get(b"filename")
        if params.get(b"name") != FILE_FIELD.encode() or not filename:
            return  # another field (or an empty file input): read within MAX_FIELD_BYTES, then ignored
        if len(self.uploads) + 1 > self._options.max_files_per_request:
            raise TooManyFiles(f"more than {self._options.max_files_per_request} files in one request; "
                               "upload them in several requests")
        content_type = self._headers.get(b"content-type")
        self._file = (_clean_filename(filename), content_type.decode("latin-1") if content_type else None)

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._file is None:
            self._field_bytes += end - start
            if self._field_bytes > MAX_FIELD_BYTES:
                raise BadUpload(f"form fields other than {FILE_FIELD!r} hold over {MAX_FIELD_BYTES} bytes")
            return
        self._data += data[start:end]
        if len(self._data) > self._options.max_file_bytes:
            raise DocumentTooLarge(f"{self._file[0]}: over the {self._options.max_file_bytes}-byte limit; "
                                   "split it into smaller files")

    def _part_end(self) -> None:
        if self._file is not None:
            self.uploads.append(Upload(self._file[0], self._file[1], bytes(self._data)))
        self._file, self._data = None, bytearray()


def _clean_filename(raw: bytes) -> str:
    """The name without any folder a browser or client sent with it."""
    name = raw.decode("utf-8", errors="replace").replace("\\", "/").rsplit("/", 1)[-1].strip()
    return (name or "upload")[:MAX_FILENAME_CHARS]


async def read_uploads(request: Request, options: KnowledgeOptions) -> list[Upload]:
    media, params = parse_options_header(request.headers.get("content-type", ""))
    if media != b"multipart/form-data" or not params.get(b"boundary"):
        raise BadUpload(f"send the files as multipart/form-data in the field {FILE_FIELD!r}")
    reader = UploadReader(params[b"boundary"], options)
    try:
        async for chunk in request.stream():
            reader.feed(chunk)
    except ClientDisconnect:
        raise BadUpload("the client closed the connection before the upload ended") from None
    return reader.finish()


def parse_search(q: str | None, k: str | None, mode: str | None) -> tuple[str, int, str]:
    """The search parameters, or BadQuery naming the one that is wrong."""
    if q is None or not q.strip() or len(q) > MAX_QUERY_CHARS:
        raise BadQuery(f"parameter q is required: the question, 1 to {MAX_QUERY_CHARS} characters")
    try:
        top = DEFAULT_K if k is None else int(k)
    except ValueError:
        top = 0
    if not 1 <= top <= MAX_K:
        raise BadQuery(f"parameter k must be a whole number from 1 to {MAX_K}, got {k!r}")
    mode = mode or "hybrid"
    if mode not in SEARCH_MODES:
        raise BadQuery(f"parameter mode must be one of {', '.join(SEARCH_MODES)}, got {mode!r}")
    return q, top, mode


def _error(exc: KnowledgeError) -> JSONResponse:
    return error_response(exc.http_status, str(exc), retryable=exc.retryable)


def knowledge_router(knowledge: KnowledgeBase, jobs: IngestJobs,
                     agent_exists: Callable[[str], Awaitable[bool] | bool],
                     options: KnowledgeOptions) -> APIRouter:
    router = APIRouter()

    async def require_agent(name: str) -> None:
        exists = agent_exists(name)
        if not (await exists if inspect.isawaitable(exists) else exists):
            raise UnknownAgent(f"no agent {name!r}; GET /api/agents lists them")

    @router.post("/api/agents/{name}/knowledge")
    async def upload(name: str, request: Request) -> Response:
        try:
            await require_agent(name)
            uploads = await read_uploads(request, options)
            prepared = [await knowledge.prepare(u.filename, u.content_type, u.data) for u in uploads]
            await knowledge.check_room(name, prepared)
            if sum(len(u.data) for u in uploads) > options.background_threshold_bytes:
                job = jobs.submit(name, prepared)
                return JSONResponse({"job": job.as_dict()}, status_code=202,
                                    headers={"Location": f"/api/agents/{name}/knowledge/jobs/{job.id}"})
            stored = await knowledge.store_all(name, prepared)
        except KnowledgeError as exc:
            return _error(exc)
        return JSONResponse({"documents": [d.as_dict() for d in stored]}, status_code=201)

    @router.get("/api/agents/{name}/knowledge")
    async def list_documents(name: str) -> Response:
        try:
            await require_agent(name)
            documents = await knowledge.list_documents(name)
        except KnowledgeError as exc:
            return _error(exc)
        return JSONResponse({"documents": [d.as_dict() for d in documents]})

    @router.delete("/api/agents/{name}/knowledge/{doc_id}")
    async def delete_document(name: str, doc_id: str) -> Response:
        try:
            await require_agent(name)
            await knowledge.delete_document(name, doc_id)
        except KnowledgeError as exc:
            return _error(exc)
        return Response(status_code=204)

    @router.get("/api/agents/{name}/knowledge/jobs/{job_id}")
    async def job_status(name: str, job_id: str) -> Response:
        try:
            await require_agent(name)
            job = jobs.get(name, job_id)
        except KnowledgeError as exc:
            return _error(exc)
        return JSONResponse({"job": job.as_dict()})

    @router.get("/api/agents/{name}/search")
    async def search(name: str, q: str | None = None, k: str | None = None, mode: str | None = None) -> Response:
        try:
            query, top, how = parse_search(q, k, mode)
            await require_agent(name)
            hits = await knowledge.search(name, query, top, how)
        except KnowledgeError as exc:
            return _error(exc)
        return JSONResponse({"results": [{"text": h.text, "score": h.score, "source": h.source,
                                          "chunk_id": h.chunk_id} for h in hits]})

    return router
