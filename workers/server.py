"""Cadence's own model worker: one engine (asr, embedder or tts) behind a small HTTP API.

    GET  /healthz         200 while the process serves
    GET  /readyz          200 {"ready": true, ...} once the engine is loaded and warmed; 503 before
    GET  /metrics         Prometheus text, from this worker's own registry
    POST /v1/transcribe   asr: body = raw 16-bit mono PCM at 16 kHz; optional query ?prompt=<text>
                          (URL-encoded UTF-8) -> JSON with the Transcript's fields
    POST /v1/embed        embedder: JSON {"texts": [...]} -> {"dimensions": d, "count": n,
                          "vectors_b64": base64 of float32 little-endian, row-major (n, d)}
    POST /v1/synthesize   tts: JSON {"text": ...} -> streamed application/octet-stream PCM16,
                          header X-Sample-Rate
    WS   /v1/codec/stream codec: one SNAC stream per connection (workers/codec_routes.py)

Request headers: X-Request-Id (echoed in the answer and logs; generated when absent or odd),
X-Deadline-Ms (milliseconds the client can still wait: orders the batch queue, and past it
the answer is 504; for a synthesis, until its first chunk), X-Wanted-By-Ms (milliseconds
until the answer is needed: orders the batch queue only, e.g. a reply's later sentence). Errors are JSON {"error", "retryable", "request_id"}: 4xx for bad input,
naming the problem; 503 + Retry-After when full or still loading; 504 past the deadline; 500
when the engine fails (the worker keeps serving). A client that disconnects cancels its
engine call, or closes its synthesis stream. The app owns the engine: it loads it in the
background at startup and closes it at shutdown. Nothing here imports agent/ or pipelines/.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import contextvars
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from models.base import ASREngine, EmbeddingEngine, Engine, TTSEngine
from models.errors import CapacityError, WorkerUnavailableError
from workers.batcher import REQUEST_DEADLINE, REQUEST_WANTED_BY, BatchRecord
from workers.pcm_stream import CLIENT_CLOSED_REQUEST, PcmStream, close_quietly, wait_for_disconnect
from workers.worker_metrics import WorkerMetrics

log = logging.getLogger(__name__)

T = TypeVar("T")
ROLES = {"asr": ASREngine, "embedder": EmbeddingEngine, "tts": TTSEngine, "codec": Engine}  # codec: codec_routes checks
PCM16_BYTES_PER_SECOND = 16_000 * 2  # the ASR input: 16-bit mono at 16 kHz
RETRY_AFTER_S = "1"  # a full worker frees a slot within a turn's time
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")  # anything else is replaced, not logged


@dataclass(frozen=True)
class WorkerLimits:
    max_audio_seconds: float = 60.0  # asr: longest PCM body accepted; longer is 413
    max_prompt_chars: int = 2000  # asr: longest prompt; longer is 413
    max_texts: int = 256  # embedder: most texts in one request; more is 413
    max_text_chars: int = 8192  # embedder and tts: longest single text; longer is 413
    max_json_bytes: int = 4 << 20  # embedder and tts: largest JSON body; larger is 413
    load_wait_s: float = 30.0  # at shutdown, how long a load still running is waited for
    max_codec_frames: int = 64  # codec: most frames in one request (~5.5 s of audio); more is refused
    codec_idle_s: float = 30.0  # codec: a stream silent this long is closed, freeing its slot

    def __post_init__(self) -> None:
        if min(self.max_audio_seconds, self.max_prompt_chars, self.max_texts, self.max_text_chars,
               self.max_json_bytes, self.max_codec_frames, self.codec_idle_s) <= 0 or self.load_wait_s < 0:
            raise ValueError("worker limits must be > 0")


class HTTPProblem(Exception):
    """A request answered with a JSON error instead of the engine's result."""

    def __init__(self, status: int, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable


class _ClientGone(Exception):
    pass


def build_worker_app(engine: Engine, *, role: str, name: str, max_in_flight: int,
                     limits: WorkerLimits = WorkerLimits(), loaded: bool = False,
                     on_load_failure: Callable[[BaseException], None] | None = None,
                     clock: Callable[[], float] = time.monotonic) -> Starlette:
    """`loaded`: the engine is loaded and warmed already (ready at once). `clock` must be the
    scale the engine's batcher reads deadlines on (time.monotonic for both by default)."""
    if role not in ROLES or not isinstance(engine, ROLES[role]):
        raise ValueError(f"role {role!r} needs a {ROLES.get(role, Engine).__name__}; got {type(engine).__name__}")
    if max_in_flight < 1:
        raise ValueError("max_in_flight must be >= 1")
    worker = _Worker(engine, role, name, max_in_flight, limits, clock, loaded, on_load_failure)
    routes: list[BaseRoute] = [Route("/healthz", worker.healthz), Route("/readyz", worker.readyz),
                               Route("/metrics", worker.metrics_text)]
    if role == "codec":
        from workers.codec_routes import codec_routes  # torch only where a codec is served

        routes += codec_routes(worker)
    else:
        handlers = {"asr": ("/v1/transcribe", worker.transcribe), "embedder": ("/v1/embed", worker.embed),
                    "tts": ("/v1/synthesize", worker.synthesize)}
        path, handler = handlers[role]
        routes.append(Route(path, worker.admit(path, handler), methods=["POST"]))
    app = Starlette(routes=routes, lifespan=worker.lifespan, exception_handlers={HTTPException: _http_exception})
    app.state.worker = worker
    return app


class _Worker:
    def __init__(self, engine: Engine, role: str, name: str, max_in_flight: int, limits: WorkerLimits,
                 clock: Callable[[], float], loaded: bool,
                 on_load_failure: Callable[[BaseException], None] | None) -> None:
        self.engine, self.role, self.name = engine, role, name
        self.max_in_flight = max_in_flight
        self.limits = limits
        self._clock = self.clock = clock
        self.ready = loaded
        self.became_ready = asyncio.Event()  # set once the engine is loaded and warmed
        if loaded:
            self.became_ready.set()
        self.load_error: str | None = None
        self._on_load_failure = on_load_failure
        self._load_job: asyncio.Future[None] | None = None
        self.in_flight = 0
        engine_record = getattr(engine, "batch_record", None)
        # An engine without a batcher runs each request alone: each engine call is a batch of one.
        self._own_record = None if isinstance(engine_record, BatchRecord) else BatchRecord(1)
        self.metrics = WorkerMetrics(name=name, role=role, engine=engine, in_flight=lambda: self.in_flight,
                                     batch_record=engine_record if self._own_record is None else self._own_record)

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        loader = None if self.ready else asyncio.create_task(self._load(), name=f"load-{self.name}")
        try:
            yield
        finally:
            if loader is not None:
                loader.cancel()
                await asyncio.gather(loader, return_exceptions=True)
            if self._load_job is not None:  # a thread cannot be cancelled: wait before closing under it
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(self._load_job), self.limits.load_wait_s)
            await self.engine.close()

    async def _load(self) -> None:
        def load_and_warm() -> None:
            self.engine.load()
            self.engine.warm_up()

        started = self._clock()
        self._load_job = asyncio.get_running_loop().run_in_executor(None, load_and_warm)
        try:
            await self._load_job
        except Exception as exc:
            self.load_error = f"{type(exc).__name__}: {exc}"
            log.error("worker %s (%s) failed to load: %s", self.name, self.role, self.load_error)
            if self._on_load_failure is not None:
                self._on_load_failure(exc)
            return
        self.ready = True
        self.became_ready.set()
        log.info("worker %s (%s) ready after %.1f s", self.name, self.role, self._clock() - started)

    async def healthz(self, _request: Request) -> Response:
        return JSONResponse({"alive": True, "worker": self.name, "role": self.role})

    async def readyz(self, _request: Request) -> Response:
        body: dict[str, Any] = {"ready": self.ready, "worker": self.name, "role": self.role}
        if not self.ready:
            body["error"] = self.load_error or "loading the engine"
            return JSONResponse(body, status_code=503, headers={"Retry-After": RETRY_AFTER_S})
        if isinstance(self.engine, (TTSEngine, ASREngine)):
            body["sample_rate"] = self.engine.sample_rate
        if isinstance(self.engine, EmbeddingEngine):
            body["dimensions"] = self.engine.dimensions
        if self.role == "codec":
            body.update(self.engine.stream_facts())  # type: ignore[attr-defined]
        return JSONResponse(body)

    async def metrics_text(self, _request: Request) -> Response:
        return Response(self.metrics.render(), headers={"Content-Type": self.metrics.content_type})

    def admit(self, endpoint: str, handler: Callable[[Request, float | None], Awaitable[Response]]):
        async def serve(request: Request) -> Response:
            request_id = _request_id(request)
            started = self._clock()
            admitted = False
            try:
                deadline = self._deadline(request, started)
                self._refuse_when_full()
                self.in_flight += 1
                admitted = True
                response = await handler(request, deadline)
            except Exception as exc:
                response = self._error_response(exc, endpoint, request_id)
            except asyncio.CancelledError:  # the server is shutting down under this request
                if admitted:
                    self.in_flight -= 1
                raise

            def finish(status: int) -> None:
                if admitted:
                    self.in_flight -= 1
                self.metrics.observe_request(endpoint, status, self._clock() - started)
                log.log(logging.INFO if status >= 400 else logging.DEBUG, "%s %s id=%s status=%d %.3fs",
                        self.name, endpoint, request_id, status, self._clock() - started)

            response.headers["X-Request-Id"] = request_id
            if isinstance(response, PcmStream):
                response.on_close = finish  # the slot is the stream's until it closes
            else:
                finish(response.status_code)
            return response
        return serve

    def _deadline(self, request: Request, now: float) -> float | None:
        raw = request.headers.get("x-deadline-ms")
        if raw is None:
            return None
        try:
            budget_ms = float(raw)
        except ValueError:
            raise HTTPProblem(422, f"X-Deadline-Ms must be a number of milliseconds, got {raw[:32]!r}") from None
        if not budget_ms > 0:  # also NaN
            self.metrics.refused("deadline")
            raise HTTPProblem(504, "X-Deadline-Ms left no time to do the work", retryable=True)
        return now + budget_ms / 1000.0

    def _wanted_by(self, request: Request) -> float | None:
        """X-Wanted-By-Ms on the batcher's clock; a value that is not a number >= 0 is ignored
        (it only orders the queue: a bad one must not cost the caller its answer)."""
        raw = request.headers.get("x-wanted-by-ms")
        try:
            wanted_ms = float(raw) if raw is not None else None
        except ValueError:
            return None
        return self._clock() + wanted_ms / 1000.0 if wanted_ms is not None and wanted_ms >= 0 else None

    def _refuse_when_full(self) -> None:
        if not self.ready:
            raise HTTPProblem(503, f"worker {self.name} is not ready: {self.load_error or 'loading the engine'}",
                              retryable=self.load_error is None)
        if self.in_flight >= self.max_in_flight:
            self.metrics.refused("in_flight")
            raise HTTPProblem(503, f"worker {self.name} has {self.in_flight} requests in flight, its bound; retry later",
                              retryable=True)

    def _error_response(self, exc: Exception, endpoint: str, request_id: str) -> Response:
        if isinstance(exc, _ClientGone):
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        if isinstance(exc, CapacityError):
            self.metrics.refused("engine_queue")
            exc = HTTPProblem(503, str(exc), retryable=True)
        elif isinstance(exc, WorkerUnavailableError):  # the engine is closing under us
            exc = HTTPProblem(503, str(exc), retryable=True)
        elif not isinstance(exc, HTTPProblem):
            log.error("%s %s id=%s: the engine failed: %r", self.name, endpoint, request_id, exc, exc_info=exc)
            exc = HTTPProblem(500, f"the {self.role} engine failed: {type(exc).__name__}: {exc}")
        return _error(exc.status, str(exc), retryable=exc.retryable, request_id=request_id)

    async def _call(self, request: Request, deadline: float | None, make_call: Callable[[], Awaitable[T]]) -> T:
        """Runs one engine call; cancels it when the client disconnects or the deadline passes."""
        context = contextvars.copy_context()
        context.run(REQUEST_DEADLINE.set, deadline)  # read by a batching engine's submit()
        context.run(REQUEST_WANTED_BY.set, self._wanted_by(request))
        call = asyncio.create_task(make_call(), context=context)
        gone = asyncio.create_task(wait_for_disconnect(request.receive))
        timeout = None if deadline is None else max(0.0, deadline - self._clock())
        try:
            done, _ = await asyncio.wait({call, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            call.cancel()  # no effect once it has finished
            await asyncio.gather(call, gone, return_exceptions=True)
        if call in done:
            result = call.result()
            if self._own_record is not None:
                self._own_record.record(1)
            return result
        if gone in done:
            raise _ClientGone()
        self.metrics.refused("deadline")
        raise HTTPProblem(504, "the deadline in X-Deadline-Ms passed before the engine answered", retryable=True)

    async def transcribe(self, request: Request, deadline: float | None) -> Response:
        assert isinstance(self.engine, ASREngine)
        pcm16 = await _read_body(request, int(self.limits.max_audio_seconds * PCM16_BYTES_PER_SECOND))
        if not pcm16 or len(pcm16) % 2:
            raise HTTPProblem(422, f"the body must be 16-bit mono PCM at 16 kHz: a non-empty, even number of bytes "
                                   f"(got {len(pcm16)})")
        prompt = request.query_params.get("prompt") or None
        if prompt is not None and len(prompt) > self.limits.max_prompt_chars:
            raise HTTPProblem(413, f"prompt is {len(prompt)} characters; at most {self.limits.max_prompt_chars}")
        engine = self.engine
        transcript = await self._call(request, deadline, lambda: engine.transcribe(pcm16, prompt=prompt))
        return JSONResponse(asdict(transcript))

    async def embed(self, request: Request, deadline: float | None) -> Response:
        assert isinstance(self.engine, EmbeddingEngine)
        texts = (await self._json_body(request)).get("texts")
        if not isinstance(texts, list) or not all(isinstance(text, str) for text in texts):
            raise HTTPProblem(422, 'the body must be {"texts": [<string>, ...]}')
        if len(texts) > self.limits.max_texts:
            raise HTTPProblem(413, f"{len(texts)} texts in one request; at most {self.limits.max_texts}")
        self._check_lengths(texts, "texts")
        engine = self.engine
        vectors = await self._call(request, deadline, lambda: engine.embed(texts))
        vectors = np.ascontiguousarray(vectors, dtype="<f4")
        if vectors.ndim != 2 or vectors.shape[0] != len(texts):
            raise RuntimeError(f"the embedder returned shape {vectors.shape} for {len(texts)} texts")
        return JSONResponse({"dimensions": int(vectors.shape[1]), "count": len(texts),
                             "vectors_b64": base64.b64encode(vectors.tobytes()).decode("ascii")})

    async def synthesize(self, request: Request, deadline: float | None) -> Response:
        assert isinstance(self.engine, TTSEngine)
        text = (await self._json_body(request)).get("text")
        if not isinstance(text, str) or not text.strip():
            raise HTTPProblem(422, 'the body must be {"text": <non-empty string>}')
        self._check_lengths([text], "text")
        chunks = self.engine.synthesize(text)
        try:
            first = await self._call(request, deadline, lambda: _first_chunk(chunks))
        except BaseException:
            await close_quietly(chunks)
            raise
        return PcmStream(first, chunks, sample_rate=self.engine.sample_rate)

    def _check_lengths(self, texts: list[str], field: str) -> None:
        for index, text in enumerate(texts):
            if len(text) > self.limits.max_text_chars:
                where = field if field == "text" else f"{field}[{index}]"
                raise HTTPProblem(413, f"{where} is {len(text)} characters; at most {self.limits.max_text_chars}")

    async def _json_body(self, request: Request) -> dict[str, Any]:
        raw = await _read_body(request, self.limits.max_json_bytes)
        try:
            payload = json.loads(raw)
        except ValueError as exc:
            raise HTTPProblem(422, f"the body must be JSON: {exc}") from None
        if not isinstance(payload, dict):
            raise HTTPProblem(422, "the body must be a JSON object")
        return payload


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPProblem(413, f"the body is {declared} bytes; at most {limit}")
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > limit:
            raise HTTPProblem(413, f"the body is over {limit} bytes")
    return bytes(body)


async def _first_chunk(chunks: AsyncIterator[bytes]) -> bytes | None:
    """Pulled before the answer starts, so that an engine failing at once is still a JSON 500."""
    try:
        return await chunks.__anext__()
    except StopAsyncIteration:
        return None


def _request_id(request: Request) -> str:
    given = request.headers.get("x-request-id", "")
    return given if _REQUEST_ID.match(given) else uuid.uuid4().hex[:16]


def _error(status: int, message: str, *, retryable: bool, request_id: str | None = None) -> JSONResponse:
    headers = {"Retry-After": RETRY_AFTER_S} if status == 503 else {}
    return JSONResponse({"error": message, "retryable": retryable, "request_id": request_id},
                        status_code=status, headers=headers)


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return _error(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", retryable=False)


def serve(engine: Engine, *, role: str, name: str, port: int, host: str = "127.0.0.1", max_in_flight: int = 16,
          limits: WorkerLimits = WorkerLimits(), log_level: str = "info") -> None:
    """Runs the worker until SIGTERM or SIGINT. Exits with status 1 when the engine fails to
    load, so the supervisor restarts it instead of waiting for a readiness that never comes."""
    import uvicorn

    failures: list[BaseException] = []
    server: uvicorn.Server | None = None

    def stop_on_failure(exc: BaseException) -> None:
        failures.append(exc)
        if server is not None:
            server.should_exit = True

    app = build_worker_app(engine, role=role, name=name, max_in_flight=max_in_flight, limits=limits,
                           on_load_failure=stop_on_failure)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                                           access_log=False, timeout_graceful_shutdown=5))
    server.run()
    if failures:
        raise SystemExit(1)
