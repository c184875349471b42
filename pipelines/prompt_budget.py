"""How much of the LLM's context a call's dialogue may take.

Every request holds the agent's system prompt, the turn's passages, the dialogue (history and
the caller's turn) and room for the reply, and all of it must fit the context the model
serves one stream with, or the engine refuses the request (llama-server: 400, "exceeds the
available context size") and the caller hears an apology. The system prompt is fixed per
agent and the passages and the reply have budgets of their own, so the dialogue gets what is
left, up to llm.max_dialogue_chars. An agent whose prompt leaves the dialogue less than
MIN_DIALOGUE_CHARS is refused when it is defined, naming the most its prompt may hold.

The pipeline has no tokenizer, so characters stand in for tokens: CHARS_PER_TOKEN is a
cautious figure for English (SmolLM2's tokenizer reads the clinic's documents at ~3.8
characters a token; prose in most tokenizers is 3.5-4.5). Text with fewer characters per
token (code, many other scripts) can still overflow: give such agents a larger context.
"""

from __future__ import annotations

from dataclasses import dataclass

CHARS_PER_TOKEN = 3.0
# Chat-template markup around each message (role headers, turn ends) and the passages' fence,
# for a window of up to a dozen messages.
TEMPLATE_TOKENS = 128
# The least dialogue an agent's prompt must leave room for: the caller's turn and the last
# exchange, in a few sentences each.
MIN_DIALOGUE_CHARS = 600


@dataclass(frozen=True)
class PromptBudget:
    context_tokens: int  # one stream's context at the LLM engine
    reply_tokens: int  # the reply's own budget (max_reply_tokens)
    passage_tokens: int  # the passages' budget (0 without retrieval)

    def room_chars(self) -> int:
        """Characters left for the system prompt and the dialogue together."""
        tokens = self.context_tokens - self.reply_tokens - self.passage_tokens - TEMPLATE_TOKENS
        return max(0, int(tokens * CHARS_PER_TOKEN))

    def dialogue_chars(self, system_prompt: str, max_dialogue_chars: int) -> int:
        """The dialogue's share for an agent with `system_prompt`: what the prompt leaves, at most
        `max_dialogue_chars`."""
        return max(0, min(max_dialogue_chars, self.room_chars() - len(system_prompt)))

    def max_prompt_chars(self) -> int:
        """The longest system prompt that still leaves MIN_DIALOGUE_CHARS of dialogue."""
        return max(0, self.room_chars() - MIN_DIALOGUE_CHARS)

    def refusal(self, system_prompt: str) -> str | None:
        """Why a system prompt does not fit this context (None: it fits)."""
        if len(system_prompt) <= self.max_prompt_chars():
            return None
        return (f"system_prompt is {len(system_prompt)} characters; with the LLM's context of "
                f"{self.context_tokens} tokens per call, {self.passage_tokens} for passages and "
                f"{self.reply_tokens} for the reply, it may be at most {self.max_prompt_chars()} so the "
                f"dialogue keeps {MIN_DIALOGUE_CHARS} (shorten it, lower knowledge.max_tokens, or serve the "
                f"LLM with a larger context)")
