"""Engines that are a model worker at the other end of HTTP (the API of workers/server.py).

The pipeline cannot tell them from in-process engines: the same ABCs and the same errors.
  503 from the worker with "retryable" (full, still loading), or 504 (past the deadline)
                                  -> CapacityError: retry later, or shed the turn
  refused or reset connections, no answer in time, a worker that dies mid-answer, a worker
  whose engine failed to load     -> WorkerUnavailableError, naming the worker's URL
  any other 4xx or 5xx            -> CadenceError with the worker's message (not retryable)
A dead worker shows within `connect_timeout_s` (a refused connection at once), so a call
gets a clear error within two seconds instead of a hang. Every request carries an
X-Request-Id, and X-Deadline-Ms when the caller set one with `deadline_within`.
Nothing here imports agent/ or pipelines/.
"""

from __future__ import annotations

import base64
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, fields
from typing import Any

import httpx
import numpy as np

from models.base import ASREngine, EmbeddingEngine, TTSEngine, Transcript
from models.errors import CadenceError, CapacityError, ConfigError, WorkerUnavailableError

_PCM16_SAMPLE_BYTES = 2

# When the answer stops being useful, on time.monotonic's scale: set by `deadline_within`.
_DEADLINE: ContextVar[float | None] = ContextVar("cadence_remote_deadline", default=None)


@contextlib.contextmanager
def deadline_within(seconds: float) -> Iterator[None]:
    """Requests made inside tell the worker they are useless after `seconds` (X-Deadline-Ms):
    a batching worker serves them earliest deadline first, and answers 504 once it passes."""
    token = _DEADLINE.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


@dataclass(frozen=True)
class RemoteOptions:
    connect_timeout_s: float = 1.0  # a worker that does not accept a connection by then counts as down
    read_timeout_s: float = 30.0  # longest silence between bytes of an answer before the worker counts as stuck
    ready_timeout_s: float = 2.0  # load(): how long /readyz may take to answer
    max_connections: int = 64  # pooled connections to this worker; more requests wait for one

    def __post_init__(self) -> None:
        if min(self.connect_timeout_s, self.read_timeout_s, self.ready_timeout_s) <= 0 or self.max_connections < 1:
            raise ValueError("remote engine timeouts must be > 0 and max_connections >= 1")


