"""An embedder shared by every call: requests from different calls merged into one forward pass.

Retrieval embeds one short query per turn; a dozen calls asking at once would otherwise
queue a dozen tiny passes. Through the DynamicBatcher they become one `embed_blocking`
over all their texts, split back per request. The wrapped engine keeps its own options
(runtime, threads, its per-pass batch size, which chunks a very large merged request).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from models.base import EmbeddingEngine
from workers.batcher import BatchedEngineLoad, BatchPolicy, DynamicBatcher

# Retrieval waits on this: a few ms to gather other calls' queries costs less than a queue.
DEFAULT_POLICY = BatchPolicy(max_batch=8, timeout_s=0.005, max_pending=64)


class BatchedEmbedder(BatchedEngineLoad, EmbeddingEngine):
    def __init__(self, inner: EmbeddingEngine, policy: BatchPolicy = DEFAULT_POLICY, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> None:
        self._inner = inner
        self.dimensions = getattr(inner, "dimensions", 0)  # refreshed in load(): read from the model
        self._batcher: DynamicBatcher[list[str], np.ndarray] = DynamicBatcher(
            self._run_batch, **asdict(policy), name="embedder", clock=clock, sleep=sleep)

    def load(self) -> None:
        self._inner.load()
        self.dimensions = self._inner.dimensions

    def warm_up(self) -> None:
        self._inner.warm_up()

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        return await self._batcher.submit(texts)

    def embed_blocking(self, texts: Sequence[str]) -> np.ndarray:
        return self._inner.embed_blocking(texts)

    def _run_batch(self, requests: list[list[str]]) -> list[np.ndarray]:
        """On the batcher's thread: one pass over every request's texts, split back."""
        vectors = self._inner.embed_blocking([text for texts in requests for text in texts])
        ends = np.cumsum([len(texts) for texts in requests])[:-1]
        return np.split(vectors, ends)

    async def close(self) -> None:
        await self._batcher.close()
        await self._inner.close()
