"""The LLM as a server: one streaming client for every OpenAI-compatible chat endpoint.

llama.cpp's `llama-server --parallel N` (the CPU default: continuous batching, a prompt
cache per slot), `vllm serve` and `trtllm-serve` all stream `/v1/chat/completions` as
server-sent events. The call talks to all of them through this engine; they differ only in
the sampling extensions they accept, which `dialect` names.

Closing the reply iterator (barge-in, hang-up) closes the HTTP response; these servers
notice the closed connection and free the request's slot, so a reply nobody will hear
stops costing the other calls.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from models.base import ChatMessage, LLMEngine, Sampling
from models.errors import CadenceError, CapacityError, ConfigError, WorkerUnavailableError

log = logging.getLogger(__name__)

DIALECTS = ("llama-server", "vllm", "trtllm-serve", "openai")
# vLLM's `--scheduling-policy priority` takes a per-request priority, lower first: a turn's
# reply goes ahead of a background prefix warm-up.
_REPLY_PRIORITY, _WARM_UP_PRIORITY = 0, 10


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

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"LLM server url {self.base_url!r} must start with http:// or https://")
        if self.dialect not in DIALECTS:
            raise ConfigError(f"LLM server dialect {self.dialect!r} is unknown; known: {', '.join(DIALECTS)}")
        if self.max_in_flight < 1 or self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise ConfigError("LLM server client: max_in_flight >= 1 and timeouts > 0 required")


class LLMServerError(CadenceError):
    """The LLM server answered, but not with a reply stream (a 4xx/5xx other than 503)."""


class OpenAIChatLLMEngine(LLMEngine):
    def __init__(self, options: OpenAIChatOptions) -> None:
        self.options = options
        self._client: httpx.AsyncClient | None = None
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

    def load(self) -> None:
        """Checks the server answers (blocking; it is started and awaited before this)."""
        url = f"{self.options.base_url}/health"
        try:
            answer = httpx.get(url, timeout=self.options.connect_timeout_s * 5)
        except httpx.HTTPError as exc:
            raise WorkerUnavailableError(f"LLM server at {self.options.base_url} is unreachable: {exc}") from exc
        if answer.status_code != 200:
            raise WorkerUnavailableError(f"LLM server at {self.options.base_url} is not ready ({answer.status_code})")

    def warm_up(self) -> None:
        pass  # the server warmed itself up before reporting healthy

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            timeout = httpx.Timeout(self.options.read_timeout_s, connect=self.options.connect_timeout_s)
            # One connection per concurrent stream: the pool must not become the queue.
            limits = httpx.Limits(max_connections=self.options.max_in_flight,
                                  max_keepalive_connections=self.options.max_in_flight)
            self._client = httpx.AsyncClient(base_url=self.options.base_url, timeout=timeout, limits=limits)
        return self._client

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
        if self.options.use_priority and self.options.dialect == "vllm":
            body["priority"] = priority
        return body

    async def stream_chat(self, messages: Sequence[ChatMessage], *, max_tokens: int,
                          sampling: Sampling | None = None) -> AsyncIterator[str]:
        body = self.request_body(messages, max_tokens=max_tokens, sampling=sampling)
        async for piece in self._stream(body):
            yield piece

    async def warm_prefix(self, messages: Sequence[ChatMessage]) -> None:
        # One generated token makes the server evaluate (and cache) the whole prefix.
        body = self.request_body(messages, max_tokens=1, sampling=None, priority=_WARM_UP_PRIORITY)
        async for _ in self._stream(body):
            pass

    async def _stream(self, body: dict[str, Any]) -> AsyncIterator[str]:
        if self._in_flight >= self.options.max_in_flight:
            raise CapacityError(f"LLM server at {self.options.base_url} has {self._in_flight} replies open; retry later")
        self._in_flight += 1
        started = False
        try:
            async with self._http().stream("POST", "/v1/chat/completions", json=body) as response:
                await _raise_for_status(response, self.options.base_url)
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
        except httpx.TransportError as exc:  # refused, reset, timed out, died mid-stream
            raise WorkerUnavailableError(
                f"LLM server at {self.options.base_url} failed mid-request ({type(exc).__name__}); "
                "the worker is restarting or overloaded") from exc
        finally:
            self._in_flight -= 1
            if started:
                self._generating -= 1

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


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

