"""One reply from the LLM, shaped for a caller: the same path for calls and text chat.

The engine's pieces pass a sentence budget (a phone reply is two sentences; a small model
that rambles past them is cut and its generation stopped) and then a guard that keeps the
system prompt and its secrets out of what is said (`PromptLeakGuard`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence

from models.base import PROMPT_PROGRESS, ChatMessage, LLMEngine, Sampling
from models.stalls import StallLimits, without_stalls
from pipelines.knowledge_context import REFERENCE_CLOSE, REFERENCE_OPEN, Passage, with_references
from pipelines.reply_shaping import MarkupStop, PromptLeakGuard, SentenceBudget

# A reply that starts writing the passages' fence is reading its context out: it ends there.
FENCE_MARKERS = (REFERENCE_OPEN, REFERENCE_CLOSE)


def prompt_chars(messages: Sequence[ChatMessage]) -> int:
    """Characters the engine reads: every message's text (a list of parts counts as its text)."""
    def text(content) -> str:
        if isinstance(content, list):
            return "".join(part.get("text", "") for part in content if isinstance(part, dict))
        return content if isinstance(content, str) else ""
    return sum(len(text(m.get("content"))) for m in messages)


async def shaped_reply(engine: LLMEngine, messages: Sequence[ChatMessage], *, passages: Sequence[Passage] = (),
                       sampling: Sampling | None, max_tokens: int, max_sentences: int, system_prompt: str,
                       on_redacted: Callable[[int], None] = lambda count: None,
                       stall_limits: StallLimits | None = None) -> AsyncIterator[str]:
    """Streams the reply's text. Closing it early (barge-in) stops generation on the engine.
    An engine that goes quiet past `stall_limits` (its first token's limit grown by the prompt's
    length, StallLimits.for_request, or restarted by each report of progress through it) ends it
    with StalledError."""
    # With no cap and nothing to guard, pieces pass exactly as the engine streams them.
    budget = SentenceBudget(max_sentences) if max_sentences > 0 else None
    guard = PromptLeakGuard(system_prompt) if system_prompt.strip() else None
    markup = MarkupStop(FENCE_MARKERS) if passages else None
    request = with_references(messages, passages)
    progress = PROMPT_PROGRESS if engine.reports_prompt_progress else None
    if stall_limits is not None and progress is None:
        # The allowance is for what the engine must read, the whole prompt, in silence. An engine
        # that reports its reading shows life every batch: each report restarts the plain deadline.
        stall_limits = stall_limits.for_request(prompt_chars(request))
    pieces = without_stalls(engine.stream_chat(request, max_tokens=max_tokens, sampling=sampling),
                            stall_limits, what="LLM reply", progress=progress)
    fenced = False
    try:
        async for piece in pieces:
            piece, fenced = markup.feed(piece) if markup else (piece, False)
            text, done = budget.feed(piece) if budget else (piece, False)
            done = done or fenced
            safe = guard.feed(text) if guard else text
            if safe:
                yield safe
            if done:
                break
        tail = (markup.flush() if markup and not fenced else "")
        tail = (budget.feed(tail)[0] + budget.flush()) if budget else tail
        tail = (guard.feed(tail) + guard.flush()) if guard else tail
        if tail:
            yield tail
    finally:
        await pieces.aclose()
        if guard is not None and guard.redactions:
            on_redacted(guard.redactions)
