"""The LLM as a server: one streaming client for every OpenAI-compatible chat endpoint.

llama.cpp's `llama-server --parallel N` (the CPU default: continuous batching, a prompt
cache per slot), `vllm serve` and `trtllm-serve` all stream `/v1/chat/completions` as
server-sent events. The call talks to all of them through this engine; they differ only in
the sampling extensions they accept, which `dialect` names.

Closing the reply iterator (barge-in, hang-up) closes the HTTP response; these servers
notice the closed connection and free the request's slot, so a reply nobody will hear
stops costing the other calls.

Several servers of one model (a deployment's `replicas: N`: `base_url` and `replica_urls`)
share the calls, prefix-affine: llama-server keeps a prompt cache per slot and vLLM caches
prefixes, so a conversation keeps going to one replica. A stable hash of its opening (the
first system message and the first user message) names its home replica; a home that
refused a connection in the last `cool_off_s`, or has max_in_flight / len(replicas) replies
open while another has fewer, is passed over for the least loaded (models/replicas.py). A
replica that refuses the connection is tried once more on another before anything streamed,
and a request dropped unanswered on a pooled connection the server had just closed, once more
on a fresh one. A replica that accepted a reply's request and then said nothing past the
reply's deadline (a hung server: stopped, deadlocked, its GPU wedged, still accepting
connections) is passed over for `stall_cool_off_s`: without that, every conversation homed
there would lose a turn to the same deadline until its worker is restarted. A reply whose
replica failed or was found silent before the reply's first words is sent once more to
another replica (`_ReplyStream`): the caller hears a reply, not an apology.
A prompt window that slides past the first user message moves the conversation (its prefix
changed anyway), and a warm-up before the first question is homed by the system prompt alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from models.base import PROMPT_PROGRESS, ChatMessage, LLMEngine, Sampling
from models.errors import CadenceError, CapacityError, ConfigError, WorkerUnavailableError
from models.http_send import send_detached
from models.remote import CONNECT_FAILURES, replica_urls
from models.replicas import DEFAULT_COOL_OFF_S, ReplicaSet

log = logging.getLogger(__name__)

DIALECTS = ("llama-server", "vllm", "trtllm-serve", "openai")
# vLLM's `--scheduling-policy priority` takes a per-request priority, lower first: a turn's
# reply goes ahead of a background prefix warm-up.
_REPLY_PRIORITY, _WARM_UP_PRIORITY = 0, 10

# A pooled connection the server closed as the request went out on it: the request was never
# answered (no response header came back), so it is sent once more, on a fresh connection.
# llama-server closes the connection after every streamed reply, and a request sent in the
# instant before its close arrives meets it: measured, 9 of 40 requests sent right after a
# warm-up (a turn after its prompt's warm-up, or after the passages' one) failed so. Not a
# timeout: a server that is slow to answer is not sent the request twice.
_STALE_CONNECTION = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


@dataclass(frozen=True)
class OpenAIChatOptions:
    base_url: str  # the server's root, e.g. http://127.0.0.1:8101 (the client adds /v1/...)
    model: str = "default"  # the model name at the server; llama-server serves one and ignores it
    dialect: str = "llama-server"  # which sampling extensions the server takes: one of DIALECTS
    default_sampling: Sampling = field(default_factory=Sampling)  # used where an agent sets none
    # A worker that does not accept the connection within this is down: the call hears a
    # fallback within the 2 s a caller tolerates, instead of silence.
    connect_timeout_s: float = 1.0
    # Longest gap between two streamed pieces (the first one included) before giving up.
    read_timeout_s: float = 15.0
    # Requests this agent server keeps open at the LLM server; past it a turn is refused at
    # once (CapacityError), never queued behind minutes of other calls' replies.
    max_in_flight: int = 32
    use_priority: bool = False  # send vLLM's per-request priority (needs --scheduling-policy priority)
    # More servers of the same model beside base_url (its replicas); conversations spread over all.
    replica_urls: tuple[str, ...] = ()
    cool_off_s: float = DEFAULT_COOL_OFF_S  # a server that refused a connection gets no reply for this long
    # A server a reply was given up on for silence gets no reply for this long: long enough
    # for its worker's probes to find it hung and restart it (~12 s for a stopped llama-server).
    stall_cool_off_s: float = 30.0
    context_tokens: int | None = None  # one request's context at the server (None: not known here)

    @property
    def urls(self) -> tuple[str, ...]:
        """Every server of the model: base_url first."""
        return (self.base_url, *self.replica_urls)

    def __post_init__(self) -> None:
        replica_urls(self.urls, "LLM server")
        if self.cool_off_s < 0 or self.stall_cool_off_s < 0:
            raise ConfigError("LLM server client: cool_off_s and stall_cool_off_s >= 0 required")
        if self.dialect not in DIALECTS:
            raise ConfigError(f"LLM server dialect {self.dialect!r} is unknown; known: {', '.join(DIALECTS)}")
        if self.max_in_flight < 1 or self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise ConfigError("LLM server client: max_in_flight >= 1 and timeouts > 0 required")


class LLMServerError(CadenceError):
    """The LLM server answered, but not with a reply stream (a 4xx/5xx other than 503)."""


class OpenAIChatLLMEngine(LLMEngine):
    def __init__(self, options: OpenAIChatOptions) -> None:
        self.options = options
        self.context_tokens = options.context_tokens
        self.reports_prompt_progress = options.dialect == "llama-server"  # its `return_progress`
        self._replicas = ReplicaSet(replica_urls(options.urls, "LLM server"), cool_off_s=options.cool_off_s)
        # A conversation leaves its home replica once that has its share of the replies open.
        self._busy_at = options.max_in_flight / len(options.urls)
        self._clients: dict[str, httpx.AsyncClient] = {}
        # Replies that have had nothing from their replica yet (weak: one dropped unread goes).
        self._unanswered: weakref.WeakSet[_ReplyStream] = weakref.WeakSet()
        self._in_flight = 0
        self._generating = 0  # streams that have produced their first piece and not ended
        self._last_batch: int | None = None

    @property
    def queue_depth(self) -> int:
        return self._in_flight

    @property
    def batch_size(self) -> int | None:
        """How many of this server's replies were generating side by side when the last began."""
        return self._last_batch

    def health(self) -> dict[str, Any]:
        return {**super().health(), "replicas": self._replicas.states()}

    def load(self) -> None:
        """Checks every server answers (blocking; they are started and awaited before this)."""
        for url in self._replicas.urls:
            try:
                answer = httpx.get(f"{url}/health", timeout=self.options.connect_timeout_s * 5)
            except httpx.HTTPError as exc:
                raise WorkerUnavailableError(f"LLM server at {url} is unreachable: {exc}") from exc
            if answer.status_code != 200:
                raise WorkerUnavailableError(f"LLM server at {url} is not ready ({answer.status_code})")

    def warm_up(self) -> None:
        pass  # the server warmed itself up before reporting healthy

    def _http(self, url: str) -> httpx.AsyncClient:
        if url not in self._clients:
            timeout = httpx.Timeout(self.options.read_timeout_s, connect=self.options.connect_timeout_s)
            # One connection per concurrent stream: the pool must not become the queue. None is
            # kept for llama-server, which closes a connection after its streamed reply or 5 s
            # idle: kept, each was a dead descriptor here (CLOSE_WAIT) until a later request
            # found it closed (up to max_in_flight of them), and a request sent in the instant
            # of the close was lost (_STALE_CONNECTION).
            keep = 0 if self.options.dialect == "llama-server" else self.options.max_in_flight
            limits = httpx.Limits(max_connections=self.options.max_in_flight, max_keepalive_connections=keep)
            self._clients[url] = httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits)
        return self._clients[url]

    def request_body(self, messages: Sequence[ChatMessage], *, max_tokens: int, sampling: Sampling | None,
                     priority: int = _REPLY_PRIORITY) -> dict[str, Any]:
        chosen = (sampling or Sampling()).over(self.options.default_sampling)
        body: dict[str, Any] = {"model": self.options.model, "messages": [dict(m) for m in messages],
                                "max_tokens": max_tokens, "stream": True}
        if chosen.temperature is not None:
            body["temperature"] = chosen.temperature
        if chosen.top_p is not None:
            body["top_p"] = chosen.top_p
        if chosen.repeat_penalty is not None:
            if self.options.dialect == "llama-server":
                body["repeat_penalty"] = chosen.repeat_penalty
            elif self.options.dialect in ("vllm", "trtllm-serve"):
                body["repetition_penalty"] = chosen.repeat_penalty
        if self.options.dialect == "llama-server":
            body["cache_prompt"] = True  # reuse the slot's KV cache for the common prefix
            # An event when the slot starts on the prompt and after each batch of it: proof of
            # life while a long prompt is read (streamed as PROMPT_PROGRESS).
            body["return_progress"] = True
        if self.options.use_priority and self.options.dialect == "vllm":
            body["priority"] = priority
        return body

    def stream_chat(self, messages: Sequence[ChatMessage], *, max_tokens: int,
                    sampling: Sampling | None = None) -> AsyncIterator[str]:
        body = self.request_body(messages, max_tokens=max_tokens, sampling=sampling)
        return _ReplyStream(self, body)

    def _went_silent(self, url: str) -> None:
        self._replicas.mark_down(url, for_s=self.options.stall_cool_off_s, why="went silent past a reply's deadline")
        if len(self._replicas.urls) == 1:
            return
        log.warning("LLM server at %s went silent past a reply's deadline; replies go to the other replicas "
                    "for %.0f s", url, self.options.stall_cool_off_s)
        # Replies still waiting there for a first sign of life would wait out their own deadlines.
        for reply in list(self._unanswered):
            if reply.url == url:
                reply.move()

    async def warm_prefix(self, messages: Sequence[ChatMessage], *,
                          on_progress: Callable[[], None] | None = None) -> None:
        # One generated token makes the server evaluate (and cache) the whole prefix.
        body = self.request_body(messages, max_tokens=1, sampling=None, priority=_WARM_UP_PRIORITY)
        async for piece in self._stream(body):
            if piece == PROMPT_PROGRESS and on_progress is not None:
                on_progress()

    async def _stream(self, body: dict[str, Any], reply: _ReplyStream | None = None) -> AsyncIterator[str]:
        if self._in_flight >= self.options.max_in_flight:
            raise CapacityError(f"LLM server at {', '.join(self._replicas.urls)} has {self._in_flight} replies open; "
                                "retry later")
        self._in_flight += 1
        started = False
        try:
            url, response = await self._open(body, reply)
            try:
                await _raise_for_status(response, url)
                parser = ServerSentEvents()
                async for raw in response.aiter_text():
                    for event in parser.feed(raw):
                        piece = _content_of(event)
                        if piece:
                            if not started:
                                started = True
                                self._generating += 1
                                self._last_batch = self._generating
                            yield piece
                        elif "prompt_progress" in event:
                            yield PROMPT_PROGRESS  # still reading the prompt
            except httpx.TransportError as exc:  # reset, timed out, died mid-stream
                raise _unavailable(url, exc) from exc
            finally:
                self._replicas.finished(url)
                await response.aclose()
        finally:
            self._in_flight -= 1
            if started:
                self._generating -= 1

    async def _open(self, body: dict[str, Any], reply: _ReplyStream | None) -> tuple[str, httpx.Response]:
        """The conversation's replica's response, headers read, counted in flight there until the
        caller calls finished(url). A refused connection is tried once more on another replica;
        a stale pooled one, once more on the same replica. `reply.url` is the replica asked."""
        url = self._replicas.pick_for(conversation_key(body["messages"]), busy_at=self._busy_at)
        retried = resent = False
        while True:
            if reply is not None:
                reply.url = url  # before the send: a hung server takes the connection, never answers
            self._replicas.started(url)
            client = self._http(url)
            try:
                return url, await send_detached(client, client.build_request("POST", "/v1/chat/completions",
                                                                             json=body), stream=True)
            except httpx.TransportError as exc:
                self._replicas.finished(url)
                if isinstance(exc, _STALE_CONNECTION) and not resent:
                    log.debug("LLM server at %s dropped the request unanswered (%s); sending it again", url, exc)
                    resent = True
                    continue
                if not isinstance(exc, CONNECT_FAILURES):
                    raise _unavailable(url, exc) from exc
                self._replicas.mark_down(url)
                other = None if retried else self._replicas.alternative(url)
                if other is None:
                    raise _unavailable(url, exc) from exc
                log.info("LLM server at %s refused the connection (%s); trying %s", url, type(exc).__name__, other)
                url, retried = other, True
            except BaseException:  # cancelled: a barge-in or a hang-up
                self._replicas.finished(url)
                raise

    async def close(self) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            await client.aclose()


