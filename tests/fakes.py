"""Fakes built on the real engine interfaces, for tests of the code around them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from agent.errors import CapacityError
from models.base import ASREngine, ChatMessage, LLMEngine, Transcript, TTSEngine


class ScriptedASR(ASREngine):
    def __init__(self, text: str, *, no_speech_probability: float = 0.0) -> None:
        self.text = text
        self.no_speech_probability = no_speech_probability
        self.heard: list[bytes] = []

    def load(self) -> None:
        pass

    async def transcribe(self, pcm16: bytes, *, prompt: str | None = None) -> Transcript:
        self.heard.append(pcm16)
        return Transcript(self.text, len(pcm16) / 2 / self.sample_rate, 0.0,
                          no_speech_probability=self.no_speech_probability)


class ScriptedLLM(LLMEngine):
    def __init__(self, pieces: Sequence[str], *, delay_s: float = 0.0, refuse: bool = False) -> None:
        self.pieces = list(pieces)
        self.delay_s = delay_s
        self.refuse = refuse
        self.prompts: list[list[ChatMessage]] = []
        self.warmed: list[list[ChatMessage]] = []
        self.closed_early = 0

    def load(self) -> None:
        pass

    async def stream_chat(self, messages: Sequence[ChatMessage], *, max_tokens: int) -> AsyncIterator[str]:
        if self.refuse:
            raise CapacityError("llm engine has 16 requests waiting; retry later")
        self.prompts.append(list(messages))
        sent = 0
        try:
            for piece in self.pieces[:max_tokens]:
                await asyncio.sleep(self.delay_s)
                yield piece
                sent += 1
        finally:
            if sent < len(self.pieces[:max_tokens]):
                self.closed_early += 1

    async def warm_prefix(self, messages: Sequence[ChatMessage]) -> None:
        self.warmed.append(list(messages))


class ToneTTS(TTSEngine):
    """Emits `chunks` chunks of a constant non-zero signal per sentence."""

    sample_rate = 16_000

    def __init__(self, chunks: int = 3, chunk_samples: int = 1600) -> None:
        self.chunks = chunks
        self.chunk_samples = chunk_samples
        self.sentences: list[str] = []

    def load(self) -> None:
        pass

    async def synthesize(self, text: str) -> AsyncIterator[bytes]:
        self.sentences.append(text)
        for _ in range(self.chunks):
            await asyncio.sleep(0)
            yield (1000).to_bytes(2, "little", signed=True) * self.chunk_samples
