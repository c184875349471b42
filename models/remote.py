"""Engines that are a model worker at the other end of HTTP (the API of workers/server.py).

The pipeline cannot tell them from in-process engines: the same ABCs and the same errors.
  503 from the worker with "retryable" (full, still loading), or 504 (past the deadline)
                                  -> CapacityError: retry later, or shed the turn
  refused or reset connections, no answer in time, a worker that dies mid-answer, a worker
  whose engine failed to load     -> WorkerUnavailableError, naming the worker's URL
  any other 4xx or 5xx            -> CadenceError with the worker's message (not retryable)
A dead worker shows within `connect_timeout_s` (a refused connection at once), so a call
gets a clear error within two seconds instead of a hang, unless the caller set a deadline
(models.scheduling.answer_within): then a request that no replica took (every one refused
the connection, or answered 503 retryable: restarting, loading, full), or a transcription or
embedding whose worker died under it, waits and tries again
while the deadline leaves time, as a worker the supervisor restarts is back in seconds (an ASR
worker killed mid-turn: 2.8-4.6 s, inside a transcript's 4-5 s). Every request carries an
X-Request-Id, X-Deadline-Ms when the caller set a deadline, and
X-Wanted-By-Ms when the pipeline said when it wants the answer (models.scheduling): a
batching worker then serves a reply's first sentence before other calls' later ones, as
the in-process runner does.

A worker may run as several replicas (a deployment's `replicas: N`); the client is given all
their URLs and spreads the load itself (models/replicas.py): each request goes to the replica
with the fewest requests in flight from this client, ties round-robin. A replica that refuses
the connection (or does not accept it within `connect_timeout_s`) is passed over for
`cool_off_s`, and the request goes once more to another replica, if one is up: nothing was
sent to the first, and a transcription or embedding may be asked twice anyway; a synthesis is
only retried before any audio came. A replica that answers 503 retryable (full, loading) is
likewise skipped once for another. The error of the last try is what the caller sees, mapped
as above. `load()` checks every replica.

A stopped or wedged worker still accepts connections (the kernel does), so its requests would
wait out the caller's whole deadline. A request with no answer `probe_after_s` in has its
replica's /healthz probed: a replica that answers is alive, only busy, and is waited for; one
that does not answer within `probe_timeout_s` went silent: the request is given up there and
sent once to another replica that is up (nothing came back, so nothing was heard twice), or
fails with WorkerUnavailableError (the in-process fallbacks then answer: models/fallback_asr.py,
models/fallback_voice.py). A silent replica is passed over for `stall_cool_off_s`, and each
request that still meets it (no other is up) has it probed at once; the first answer ends the
pass-over.
Nothing here imports agent/ or pipelines/.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, fields
from typing import Any

import httpx
import numpy as np

from models.base import ASREngine, EmbeddingEngine, TTSEngine, Transcript
from models.errors import CadenceError, CapacityError, ConfigError, WorkerUnavailableError
from models.http_send import cancel_send, send_detached
from models.replicas import DEFAULT_COOL_OFF_S, ReplicaSet
from models.scheduling import ANSWER_DEADLINE, WANTED_BY

log = logging.getLogger(__name__)

_PCM16_SAMPLE_BYTES = 2

# The transport errors that mean the request never reached the worker: safe to send elsewhere.
CONNECT_FAILURES = (httpx.ConnectError, httpx.ConnectTimeout)

# Waits for a worker that took no request, while the caller's deadline leaves time: doubling
# from the first, capped (a restarted worker answers within a probe or two of being up).
WAIT_FIRST_S, WAIT_MAX_S = 0.1, 0.5


@dataclass(frozen=True)
class RemoteOptions:
    connect_timeout_s: float = 1.0  # a worker that does not accept a connection by then counts as down
    read_timeout_s: float = 30.0  # longest silence between bytes of an answer before the worker counts as stuck
    ready_timeout_s: float = 2.0  # load(): how long /readyz may take to answer
    max_connections: int = 64  # pooled connections to each replica; more requests wait for one
    cool_off_s: float = DEFAULT_COOL_OFF_S  # a replica that refused a connection gets no request for this long
    # A request unanswered this long has its replica's /healthz probed: shorter than any deadline
    # a caller gives a worker (the voice's fallback after 1.5 s, a transcript's 3 s and more).
    probe_after_s: float = 0.5
    probe_timeout_s: float = 1.0  # a replica whose /healthz does not answer by then went silent
    stall_cool_off_s: float = 30.0  # a silent replica is passed over this long, unless it answers again
    # Within a request's deadline, wait for a worker that took no request (restarting, loading,
    # full). False where a fallback in this process answers instead: waiting only delays it.
    wait_for_worker: bool = True

    def __post_init__(self) -> None:
        if min(self.connect_timeout_s, self.read_timeout_s, self.ready_timeout_s) <= 0 or self.max_connections < 1:
            raise ValueError("remote engine timeouts must be > 0 and max_connections >= 1")
        if min(self.cool_off_s, self.probe_after_s, self.stall_cool_off_s) < 0 or self.probe_timeout_s <= 0:
            raise ValueError("remote engine cool_off_s, probe_after_s and stall_cool_off_s must be >= 0, "
                             "probe_timeout_s > 0")


def replica_urls(base_urls: str | Sequence[str], what: str) -> tuple[str, ...]:
    """One base URL or several -> distinct URLs without a trailing slash; ConfigError otherwise.
    `what` names the servers in the message ("asr worker", "LLM server")."""
    urls = tuple(url.rstrip("/") for url in ([base_urls] if isinstance(base_urls, str) else base_urls))
    if not urls:
        raise ConfigError(f"the {what} client needs at least one URL")
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"{what} URL {url!r} must start with http:// or https://")
    if len(set(urls)) != len(urls):
        raise ConfigError(f"{what} URLs repeat one another: {', '.join(urls)}; list each replica once")
    return urls


class WorkerClient:
    """The HTTP side the remote engines share: a connection pool per replica, the replica
    choice, error mapping, the in-flight count."""

    def __init__(self, base_urls: str | Sequence[str], role: str, options: RemoteOptions) -> None:
        self.role = role
        self.replicas = ReplicaSet(replica_urls(base_urls, f"{role} worker"), cool_off_s=options.cool_off_s)
        timeout = httpx.Timeout(options.read_timeout_s, connect=options.connect_timeout_s)
        limits = httpx.Limits(max_connections=options.max_connections)
        self._http = {url: httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) for url in self.urls}
        self._blocking = {url: httpx.Client(base_url=url, timeout=timeout, limits=limits) for url in self.urls}
        self._ready_timeout = httpx.Timeout(options.ready_timeout_s, connect=options.connect_timeout_s)
        self._options = options
        self._silent: set[str] = set()  # replicas found silent and not heard from since
        # Probes have connections of their own: a busy replica's pool may be full of requests.
        self._prober = httpx.AsyncClient(timeout=options.probe_timeout_s)

    @property
    def urls(self) -> tuple[str, ...]:
        return self.replicas.urls

    @property
    def in_flight(self) -> int:
        """Requests (and open streams) of this client not yet finished, over all replicas."""
        return self.replicas.in_flight

    def check_ready(self) -> dict[str, dict[str, Any]]:
        """Blocking: each replica's /readyz answer by URL; raises unless every one is ready and
        serves our role."""
        return {url: self._check_replica(url) for url in self.urls}

    def _check_replica(self, url: str) -> dict[str, Any]:
        try:
            answer = self._blocking[url].get("/readyz", timeout=self._ready_timeout)
        except httpx.TransportError as exc:
            raise self._unavailable(url, exc, "-") from exc
        body = _json_or_empty(answer)
        if answer.status_code != 200:
            raise WorkerUnavailableError(f"{self.role} worker at {url} is not ready: "
                                         f"{body.get('error') or answer.status_code}; start it or wait for it")
        if body.get("role") != self.role:
            raise ConfigError(f"the worker at {url} serves {body.get('role')!r}, not {self.role}; "
                              "check the worker URLs")
        return body

    def _headers(self, request_id: str, extra: dict[str, str] | None = None,
                 wanted_by: float | None = None) -> dict[str, str]:
        """`wanted_by`: when the answer is wanted, if read earlier than now (a stream's is
        read at the call, before its generator runs); otherwise WANTED_BY's value now."""
        headers = {"X-Request-Id": request_id, **(extra or {})}
        now = time.monotonic()
        deadline = ANSWER_DEADLINE.get()
        if deadline is not None:
            headers["X-Deadline-Ms"] = f"{max(0.0, deadline - now) * 1000.0:.0f}"
        wanted_by = wanted_by if wanted_by is not None else WANTED_BY.get()
        if wanted_by is not None:
            headers["X-Wanted-By-Ms"] = f"{max(0.0, wanted_by - now) * 1000.0:.0f}"
        return headers

    async def post(self, path: str, *, headers: dict[str, str] | None = None, **kwargs: Any) -> httpx.Response:
        request_id = _new_request_id()
        url, answer = await self._send(path, request_id, headers, stream=False, **kwargs)
        self.replicas.finished(url)
        self.raise_for_status(answer, url, request_id)
        return answer

    def post_blocking(self, path: str, **kwargs: Any) -> httpx.Response:
        """From a thread: the replica choice without the in-flight count (which the loop owns)."""
        request_id = _new_request_id()
        url, retried = self.replicas.pick(), False
        while True:
            try:
                answer = self._blocking[url].post(path, headers=self._headers(request_id), **kwargs)
            except httpx.TransportError as exc:
                other = self._after_failure(url, exc, retried)
                if other is None:
                    raise self._unavailable(url, exc, request_id) from exc
            else:
                other = None if retried else self._alternative_to_full(url, answer)
                if other is None:
                    self.raise_for_status(answer, url, request_id)
                    return answer
            url, retried = other, True

    async def stream(self, path: str, *, wanted_by: float | None = None, **kwargs: Any) -> AsyncIterator[bytes]:
        """The answer's body as it arrives. Closing this iterator closes the HTTP response."""
        request_id = _new_request_id()
        url, answer = await self._send(path, request_id, None, stream=True, wanted_by=wanted_by, **kwargs)
        try:
            if answer.status_code >= 400:
                await answer.aread()
                self.raise_for_status(answer, url, request_id)
            async for piece in answer.aiter_bytes():
                yield piece
        except httpx.TransportError as exc:
            raise self._unavailable(url, exc, request_id) from exc
        finally:
            self.replicas.finished(url)
            await answer.aclose()

    async def _send(self, path: str, request_id: str, headers: dict[str, str] | None, *, stream: bool,
                    wanted_by: float | None = None,
                    **kwargs: Any) -> tuple[str, httpx.Response]:
        """One replica's answer (with `stream`, its headers only), counted in flight there until
        the caller calls `replicas.finished(url)`. A refused or full replica gets one more try
        elsewhere; no byte of an answer was passed on before it. When none took it, it waits for
        one within the caller's deadline, if any (`_pause_before_retry`)."""
        url, retried, waits = self.replicas.pick(), False, 0
        while True:
            self.replicas.started(url)
            client = self._http[url]
            try:
                request = client.build_request("POST", path, headers=self._headers(request_id, headers, wanted_by),
                                               **kwargs)
                answer = await self._answer_unless_silent(url, client, request, stream=stream)
                if answer.status_code == 503:
                    await answer.aread()  # the body says whether it is full (retryable)
            except WorkerSilent as silent:
                self.replicas.finished(url)
                other = None if retried else self.replicas.alternative(url)
                log.warning("%s worker at %s went silent: %s; passed over for %.0f s%s", self.role, url, silent,
                            self._options.stall_cool_off_s, f"; trying {other}" if other else "")
                if other is None:
                    raise WorkerUnavailableError(f"{self.role} worker at {url} went silent ({silent}; request "
                                                 f"{request_id}); the supervisor restarts a stuck worker") from None
            except httpx.TransportError as exc:
                self.replicas.finished(url)
                other = self._after_failure(url, exc, retried)
                if other is None:
                    # A whole answer (a transcript, vectors) may be asked again; a stream only if
                    # it never reached the worker, as its audio may have begun.
                    again = isinstance(exc, CONNECT_FAILURES) or not stream
                    pause = self._pause_before_retry(waits) if again else None
                    if pause is None:
                        raise self._unavailable(url, exc, request_id) from exc
            except BaseException:  # cancelled (a barge-in, a hang-up): the slot is not ours any more
                self.replicas.finished(url)
                raise
            else:
                other = None if retried else self._alternative_to_full(url, answer)
                pause = None
                if other is None:
                    pause = self._pause_before_retry(waits) if _is_retryable_refusal(answer) else None
                    if pause is None:
                        return url, answer
                self.replicas.finished(url)
                await answer.aclose()
            if other is None:  # nowhere else to go: wait for a worker, then start over
                log.info("%s worker at %s took no request; trying again in %.1f s (deadline in %.1f s)", self.role,
                         url, pause, (ANSWER_DEADLINE.get() or 0.0) - time.monotonic())
                await asyncio.sleep(pause)
                url, retried, waits = self.replicas.pick(), False, waits + 1
                continue
            url, retried = other, True

    async def _answer_unless_silent(self, url: str, client: httpx.AsyncClient, request: httpx.Request, *,
                                    stream: bool) -> httpx.Response:
        """The replica's answer (a stream's headers), or WorkerSilent once none has come
        `probe_after_s` in (at once, for a replica found silent before) and the replica's
        /healthz does not answer within `probe_timeout_s` either. While it does answer, the
        request is waited for, and the replica probed again every `probe_after_s`."""
        sending = asyncio.ensure_future(send_detached(client, request, stream=stream))
        probe: asyncio.Future[bool] | None = None
        patience = 0.0 if url in self._silent else self._options.probe_after_s
        waited = time.monotonic()
        try:
            while not (await asyncio.wait({sending}, timeout=patience))[0]:
                probe = asyncio.ensure_future(self._answers_probe(url))
                await asyncio.wait({sending, probe}, return_when=asyncio.FIRST_COMPLETED)
                if sending.done():
                    break
                if not probe.result():
                    self.replicas.mark_down(url, for_s=self._options.stall_cool_off_s,
                                            why="went silent: a request and its health probe unanswered")
                    self._silent.add(url)
                    raise WorkerSilent(f"no answer {time.monotonic() - waited:.1f} s into a request, none to its "
                                       f"health probe within {self._options.probe_timeout_s:.1f} s")
                self._heard_from(url)
                patience = self._options.probe_after_s
            answer = sending.result()
        finally:  # a send or probe not waited for any more: cancelled, leaking no connection (models/http_send.py)
            for task in (sending, probe):
                if task is not None and not task.done():
                    await cancel_send(task)
        self._heard_from(url)
        return answer

    def _heard_from(self, url: str) -> None:
        if url in self._silent:  # found silent before: passed over no longer
            self._silent.discard(url)
            self.replicas.mark_up(url)
            log.info("%s worker at %s answers again", self.role, url)

    async def _answers_probe(self, url: str) -> bool:
        """Whether the replica answers its /healthz within probe_timeout_s (any status: a process
        that answers at all is alive)."""
        try:
            await send_detached(self._prober, self._prober.build_request("GET", f"{url}/healthz"), stream=False)
        except httpx.TransportError:
            return False
        return True

    def _pause_before_retry(self, waits: int) -> float | None:
        """How long to wait before trying a request no replica took, or None to give up: this
        client does not wait, no deadline was set, or the wait would reach it."""
        deadline = ANSWER_DEADLINE.get()
        if deadline is None or not self._options.wait_for_worker:
            return None
        pause = min(WAIT_MAX_S, WAIT_FIRST_S * 2**waits)
        return pause if time.monotonic() + pause < deadline else None

    def _after_failure(self, url: str, exc: httpx.TransportError, retried: bool) -> str | None:
        """A replica that refused the connection cools off; the replica to try next, if any."""
        if not isinstance(exc, CONNECT_FAILURES):
            return None  # the worker may have begun: only a fresh request may repeat it
        self.replicas.mark_down(url)
        other = None if retried else self.replicas.alternative(url)
        if other is not None:
            log.info("%s worker at %s refused the connection (%s); trying %s", self.role, url,
                     type(exc).__name__, other)
        return other

    def _alternative_to_full(self, url: str, answer: httpx.Response) -> str | None:
        return self.replicas.alternative(url) if _is_retryable_refusal(answer) else None

    def raise_for_status(self, answer: httpx.Response, url: str, request_id: str) -> None:
        if answer.status_code < 400:
            return
        body = _json_or_empty(answer)
        message = body.get("error") or answer.text[:200] or answer.reason_phrase
        where = f"{self.role} worker at {url} (request {request_id})"
        if answer.status_code in (503, 504) and body.get("retryable", answer.status_code == 504):
            raise CapacityError(f"{where} is busy: {message}; retry later")
        if answer.status_code == 503:
            raise WorkerUnavailableError(f"{where} cannot serve: {message}")
        raise CadenceError(f"{where} answered {answer.status_code}: {message}")

    def _unavailable(self, url: str, exc: httpx.TransportError, request_id: str) -> WorkerUnavailableError:
        what = "did not answer in time" if isinstance(exc, httpx.TimeoutException) else "cannot be reached"
        return WorkerUnavailableError(f"{self.role} worker at {url} {what} "
                                      f"({type(exc).__name__}: {exc or 'no detail'}; request {request_id}); "
                                      "is it running? the supervisor restarts a worker that died")

    async def aclose(self) -> None:
        for client in self._http.values():
            await client.aclose()
        await self._prober.aclose()
        for blocking in self._blocking.values():
            blocking.close()