class _ReplyStream:
    """One reply's pieces (the client's `_stream`), knowing which replica was asked for them.

    Told `stalled()` by models/stalls.without_stalls, it has the client pass that replica over.
    Its request is sent once more, to another replica, when that can cost the caller nothing:
      moved      its replica has not answered at all yet (no piece, no progress through the
                 prompt) and another reply found that replica silent (`move()`);
      failed     its replica failed mid-request (killed, reset) before the reply's first words.
    Once only, and never after words: the caller has heard nothing of this reply. For an
    engine that reports progress, a PROMPT_PROGRESS is yielded on the resend, restarting the
    first-answer deadline for the new request."""

    def __init__(self, engine: OpenAIChatLLMEngine, body: dict[str, Any]) -> None:
        self.url: str | None = None
        self._engine, self._body = engine, body
        self._pieces = engine._stream(body, self)
        self._moved: asyncio.Event | None = None  # made on the first wait, in the caller's loop
        self._said = False  # a piece of text has been passed on
        self._resent = False
        if len(engine.options.urls) > 1:  # with one replica there is nowhere to send it again
            engine._unanswered.add(self)

    def __aiter__(self) -> _ReplyStream:
        return self

    async def __anext__(self) -> str:
        while True:
            try:
                piece = await self._next_piece()
            except WorkerUnavailableError as exc:
                if not self._may_resend():
                    raise
                self._engine._replicas.mark_down(self.url, why="failed mid-request")
                log.warning("%s; the reply, not begun, is sent to another replica", exc)
                await self._resend()
                if self._engine.reports_prompt_progress:
                    return PROMPT_PROGRESS
                continue
            if piece != PROMPT_PROGRESS:
                self._said = True
            return piece

    async def _next_piece(self) -> str:
        if self not in self._engine._unanswered:
            return await self._pieces.__anext__()
        self._moved = self._moved or asyncio.Event()
        step = asyncio.ensure_future(self._pieces.__anext__())
        moved = asyncio.ensure_future(self._moved.wait())
        try:
            await asyncio.wait((step, moved), return_when=asyncio.FIRST_COMPLETED)
        finally:
            moved.cancel()
            if not step.done():
                step.cancel()  # moved, or our own caller cancelled (barge-in): the request is withdrawn
                with contextlib.suppress(asyncio.CancelledError, CadenceError):
                    await step
        if step.done() and not step.cancelled():
            self._engine._unanswered.discard(self)  # any item is a sign of life, or the stream's end
            return step.result()
        log.info("reply moved off %s, found silent, before its first answer", self.url)
        await self._resend()
        if self._engine.reports_prompt_progress:
            return PROMPT_PROGRESS
        return await self._next_piece()

    def _may_resend(self) -> bool:
        return (not self._said and not self._resent and self.url is not None
                and self._engine._replicas.alternative(self.url) is not None)

    async def _resend(self) -> None:
        self._resent = True
        self._engine._unanswered.discard(self)  # the next replica is not moved off again
        await self._pieces.aclose()
        self._pieces = self._engine._stream(self._body, self)

    def move(self) -> None:
        if self._moved is not None and not self._resent:
            self._moved.set()

    async def aclose(self) -> None:
        self._engine._unanswered.discard(self)
        await self._pieces.aclose()

    def stalled(self) -> None:
        self._engine._unanswered.discard(self)
        if self.url is not None:
            self._engine._went_silent(self.url)


