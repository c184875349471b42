"""Orpheus as a `TTSEngine`: text -> prompt ids -> audio tokens (a token source) -> SNAC
stream steps (the shared codec: a decode service here, or a codec worker) -> 24 kHz PCM,
streamed while generation runs.

One stream's steps run in order (each moves its decoder state on); steps of different
streams meet in the decode service's batches.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Protocol

import numpy as np

from models.base import TTSEngine
from models.long_text import split_long_text
from models.orpheus.codec import SnacCodec
from models.orpheus.prompt import prompt_ids
from models.orpheus.streaming import StreamPlan, stream_audio
from models.orpheus.token_source import OrpheusSampling
from models.orpheus.tokens import SAMPLE_RATE


MAX_REQUEST_CHARS = 300  # ~20 s of speech at ~14 characters a second


class TokenSource(Protocol):
    def stream(self, prompt_ids: list[int], sampling: OrpheusSampling) -> AsyncIterator[list[int]]:
        """Generated token ids, a few at a time, until end of speech."""


def to_pcm16(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1.0, 1.0) * 32767.0).astype(np.int16).tobytes()


class OrpheusTTSEngine(TTSEngine):
    sample_rate = SAMPLE_RATE

    def __init__(self, *, voice: str, tokenize: Callable[[str], list[int]], token_source: TokenSource,
                 codec: Callable[[], SnacCodec], sampling: OrpheusSampling = OrpheusSampling(),
                 plan: StreamPlan = StreamPlan()) -> None:
        """`codec`: builds the codec at load() (blocking: weights, or a worker's readiness)."""
        self._voice = voice
        self._tokenize = tokenize
        self._source = token_source
        self._make_codec = codec
        self._service: SnacCodec | None = None
        self._sampling = sampling
        self._plan = plan

    def load(self) -> None:
        """Blocking: builds the SNAC decoder (hub weights, or random ones for tests), or
        checks the codec worker is ready."""
        self._service = self._make_codec()

    def warm_up(self) -> None:
        assert self._service is not None, "load() first"
        self._service.warm_up()

    @property
    def queue_depth(self) -> int:
        return self._service.queue_depth if self._service else 0

    @property
    def batch_size(self) -> int | None:
        return self._service.batch_size if self._service else None

    async def synthesize(self, text: str) -> AsyncIterator[bytes]:
        if self._service is None:
            raise RuntimeError("OrpheusTTSEngine.load() was not called")
        await self._service.start()  # idempotent; needs the running loop
        for request in split_long_text(text, MAX_REQUEST_CHARS):
            ids = prompt_ids(self._tokenize, self._voice, request)
            async for audio in stream_audio(self._source.stream(ids, self._sampling), self._service, self._plan):
                yield to_pcm16(audio)

    async def close(self) -> None:
        if self._service is not None:
            await self._service.close()
        if hasattr(self._source, "close"):
            await self._source.close()
