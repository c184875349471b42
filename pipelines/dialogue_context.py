"""A call's LLM context, bounded: dialogue that no prompt can reach again is forgotten.

pipecat's aggregators add two messages to the context every turn (the caller's words, then
what was spoken of the reply), and `prompt_window` only ever sends the newest
`max_history_messages` of them. Kept whole, a long call's context grew by every turn for as
long as the call lasted (the soak's memory growth), and each reply copied and scanned all of
it. The window's start moves in whole steps (pipelines/llm.py: a stable, cacheable prefix), so
the dialogue before it is never in a prompt again while the dialogue only grows; forgetting it
leaves every later prompt exactly as the whole history would give it (tests/test_dialogue_context.py).

Policy: after every change that adds messages, the dialogue before the window's start is
dropped, oldest first; system messages and anything else that is not dialogue are kept. What
is forgotten can no longer be edited (a realtime client's delete or truncate of a message that
old finds nothing); the stored turns keep the whole conversation.
"""

from __future__ import annotations

from pipecat.processors.aggregators.llm_context import LLMContext, LLMContextMessage

from pipelines.llm import is_dialogue, window_start


def forget_unreachable(messages: list[LLMContextMessage], max_history: int) -> list[LLMContextMessage]:
    """`messages` without the dialogue before the prompt window's start (all of it is kept if
    the window starts at the first message)."""
    forget = window_start(sum(1 for m in messages if is_dialogue(m)), max_history)
    if forget == 0:
        return messages
    kept = []
    for message in messages:
        if forget and is_dialogue(message):
            forget -= 1
        else:
            kept.append(message)
    return kept


class DialogueContext(LLMContext):
    """An `LLMContext` that holds at most `max_history_messages` dialogue messages (the
    window `prompt_window` takes them from) besides its system prompt."""

    def __init__(self, messages: list[LLMContextMessage] | None = None, *, max_history_messages: int,
                 **kwargs) -> None:
        super().__init__(messages=messages, **kwargs)
        self._max_history = max_history_messages

    def add_message(self, message: LLMContextMessage) -> None:
        super().add_message(message)
        self._forget()

    def add_messages(self, messages: list[LLMContextMessage]) -> None:
        super().add_messages(messages)
        self._forget()

    def set_messages(self, messages: list[LLMContextMessage]) -> None:
        super().set_messages(forget_unreachable(list(messages), self._max_history))

    def _forget(self) -> None:
        kept = forget_unreachable(self._messages, self._max_history)
        if kept is not self._messages:
            self._messages[:] = kept
