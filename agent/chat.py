"""Text chat with an agent: the same retrieval + LLM path as a call, for developers.

`POST /api/agents/{name}/chat` with `{"message": "...", "history": [...]}` streams
server-sent events, one JSON object per `data:` line:
    {"type": "delta", "text": "..."}                 the reply as it is written
    {"type": "done", "reply": "...", "passages": [{"text", "score", "source", "chunk_id"}],
     "timing_ms": {"retrieval", "llm_first_token", "total"}, "redactions": n}
    {"type": "error", "error": "...", "retryable": bool}
History holds user and assistant messages only: the agent's system prompt is the agent's,
and a client cannot replace it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from agent.agent_registry import AgentRegistry
from agent.config import CadenceConfig
from agent.errors import CadenceError, ConfigError
from agent.metrics import CadenceMetrics
from models.base import ChatMessage, LLMEngine
from pipelines.call_agent import CallAgent
from pipelines.knowledge_context import Passage, fit_passages
from pipelines.llm import prompt_window
from pipelines.reply import shaped_reply
from pipelines.retrieval import SearchPassages

log = logging.getLogger(__name__)

MAX_MESSAGE_CHARS = 2000  # ~2 minutes of speech: more than any caller's turn
MAX_HISTORY_MESSAGES = 50
MAX_HISTORY_MESSAGE_CHARS = 4000


@dataclass(frozen=True)
class ChatRequest:
    message: str
    history: tuple[ChatMessage, ...]


def parse_chat_request(data: Any) -> ChatRequest:
    """ConfigError (-> 422) names the field that is wrong."""
    if not isinstance(data, dict):
        raise ConfigError("chat body must be a JSON object: {\"message\": \"...\", \"history\": [...]}")
    unknown = set(data) - {"message", "history"}
    if unknown:
        raise ConfigError(f"chat: unknown fields {sorted(unknown)}; known: ['history', 'message']")
    message = data.get("message")
    if not isinstance(message, str) or not message.strip():
        raise ConfigError("chat.message must be a non-empty string")
    if len(message) > MAX_MESSAGE_CHARS:
        raise ConfigError(f"chat.message is {len(message)} characters; the limit is {MAX_MESSAGE_CHARS}")
    history = data.get("history", [])
    if not isinstance(history, list) or len(history) > MAX_HISTORY_MESSAGES:
        raise ConfigError(f"chat.history must be a list of at most {MAX_HISTORY_MESSAGES} messages")
    for i, item in enumerate(history):
        where = f"chat.history[{i}]"
        if not isinstance(item, dict) or set(item) - {"role", "content"}:
            raise ConfigError(f"{where} must be {{\"role\": ..., \"content\": ...}}")
        if item.get("role") not in ("user", "assistant"):
            raise ConfigError(f"{where}.role must be 'user' or 'assistant' (the system prompt is the agent's)")
        content = item.get("content")
        if not isinstance(content, str) or len(content) > MAX_HISTORY_MESSAGE_CHARS:
            raise ConfigError(f"{where}.content must be a string of at most {MAX_HISTORY_MESSAGE_CHARS} characters")
    return ChatRequest(message=message, history=tuple({"role": m["role"], "content": m["content"]} for m in history))


class TextChat:
    def __init__(self, config: CadenceConfig, agents: AgentRegistry, llm: LLMEngine, metrics: CadenceMetrics,
                 search_for: Callable[[CallAgent], SearchPassages | None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._config = config
        self._agents = agents
        self._llm = llm
        self._metrics = metrics
        self._search_for = search_for
        self._clock = clock

    async def events(self, agent_name: str, request: ChatRequest) -> AsyncIterator[dict[str, Any]]:
        """The reply as events; errors after the stream began arrive as an `error` event."""
        agent = self._agents.for_call(agent_name)  # NotFoundError before the stream starts
        started = self._clock()
        timing: dict[str, float] = {}
        try:
            passages = await self._passages(agent, request.message)
            timing["retrieval"] = _ms(self._clock() - started)
            messages = prompt_window([{"role": "system", "content": agent.system_prompt}, *request.history,
                                      {"role": "user", "content": request.message}],
                                     self._config.llm.max_history_messages, agent.max_dialogue_chars)
            redactions = 0

            def redacted(count: int) -> None:
                nonlocal redactions
                redactions += count
                self._metrics.redactions.labels("chat").inc(count)

            reply = []
            async for text in shaped_reply(self._llm, messages, passages=passages, sampling=agent.sampling,
                                           max_tokens=agent.max_reply_tokens,
                                           max_sentences=agent.max_reply_sentences,
                                           system_prompt=agent.system_prompt, on_redacted=redacted,
                                           stall_limits=self._config.deadlines.llm):
                timing.setdefault("llm_first_token", _ms(self._clock() - started))
                reply.append(text)
                yield {"type": "delta", "text": text}
            timing["total"] = _ms(self._clock() - started)
            yield {"type": "done", "reply": "".join(reply).strip(), "passages": [p.as_dict() for p in passages],
                   "timing_ms": timing, "redactions": redactions}
        except CadenceError as exc:
            log.warning("chat with agent %s failed: %s", agent.name, exc)
            yield {"type": "error", "error": str(exc), "retryable": exc.retryable}

    async def _passages(self, agent: CallAgent, query: str) -> list[Passage]:
        search = self._search_for(agent)
        if search is None or not agent.retrieval.enabled:
            return []
        return fit_passages(await search(query), agent.retrieval.max_tokens)


def sse(event: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(event)}\n\n".encode()


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 1)
