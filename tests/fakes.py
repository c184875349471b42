"""Fakes built on the real engine interfaces, for tests of the code around them."""

from __future__ import annotations

import asyncio
import re
import zlib
from collections.abc import AsyncIterator, Sequence

import numpy as np

from agent.errors import CapacityError, WorkerUnavailableError
from models.base import ASREngine, ChatMessage, EmbeddingEngine, LLMEngine, Sampling, Transcript, TTSEngine


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
    def __init__(self, pieces: Sequence[str], *, delay_s: float = 0.0, refuse: bool = False,
                 fail_after: int | None = None) -> None:
        self.pieces = list(pieces)
        self.fail_after = fail_after  # pieces sent before the "worker" dies mid-reply
        self.delay_s = delay_s
        self.refuse = refuse
        self.prompts: list[list[ChatMessage]] = []
        self.warmed: list[list[ChatMessage]] = []
        self.samplings: list[Sampling | None] = []
        self.closed_early = 0

    def load(self) -> None:
        pass

    async def stream_chat(self, messages: Sequence[ChatMessage], *, max_tokens: int,
                          sampling: Sampling | None = None) -> AsyncIterator[str]:
        self.samplings.append(sampling)
        if self.refuse:
            raise CapacityError("llm engine has 16 requests waiting; retry later")
        self.prompts.append(list(messages))
        sent = 0
        try:
            for piece in self.pieces[:max_tokens]:
                if sent == self.fail_after:
                    raise WorkerUnavailableError("LLM server at http://127.0.0.1:1 failed mid-request")
                await asyncio.sleep(self.delay_s)
                yield piece
                sent += 1
        finally:
            if sent < len(self.pieces[:max_tokens]):
                self.closed_early += 1

    async def warm_prefix(self, messages: Sequence[ChatMessage], *, on_progress=None) -> None:
        self.warmed.append(list(messages))


class ToneTTS(TTSEngine):
    """Emits `chunks` chunks of a constant non-zero signal per sentence, or with `frequency_hz` a
    sine: Opus (WebRTC) removes a constant signal, and the caller would hear nothing."""

    sample_rate = 16_000

    def __init__(self, chunks: int = 3, chunk_samples: int = 1600, frequency_hz: float | None = None) -> None:
        self.chunks = chunks
        self.chunk_samples = chunk_samples
        self.sentences: list[str] = []
        if frequency_hz is None:
            self._chunk = (1000).to_bytes(2, "little", signed=True) * chunk_samples
        else:
            t = np.arange(chunk_samples) / self.sample_rate
            self._chunk = (4000 * np.sin(2 * np.pi * frequency_hz * t)).astype(np.int16).tobytes()

    def load(self) -> None:
        pass

    async def synthesize(self, text: str) -> AsyncIterator[bytes]:
        self.sentences.append(text)
        for _ in range(self.chunks):
            await asyncio.sleep(0)
            yield self._chunk


class HashingEmbedder(EmbeddingEngine):
    """Bag-of-words vectors (each word hashed to a dimension), L2-normalised: texts that
    share words are close. Deterministic and instant, for tests of the code around search."""

    dimensions = 384

    def load(self) -> None:
        pass

    def embed_blocking(self, texts: Sequence[str]) -> np.ndarray:
        vectors = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"[a-z0-9]+", text.lower()):
                vectors[row, zlib.crc32(word.encode()) % self.dimensions] += 1.0
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / np.maximum(norms, 1e-12)

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed_blocking(texts)


class LoopbackServer:
    """A raw TCP server on a free loopback port, for tests that need an HTTP peer behaving as no
    real server library would let it (hanging up mid-answer, answering late). Subclasses write
    `_serve`; `async with` gives the base URL and closes the server after."""

    _server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc) -> None:
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError
