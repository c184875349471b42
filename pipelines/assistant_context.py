"""Edits of a call's LLM context that a client may ask for: instructions added to the agent's
prompt, a message removed, a reply cut to what the caller heard. Plain functions on pipecat's
`LLMContext`; messages are matched by role and text, compared with whitespace collapsed
(pipecat joins a reply's spoken pieces with its own spacing)."""

from __future__ import annotations

from pipecat.processors.aggregators.llm_context import LLMContext


def _squashed(text: str) -> str:
    return " ".join(text.split())


def _text_of(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def set_extra_instructions(context: LLMContext | None, agent_prompt: str, instructions: str | None) -> None:
    """The system message becomes the agent's prompt, then the client's instructions (if any).
    The agent's prompt always leads: a client adds to it, never replaces it."""
    if context is None:
        return
    content = agent_prompt if not instructions else f"{agent_prompt}\n\n{instructions}"
    messages = context.get_messages()
    if messages and messages[0].get("role") == "system":
        messages[0] = {**messages[0], "content": content}
    else:
        messages.insert(0, {"role": "system", "content": content})
    context.set_messages(messages)


def _find_last(messages: list, role: str, text: str) -> int | None:
    wanted = _squashed(text)
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.get("role") == role and _squashed(_text_of(message)) == wanted:
            return index
    return None


def remove_message(context: LLMContext | None, role: str, text: str) -> bool:
    """Removes the newest message with this role and text; False if there is none."""
    if context is None:
        return False
    messages = context.get_messages()
    index = _find_last(messages, role, text)
    if index is None or (index == 0 and role == "system"):  # the agent's own prompt stays
        return False
    del messages[index]
    context.set_messages(messages)
    return True


def cut_reply(context: LLMContext | None, said: str, heard: str) -> bool:
    """The newest assistant message saying `said` (or a part of it: an interrupted reply holds
    what was sent before the cut) now says only `heard`. False if no such message is there yet."""
    if context is None:
        return False
    messages = context.get_messages()
    index = _find_last(messages, "assistant", said)
    if index is None:
        index = _last_assistant_within(messages, said, heard)
    if index is None:
        return False
    if heard.strip():
        messages[index] = {**messages[index], "content": heard}
    else:  # nothing was heard: the reply never happened, as far as the caller knows
        del messages[index]
    context.set_messages(messages)
    return True


def _last_assistant_within(messages: list, said: str, heard: str) -> int | None:
    """The last assistant message, if its text lies between what was heard and what was said."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "assistant":
            text = _squashed(_text_of(messages[index]))
            if text and _squashed(said).startswith(text) and text.startswith(_squashed(heard)):
                return index
            return None
    return None
