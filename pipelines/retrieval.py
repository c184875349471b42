"""Retrieval in the call: the agent's knowledge, put into the LLM context for one turn.

Sits between the user-turn aggregator and the LLM. On each `LLMContextFrame` it finds the
caller's latest message, retrieves passages for it and sends the context on as a
`TurnContextFrame` that carries them; the LLM service fences them into that one request
(`pipelines.knowledge_context`). The call's context never stores them.

Retrieval starts early: the STT's speculative transcript (taken while the VAD still waits
out its stop time) arrives as a `SpeculativeTranscriptFrame`, and the search runs then.
If the turn ends with that same text, its passages are ready when the context arrives;
otherwise the guess is dropped and the search runs on the final text. Passages found early
also go on to the LLM (`warm_llm_with`: a `PrefetchedPassagesFrame`), which evaluates the
prompt up to them (everything but the caller's question, which comes after them) while the
VAD still waits: the passages' prefill, the real cost of retrieval on a CPU, is then paid
before the turn ends. A turn waits at most `timeout_s` for passages: past that the LLM starts
without them (a slow index must not cost the caller seconds of silence), and the miss is
logged and counted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pipecat.frames.frames import Frame, InterruptionFrame, LLMContextFrame
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

from pipelines.frames import PrefetchedPassagesFrame, SpeculativeTranscriptFrame, TurnContextFrame
from pipelines.knowledge_context import Passage, fit_passages, last_user_text

log = logging.getLogger(__name__)

# query -> ranked passages of this call's agent (top_k already applied)
SearchPassages = Callable[[str], Awaitable[list[Passage]]]


def _as_it_stands(context: LLMContext) -> LLMContext:
    return LLMContext(messages=list(context.get_messages()), tools=context.tools, tool_choice=context.tool_choice)


def _normalise(text: str) -> str:
    """The words of a transcript: the aggregator may re-space or re-punctuate the same words."""
    return " ".join("".join(c if c.isalnum() else " " for c in text.lower()).split())


@dataclass
class _Prefetch:
    query: str
    task: asyncio.Task


class RetrievalProcessor(FrameProcessor):
    def __init__(self, search: SearchPassages, *, max_tokens: int, timeout_s: float,
                 on_miss: Callable[[str], None] = lambda reason: None,
                 warm_llm_with: LLMContext | None = None, **kwargs) -> None:
        """`warm_llm_with`: the call's context, sent on with passages found early so the LLM
        reads the prompt up to them; None: they are kept for the turn only."""
        super().__init__(**kwargs)
        self._search = search
        self._warm_llm_with = warm_llm_with
        self._max_tokens = max_tokens
        self._timeout_s = timeout_s
        self._on_miss = on_miss
        self._prefetch: _Prefetch | None = None
        self.prefetch_hits = 0

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, SpeculativeTranscriptFrame):
            self._start_prefetch(frame.text)
            return  # consumed: nothing downstream needs the guess
        if isinstance(frame, InterruptionFrame):
            self._drop_prefetch()
        if isinstance(frame, LLMContextFrame) and not isinstance(frame, TurnContextFrame) \
                and direction == FrameDirection.DOWNSTREAM:
            await self.push_frame(await self._with_passages(frame), direction)
            return
        await self.push_frame(frame, direction)

    def _start_prefetch(self, text: str) -> None:
        query = _normalise(text)
        if not query or (self._prefetch is not None and self._prefetch.query == query):
            return
        self._drop_prefetch()
        # A plain task, not pipecat's create_task (which logs a failure and returns None):
        # this processor owns it, cancels it in cleanup, and wants a failure as an exception.
        task = asyncio.get_running_loop().create_task(self._prefetch_and_warm(text), name="retrieval-prefetch")
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # a dropped guess may fail unseen
        self._prefetch = _Prefetch(query=query, task=task)

    async def _prefetch_and_warm(self, text: str) -> list[Passage]:
        passages = fit_passages(await self._search(text), self._max_tokens)
        if self._warm_llm_with is not None and passages:
            await self.push_frame(PrefetchedPassagesFrame(passages=passages, context=self._warm_llm_with))
        return passages

    def _drop_prefetch(self) -> None:
        if self._prefetch is not None:
            self._prefetch.task.cancel()
            self._prefetch = None

    async def _with_passages(self, frame: LLMContextFrame) -> TurnContextFrame:
        # The turn's request is the call's context as it stood when the turn ended: the live one
        # changes while the search runs (the assistant side adds the reply it is still speaking),
        # and what is added then belongs after this turn, not in its request.
        frame = LLMContextFrame(context=_as_it_stands(frame.context), speculation=frame.speculation)
        query = last_user_text(frame.context.get_messages())
        prefetch, self._prefetch = self._prefetch, None
        if not query or not query.strip():
            if prefetch is not None:
                prefetch.task.cancel()
            return TurnContextFrame(context=frame.context, speculation=frame.speculation)
        if prefetch is not None and prefetch.query == _normalise(query):
            self.prefetch_hits += 1
            search = prefetch.task
        else:
            if prefetch is not None:
                prefetch.task.cancel()
            search = asyncio.get_running_loop().create_task(self._search(query), name="retrieval")
        try:
            passages = await asyncio.wait_for(asyncio.shield(search), self._timeout_s)
        except asyncio.CancelledError:
            search.cancel()  # barge-in or hang-up: the search is not wanted any more
            raise
        except asyncio.TimeoutError:
            search.cancel()
            log.warning("retrieval took over %.0f ms; this turn is answered without passages", self._timeout_s * 1000)
            self._on_miss("timeout")
            return TurnContextFrame(context=frame.context, speculation=frame.speculation, retrieval_missed=True)
        except Exception as exc:  # an index error must not cost the caller the reply
            log.warning("retrieval failed (%s: %s); this turn is answered without passages",
                        exc.__class__.__name__, exc)
            self._on_miss("error")
            return TurnContextFrame(context=frame.context, speculation=frame.speculation, retrieval_missed=True)
        return TurnContextFrame(context=frame.context, speculation=frame.speculation, passages=fit_passages(passages, self._max_tokens))

    async def cleanup(self) -> None:
        self._drop_prefetch()
        await super().cleanup()