def conversation_key(messages: Sequence[ChatMessage]) -> str:
    """What stays the same through a conversation: its first system and first user message."""
    system = next((m.get("content") for m in messages if m.get("role") == "system"), None)
    user = next((m.get("content") for m in messages if m.get("role") == "user"), None)
    return json.dumps([system, user], default=str)


def _unavailable(url: str, exc: httpx.TransportError) -> WorkerUnavailableError:
    return WorkerUnavailableError(f"LLM server at {url} failed mid-request ({type(exc).__name__}); "
                                  "the worker is restarting or overloaded")


class ServerSentEvents:
    """text/event-stream bytes -> the JSON objects of its `data:` lines, across chunk cuts."""

    def __init__(self) -> None:
        self._partial = ""
        self.finished = False  # `data: [DONE]` seen

    def feed(self, text: str) -> list[dict[str, Any]]:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()  # the last piece may be a line cut in two
        events = []
        for line in lines:
            line = line.strip()
            if not line.startswith("data:"):
                continue  # comments (": ping"), event names, blank separators
            payload = line[len("data:"):].strip()
            if payload == "[DONE]":
                self.finished = True
                continue
            try:
                events.append(json.loads(payload))
            except json.JSONDecodeError as exc:
                raise LLMServerError(f"LLM server sent a malformed event: {payload[:80]!r}") from exc
        return events


def _content_of(event: dict[str, Any]) -> str | None:
    if "error" in event:
        raise LLMServerError(f"LLM server error mid-reply: {str(event['error'])[:200]}")
    choices = event.get("choices") or []
    if not choices:
        return None
    return (choices[0].get("delta") or {}).get("content")


async def _raise_for_status(response: httpx.Response, base_url: str) -> None:
    if response.status_code == 200:
        return
    detail = (await response.aread()).decode("utf-8", "replace")[:300]
    if response.status_code == 503:
        raise CapacityError(f"LLM server at {base_url} is full or loading (503); retry later: {detail}")
    raise LLMServerError(f"LLM server at {base_url} answered {response.status_code}: {detail}")

