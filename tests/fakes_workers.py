"""Fake engines for the model-worker tests: they subclass the real ABCs in models/base.py.

Each holds where a test wants it (asyncio.Events for code on the test's loop, a
threading.Event for code on a model thread) and records what happened to it: entered,
cancelled, closed. `serve_stalling_tts` runs a worker in a child process for kill tests.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator, Sequence

import numpy as np

from models.base import ASREngine, EmbeddingEngine, TTSEngine, Transcript

HOLD_LIMIT_S = 30.0  # a model thread held by a test never outlives it by more than this


def fake_vector(text: str, dimensions: int) -> np.ndarray:
    """A unit vector that depends only on the text, so results can be checked per request."""
    seed = sum(ord(c) * (i + 1) for i, c in enumerate(text)) + len(text)
    vector = np.random.default_rng(seed).standard_normal(dimensions).astype(np.float32)
    return vector / np.linalg.norm(vector)


class GatedEmbedder(EmbeddingEngine):
    """embed_blocking (run on a model thread by the batcher) waits for `gate` once it is cleared."""

    def __init__(self, dimensions: int = 4) -> None:
        self.dimensions = 0  # known after load(), as with the real engines
        self._dimensions = dimensions
        self.load_gate = threading.Event()
        self.load_gate.set()
        self.gate = threading.Event()
        self.gate.set()
        self.calls: list[list[str]] = []  # texts of each embed_blocking call
        self.closed = False

    def load(self) -> None:
        self.load_gate.wait(HOLD_LIMIT_S)
        self.dimensions = self._dimensions

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        return await asyncio.to_thread(self.embed_blocking, texts)

    def embed_blocking(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(list(texts))
        self.gate.wait(HOLD_LIMIT_S)
        return np.stack([fake_vector(t, self.dimensions) for t in texts]) if texts else np.zeros((0, self.dimensions))

    async def close(self) -> None:
        self.closed = True


class GatedASR(ASREngine):
    """transcribe() on the test's loop: says it entered, then waits for `gate` (set by default)."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.gate.set()
        self.entered = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.prompts: list[str | None] = []
        self.fail_on = b"\x00\x00" * 3  # this exact audio raises, as a broken model would

    def load(self) -> None:
        pass

    async def transcribe(self, pcm16: bytes, *, prompt: str | None = None) -> Transcript:
        self.prompts.append(prompt)
        self.entered.set()
        if pcm16 == self.fail_on:
            raise RuntimeError("the model broke")
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return Transcript(text=f"{len(pcm16) // 2} samples", audio_seconds=len(pcm16) / 32_000,
                          compute_seconds=0.0, language="en", no_speech_probability=0.1)


class ScriptedTTS(TTSEngine):
    """Streams `chunks`; after them, waits on `hold` when it is cleared, or fails if `fail_after`."""

    sample_rate = 8_000

    def __init__(self, chunks: Sequence[bytes] = (b"\x01\x02\x03", b"\x04", b"\x05\x06")) -> None:
        self.chunks = list(chunks)
        self.hold = asyncio.Event()
        self.hold.set()
        self.fail_after = False
        self.started = asyncio.Event()
        self.closed = asyncio.Event()  # set when the stream's iterator is closed, however it ends

    def load(self) -> None:
        pass

    async def synthesize(self, text: str) -> AsyncIterator[bytes]:
        self.started.set()
        try:
            for chunk in self.chunks:
                yield chunk
            await self.hold.wait()
            if self.fail_after:
                raise RuntimeError("the vocoder broke")
        finally:
            self.closed.set()


def serve_stalling_tts(listen_fd: int) -> None:
    """Child process: a tts worker on an inherited listening socket; its stream stalls after one chunk."""
    import uvicorn

    from workers.server import build_worker_app

    engine = ScriptedTTS([b"\x01\x02"])
    engine.hold.clear()
    app = build_worker_app(engine, role="tts", name="doomed-tts", max_in_flight=4, loaded=True)
    sock = socket.socket(fileno=listen_fd)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on")).run(sockets=[sock])
