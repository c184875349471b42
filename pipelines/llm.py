"""The LLM as a pipecat service over our `LLMEngine`.

On an `LLMContextFrame` it streams the reply as `LLMTextFrame`s, shaped by
`pipelines.reply.shaped_reply` (the agent's sampling, sentence budget and prompt-leak
guard); a `TurnContextFrame` also brings the turn's retrieved passages. A barge-in cancels
the frame task; closing the engine's stream then stops generation on the model thread. A
`PrefetchedPassagesFrame` (passages found at a pause) has the engine read the prompt up to
them before the turn ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from pipecat.frames.frames import (Frame, LLMContextFrame, LLMFullResponseEndFrame, LLMFullResponseStartFrame,
                                   StartFrame)
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.llm_service import LLMService
from pipecat.services.settings import LLMSettings

from models.errors import CadenceError, StalledError
from models.base import ChatMessage, LLMEngine, Sampling
from models.stalls import StallLimits, failure_kind
from pipelines.frames import PrefetchedPassagesFrame
from pipelines.knowledge_context import Passage, reference_message, sealed_dialogue
from pipelines.reply import prompt_chars, shaped_reply

log = logging.getLogger(__name__)


# Said when the LLM cannot answer (its worker restarts or is stuck, every slot is busy, a bug):
# the caller hears why nothing came, and asks again, instead of waiting on silence.
FALLBACK_REPLY = "Sorry, I lost my train of thought. Could you say that again?"
# Said after a reply that was cut off part way: the caller has heard a sentence stop.
CUT_SHORT_REPLY = " Sorry, I lost my train of thought."


# Marks where an over-long message was cut: the model should know it hears the end of it.
ELIDED = "[...] "


def is_dialogue(message: ChatMessage) -> bool:
    """A caller's or the agent's words: what the prompt window counts and moves over."""
    return message.get("role") in ("user", "assistant") and isinstance(message.get("content"), str)


def window_start(dialogue_messages: int, max_history: int) -> int:
    """Where the prompt's dialogue starts, counted in dialogue messages: the overflow over
    `max_history`, rounded up to whole steps of half the window (see `prompt_window`)."""
    step = max(1, max_history // 2)
    overflow = max(0, dialogue_messages - max_history)
    return -(-overflow // step) * step


def prompt_window(messages: list[ChatMessage], max_history: int,
                  max_dialogue_chars: int | None = None) -> list[ChatMessage]:
    """System messages plus at most `max_history` recent dialogue messages, and at most
    `max_dialogue_chars` of dialogue (None: no limit).

    The window's start moves in steps of half the window, not one message per turn: the
    LLM engine reuses the KV cache of the longest unchanged prompt prefix, and a start that
    slid every turn would re-evaluate the whole history every turn (seconds on a CPU).

    The character budget keeps the prompt inside the model's context whatever the callers say
    (a caller who talks for ten minutes is one message of ~9,000 characters): the oldest
    messages go first, and a newest message over the budget alone keeps its end, which the
    reply is about. Within the budget, the prompt is the step-wise window above.
    """
    system = [m for m in messages if m.get("role") == "system"]
    dialogue = [m for m in messages if is_dialogue(m)]
    window = dialogue[window_start(len(dialogue), max_history):]
    if max_dialogue_chars is None:
        return system + window
    while len(window) > 1 and sum(len(m["content"]) for m in window) > max_dialogue_chars:
        window = window[1:]
    if window and len(window[0]["content"]) > max_dialogue_chars:
        kept = max(0, max_dialogue_chars - len(ELIDED))
        window = [{**window[0], "content": ELIDED + window[0]["content"][len(window[0]["content"]) - kept:]}]
    return system + window


class EngineLLMService(LLMService):
    def __init__(self, engine: LLMEngine, *, max_reply_tokens: int, max_history_messages: int,
                 max_dialogue_chars: int | None = None, system_prompt: str = "", sampling: Sampling | None = None,
                 max_reply_sentences: int = 0, on_redacted: Callable[[int], None] = lambda count: None,
                 stall_limits: StallLimits | None = None, on_failed: Callable[[str], None] = lambda kind: None,
                 **kwargs) -> None:
        """`stall_limits`: how long a reply waits for its first token and then for each next
        one before it is given up (deadlines.llm_*); None: as long as the engine takes.
        `on_failed(kind)`: told of every reply lost (kind: stalled or error)."""
        super().__init__(
            settings=LLMSettings(
                model=None,
                system_instruction=None,
                temperature=None,
                max_tokens=max_reply_tokens,
                top_p=None,
                top_k=None,
                frequency_penalty=None,
                presence_penalty=None,
                seed=None,
                filter_incomplete_user_turns=False,
                user_turn_completion_config=None,
            ),
            **kwargs,
        )
        self._engine = engine
        self._max_reply_tokens = max_reply_tokens
        self._max_history = max_history_messages
        self._max_dialogue_chars = max_dialogue_chars
        self._system_prompt = system_prompt
        self._sampling = sampling
        self._max_reply_sentences = max_reply_sentences
        self._on_redacted = on_redacted
        self._stall_limits = stall_limits
        self._on_failed = on_failed
        self._warm_task: asyncio.Task | None = None
        self._passages_warm: asyncio.Task | None = None  # reading the prompt up to passages found early
        self._warm_chars = 0  # the prompt characters the running warm-up reads
        self._warm_heard_at = 0.0  # loop time the running warm-up began or last reported progress
        self._warm_reported = False  # the running warm-up has reported progress at least once
        self._spoke = False  # this turn's reply has produced text

    def _window(self, messages: list[ChatMessage]) -> list[ChatMessage]:
        return prompt_window(messages, self._max_history, self._max_dialogue_chars)

    def can_generate_metrics(self) -> bool:
        return True

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        if self._system_prompt.strip():
            # The call's every prompt starts with the agent's: have the engine read it now, while
            # the caller is greeted or starts to speak, not in the first turn's wait (a long
            # prompt read cold on a CPU is seconds; a cached one costs nothing).
            self._start_warm([{"role": "system", "content": self._system_prompt}], name="llm-warm-prompt")

    def _start_warm(self, messages: list[ChatMessage], *, name: str) -> None:
        self._warm_chars = prompt_chars(messages)
        self._warm_heard_at, self._warm_reported = asyncio.get_running_loop().time(), False
        self._warm_task = self.create_task(self._warm(messages), name=name)

    async def _after_warm(self) -> None:
        """A prefix still being warmed is the start of this request: wait for it, so the request
        meets the cache it fills instead of a second, cold slot beside it. A warm-up silent for
        longer than a request of its prompt may wait for its first token means a stuck model:
        the turn fails as that request would have (StalledError), one deadline in, not two. As
        for a request, an engine's reports of progress through the prompt each restart that
        deadline; for one that reports none it is grown by the prompt's length."""
        task = self._warm_task
        if task is None or task.done():
            return
        if self._stall_limits is None:
            await asyncio.wait({task})
            return
        loop = asyncio.get_running_loop()
        if self._engine.reports_prompt_progress:
            limit = self._stall_limits.first_s
        else:
            limit = self._stall_limits.for_request(self._warm_chars).first_s
        while True:
            heard_at = self._warm_heard_at
            done, _ = await asyncio.wait({task}, timeout=max(0.0, heard_at + limit - loop.time()))
            if done:
                return
            if self._warm_heard_at == heard_at:  # no report since: stuck
                break
        await self.cancel_task(task)
        since = " of its last progress" if self._warm_reported else ""
        raise StalledError(f"LLM reply: no first answer within {limit:.1f} s{since} (the prompt's warm-up)")

    def _warm_progressed(self) -> None:
        self._warm_heard_at, self._warm_reported = asyncio.get_running_loop().time(), True

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, PrefetchedPassagesFrame):
            self._start_passages_warm(frame)
            return  # consumed: nothing downstream needs it
        if not isinstance(frame, LLMContextFrame):
            await self.push_frame(frame, direction)
            return
        await self.push_frame(LLMFullResponseStartFrame())
        await self.start_processing_metrics()
        self._spoke = False
        try:
            await self._generate(frame.context, getattr(frame, "passages", ()))
        except Exception as exc:  # whatever failed, the caller hears it; the call goes on
            if not isinstance(exc, CadenceError):
                log.exception("LLM reply failed")
            else:  # a known failure (a stall, a worker gone): one line saying which, no traceback
                log.warning("LLM reply lost, the caller hears an apology: %s", exc)
            self._on_failed(failure_kind(exc))
            await self.push_error(error_msg=f"LLM unavailable: {exc}", exception=exc)
            await self._push_llm_text(CUT_SHORT_REPLY if self._spoke else FALLBACK_REPLY)
        finally:
            await self.stop_processing_metrics()
            await self.push_frame(LLMFullResponseEndFrame())

    async def _generate(self, context: LLMContext, passages) -> None:
        history = list(context.get_messages())
        messages = self._window(history)
        await self.start_ttfb_metrics()
        await self._after_warm()
        pieces = shaped_reply(self._engine, messages, passages=passages, sampling=self._sampling,
                              max_tokens=self._max_reply_tokens, max_sentences=self._max_reply_sentences,
                              system_prompt=self._system_prompt, on_redacted=self._on_redacted,
                              stall_limits=self._stall_limits)
        reply = []
        try:
            async for piece in pieces:
                await self.stop_ttfb_metrics()
                reply.append(piece)
                self._spoke = True
                await self._push_llm_text(piece)
        finally:
            await pieces.aclose()
        self._maybe_warm_next_prefix(history, messages, "".join(reply), used_passages=bool(passages))

    def _maybe_warm_next_prefix(self, history: list[ChatMessage], window: list[ChatMessage], reply: str, *,
                                used_passages: bool) -> None:
        """If the next turn's prompt will not extend this one's, it shares only part of the
        cached prefix: have the engine evaluate it now, while the caller listens. That is so
        when the window's start moves, and after every turn with passages: they sat before
        this turn's question, and the next prompt has the question and reply there instead."""
        following = history + [{"role": "assistant", "content": reply}, {"role": "user", "content": ""}]
        next_window = self._window(following)[:-1]
        if used_passages or next_window[: len(window)] != window:
            if self._warm_task is None or self._warm_task.done():
                self._start_warm(next_window, name="llm-warm-prefix")

    def _start_passages_warm(self, frame: PrefetchedPassagesFrame) -> None:
        if frame.context is None or not frame.passages or not (self._passages_warm is None or self._passages_warm.done()):
            return
        # Not awaited: the passages are ready now; the warm-up is only a head start. A plain task
        # (pipecat's create_task would log a failure): owned here, cancelled in cleanup.
        self._passages_warm = asyncio.get_running_loop().create_task(
            self.warm_for_passages(frame.context, frame.passages), name="llm-warm-passages")
        self._passages_warm.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def warm_for_passages(self, context: LLMContext, passages: list[Passage]) -> None:
        """The caller paused and passages for their question are ready: evaluate the prompt up
        to them now (the question itself follows them), so the turn's prefill is short."""
        messages = self._window(list(context.get_messages())) + [reference_message(passages)]
        await self._warm(messages)

    async def cleanup(self) -> None:
        if self._warm_task is not None:
            await self.cancel_task(self._warm_task)
        if self._passages_warm is not None:
            self._passages_warm.cancel()
            await asyncio.gather(self._passages_warm, return_exceptions=True)
        await super().cleanup()

    async def _warm(self, messages: list[ChatMessage]) -> None:
        try:
            # Sealed as the reply's request is (`with_references`), or the prefixes would differ.
            await self._engine.warm_prefix(sealed_dialogue(messages), on_progress=self._warm_progressed)
        except CadenceError:
            pass  # only a hint: a busy engine skips it