class WorkerClient:
    """The HTTP side the remote engines share: pooled connections, error mapping, in-flight count."""

    def __init__(self, base_url: str, role: str, options: RemoteOptions) -> None:
        self.base_url = base_url.rstrip("/")
        self.role = role
        self.in_flight = 0  # requests (and open streams) of this client not yet finished
        timeout = httpx.Timeout(options.read_timeout_s, connect=options.connect_timeout_s)
        limits = httpx.Limits(max_connections=options.max_connections)
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout, limits=limits)
        self._blocking = httpx.Client(base_url=self.base_url, timeout=timeout, limits=limits)
        self._ready_timeout = httpx.Timeout(options.ready_timeout_s, connect=options.connect_timeout_s)

    def check_ready(self) -> dict[str, Any]:
        """Blocking: the worker's /readyz answer; raises unless it is ready and serves our role."""
        try:
            answer = self._blocking.get("/readyz", timeout=self._ready_timeout)
        except httpx.TransportError as exc:
            raise self._unavailable(exc, "-") from exc
        body = _json_or_empty(answer)
        if answer.status_code != 200:
            raise WorkerUnavailableError(f"{self.role} worker at {self.base_url} is not ready: "
                                         f"{body.get('error') or answer.status_code}; start it or wait for it")
        if body.get("role") != self.role:
            raise ConfigError(f"the worker at {self.base_url} serves {body.get('role')!r}, not {self.role}; "
                              "check the worker URLs")
        return body

    def _headers(self, request_id: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = {"X-Request-Id": request_id, **(extra or {})}
        deadline = _DEADLINE.get()
        if deadline is not None:
            headers["X-Deadline-Ms"] = f"{max(0.0, deadline - time.monotonic()) * 1000.0:.0f}"
        return headers

    async def post(self, path: str, *, headers: dict[str, str] | None = None, **kwargs: Any) -> httpx.Response:
        request_id = uuid.uuid4().hex[:16]
        self.in_flight += 1
        try:
            answer = await self._http.post(path, headers=self._headers(request_id, headers), **kwargs)
        except httpx.TransportError as exc:
            raise self._unavailable(exc, request_id) from exc
        finally:
            self.in_flight -= 1
        self.raise_for_status(answer, request_id)
        return answer

    def post_blocking(self, path: str, **kwargs: Any) -> httpx.Response:
        request_id = uuid.uuid4().hex[:16]
        try:
            answer = self._blocking.post(path, headers=self._headers(request_id), **kwargs)
        except httpx.TransportError as exc:
            raise self._unavailable(exc, request_id) from exc
        self.raise_for_status(answer, request_id)
        return answer

    async def stream(self, path: str, **kwargs: Any) -> AsyncIterator[bytes]:
        """The answer's body as it arrives. Closing this iterator closes the HTTP response."""
        request_id = uuid.uuid4().hex[:16]
        self.in_flight += 1
        try:
            async with self._http.stream("POST", path, headers=self._headers(request_id), **kwargs) as answer:
                if answer.status_code >= 400:
                    await answer.aread()
                    self.raise_for_status(answer, request_id)
                async for piece in answer.aiter_bytes():
                    yield piece
        except httpx.TransportError as exc:
            raise self._unavailable(exc, request_id) from exc
        finally:
            self.in_flight -= 1

    def raise_for_status(self, answer: httpx.Response, request_id: str) -> None:
        if answer.status_code < 400:
            return
        body = _json_or_empty(answer)
        message = body.get("error") or answer.text[:200] or answer.reason_phrase
        where = f"{self.role} worker at {self.base_url} (request {request_id})"
        if answer.status_code in (503, 504) and body.get("retryable", answer.status_code == 504):
            raise CapacityError(f"{where} is busy: {message}; retry later")
        if answer.status_code == 503:
            raise WorkerUnavailableError(f"{where} cannot serve: {message}")
        raise CadenceError(f"{where} answered {answer.status_code}: {message}")

    def _unavailable(self, exc: httpx.TransportError, request_id: str) -> WorkerUnavailableError:
        what = "did not answer in time" if isinstance(exc, httpx.TimeoutException) else "cannot be reached"
        return WorkerUnavailableError(f"{self.role} worker at {self.base_url} {what} "
                                      f"({type(exc).__name__}: {exc or 'no detail'}; request {request_id}); "
                                      "is it running? the supervisor restarts a worker that died")

    async def aclose(self) -> None:
        await self._http.aclose()
        self._blocking.close()


def _json_or_empty(answer: httpx.Response) -> dict[str, Any]:
    try:
        body = answer.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


class RemoteASREngine(ASREngine):
    def __init__(self, base_url: str, *, options: RemoteOptions = RemoteOptions()) -> None:
        self._client = WorkerClient(base_url, "asr", options)

    @property
    def queue_depth(self) -> int:
        return self._client.in_flight

    def load(self) -> None:
        self._client.check_ready()

    async def transcribe(self, pcm16: bytes, *, prompt: str | None = None) -> Transcript:
        answer = await self._client.post("/v1/transcribe", content=pcm16,
                                         params={"prompt": prompt} if prompt else None,
                                         headers={"Content-Type": "application/octet-stream"})
        body = answer.json()
        known = {f.name for f in fields(Transcript)}
        return Transcript(**{key: value for key, value in body.items() if key in known})

    async def close(self) -> None:
        await self._client.aclose()


class RemoteEmbeddingEngine(EmbeddingEngine):
    def __init__(self, base_url: str, dimensions: int, *, options: RemoteOptions = RemoteOptions()) -> None:
        self.dimensions = dimensions  # checked against the worker's in load() and in every answer
        self._client = WorkerClient(base_url, "embedder", options)

    @property
    def queue_depth(self) -> int:
        return self._client.in_flight

    def load(self) -> None:
        served = self._client.check_ready().get("dimensions")
        if served != self.dimensions:
            raise ConfigError(f"the embedder at {self._client.base_url} gives {served} dimensions, "
                              f"not the {self.dimensions} configured; the index would not match")

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        return self._vectors(await self._client.post("/v1/embed", json={"texts": texts}), len(texts))

    def embed_blocking(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        return self._vectors(self._client.post_blocking("/v1/embed", json={"texts": texts}), len(texts))

    def _vectors(self, answer: httpx.Response, count: int) -> np.ndarray:
        body = answer.json()
        vectors = np.frombuffer(base64.b64decode(body["vectors_b64"]), dtype="<f4")
        if body.get("dimensions") != self.dimensions or vectors.size != count * self.dimensions:
            raise CadenceError(f"the embedder at {self._client.base_url} sent {vectors.size} numbers in "
                               f"{body.get('dimensions')} dimensions for {count} texts; expected {self.dimensions}")
        return vectors.astype(np.float32).reshape(count, self.dimensions)

    async def close(self) -> None:
        await self._client.aclose()


class RemoteTTSEngine(TTSEngine):
    def __init__(self, base_url: str, sample_rate: int | None = None, *,
                 options: RemoteOptions = RemoteOptions()) -> None:
        # Checked against the worker's in load(); None: whatever the worker's voice speaks at
        # (as an in-process voice learns its rate when it loads).
        self.sample_rate = sample_rate or 0
        self._expected_rate = sample_rate
        self._client = WorkerClient(base_url, "tts", options)

    @property
    def queue_depth(self) -> int:
        return self._client.in_flight

    def load(self) -> None:
        served = self._client.check_ready().get("sample_rate")
        if self._expected_rate is None and isinstance(served, int) and served > 0:
            self.sample_rate = served
            return
        if served != self.sample_rate:
            raise ConfigError(f"the tts worker at {self._client.base_url} speaks at {served} Hz, "
                              f"not the {self.sample_rate} Hz configured")

    async def synthesize(self, text: str) -> AsyncIterator[bytes]:
        # HTTP cuts the stream anywhere; PCM16 consumers need whole samples, so an odd byte waits.
        carry = b""
        pieces = self._client.stream("/v1/synthesize", json={"text": text})
        try:
            async for piece in pieces:
                data = carry + piece
                whole = len(data) - len(data) % _PCM16_SAMPLE_BYTES
                carry = data[whole:]
                if whole:
                    yield data[:whole]
        finally:
            await pieces.aclose()  # type: ignore[attr-defined]

    async def close(self) -> None:
        await self._client.aclose()