class WorkerSilent(Exception):
    """A replica gave no answer to a request, nor to its health probe (stopped or wedged)."""


def _new_request_id() -> str:
    return uuid.uuid4().hex[:16]


def _is_retryable_refusal(answer: httpx.Response) -> bool:
    """503 with "retryable": a worker loading or full, not one whose engine failed to load."""
    return answer.status_code == 503 and bool(_json_or_empty(answer).get("retryable"))


def _json_or_empty(answer: httpx.Response) -> dict[str, Any]:
    try:
        body = answer.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


class WorkerLoad:
    """For an engine that is a `WorkerClient` (`self._client`): its queue depth is what it has in
    flight at the workers, and its health names each replica. Listed before the engine's
    contract class, whose defaults it replaces."""

    _client: WorkerClient

    @property
    def queue_depth(self) -> int:
        return self._client.in_flight

    def health(self) -> dict[str, Any]:
        return {**super().health(), "replicas": self._client.replicas.states()}  # type: ignore[misc]


class RemoteASREngine(WorkerLoad, ASREngine):
    def __init__(self, base_urls: str | Sequence[str], *, options: RemoteOptions = RemoteOptions()) -> None:
        self._client = WorkerClient(base_urls, "asr", options)  # one worker, or each of its replicas

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


class RemoteEmbeddingEngine(WorkerLoad, EmbeddingEngine):
    def __init__(self, base_urls: str | Sequence[str], dimensions: int, *,
                 options: RemoteOptions = RemoteOptions()) -> None:
        self.dimensions = dimensions  # checked against each replica's in load() and in every answer
        self._client = WorkerClient(base_urls, "embedder", options)

    def load(self) -> None:
        for url, body in self._client.check_ready().items():
            if body.get("dimensions") != self.dimensions:
                raise ConfigError(f"the embedder at {url} gives {body.get('dimensions')} dimensions, "
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
            raise CadenceError(f"the embedder answering {answer.url} sent {vectors.size} numbers in "
                               f"{body.get('dimensions')} dimensions for {count} texts; expected {self.dimensions}")
        return vectors.astype(np.float32).reshape(count, self.dimensions)

    async def close(self) -> None:
        await self._client.aclose()


class RemoteTTSEngine(WorkerLoad, TTSEngine):
    def __init__(self, base_urls: str | Sequence[str], sample_rate: int | None = None, *,
                 options: RemoteOptions = RemoteOptions()) -> None:
        # Checked against the worker's in load(); None: whatever the worker's voice speaks at
        # (as an in-process voice learns its rate when it loads).
        self.sample_rate = sample_rate or 0
        self._expected_rate = sample_rate
        self._client = WorkerClient(base_urls, "tts", options)  # one worker, or each of its replicas

    def load(self) -> None:
        ready = self._client.check_ready()
        first = next(iter(ready.values())).get("sample_rate")
        if self._expected_rate is None and isinstance(first, int) and first > 0:
            self.sample_rate = first  # and every other replica must speak at it too
        for url, body in ready.items():
            if body.get("sample_rate") != self.sample_rate:
                wanted = "configured" if self._expected_rate else f"of the worker at {self._client.urls[0]}"
                raise ConfigError(f"the tts worker at {url} speaks at {body.get('sample_rate')} Hz, "
                                  f"not the {self.sample_rate} Hz {wanted}")

    def synthesize(self, text: str) -> AsyncIterator[bytes]:
        # When the sentence is wanted is read here, at the call, as the in-process runner does:
        # the stream's generator runs later, outside the caller's `wanted_in`.
        return self._synthesize(text, WANTED_BY.get())

    async def _synthesize(self, text: str, wanted_by: float | None) -> AsyncIterator[bytes]:
        # HTTP cuts the stream anywhere; PCM16 consumers need whole samples, so an odd byte waits.
        carry = b""
        pieces = self._client.stream("/v1/synthesize", wanted_by=wanted_by, json={"text": text})
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
