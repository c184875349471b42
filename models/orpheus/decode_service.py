"""One SNAC decoder shared by every call: dynamic batching off the event loop.

Requests (a window of frames from one stream) queue up; the batcher takes the first,
waits at most `batch_timeout_ms` for others (or until `max_batch`), and decodes them
together on the decoder's own thread. No in-flight batching: a batch, once started,
runs to the end, and requests arriving meanwhile form the next one. Windows of equal
length share one forward pass; SNAC is non-causal, so padding a short window to a long
one would change its audio, and each distinct length is a separate pass (in steady
streaming nearly all windows have the same length).

Policy when full: at most `max_pending` windows wait; beyond that `decode` raises
CapacityError at once instead of queueing audio that would arrive too late anyway.
A caller that cancels (barge-in) before its window is batched frees its slot.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from agent.errors import CapacityError
from models.orpheus.snac_decoder import SnacDecoder


@dataclass(frozen=True)
class DecodeServiceConfig:
    max_batch: int = 16
    batch_timeout_ms: float = 15.0
    max_pending: int = 256
    compile: bool = False  # torch.compile the decoder (GPU hosts; each window length compiles once)
    threads: int = 0  # torch intra-op threads on CPU; 0 leaves torch's default


@dataclass
class _Request:
    frames: np.ndarray  # (n, 7)
    first_frame: int
    future: asyncio.Future
    queued_at: float


@dataclass
class DecodeStats:
    batches: int = 0
    windows: int = 0
    batch_sizes: list[int] = field(default_factory=list)  # the most recent ones, bounded
    decode_seconds: float = 0.0

    def record(self, size: int, seconds: float) -> None:
        self.batches += 1
        self.windows += size
        self.decode_seconds += seconds
        self.batch_sizes.append(size)
        del self.batch_sizes[:-256]


class SnacDecodeService:
    def __init__(self, decoder: SnacDecoder, config: DecodeServiceConfig = DecodeServiceConfig(),
                 *, clock: Callable[[], float] = time.monotonic) -> None:
        self._decoder = decoder
        self._config = config
        self._clock = clock
        self._queue: asyncio.Queue[_Request] | None = None
        self._worker: asyncio.Task | None = None
        self._starting: asyncio.Future | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="snac-decode")
        self._decode = decoder.decode
        self.stats = DecodeStats()

    @property
    def queue_depth(self) -> int:
        return self._queue.qsize() if self._queue else 0

    async def start(self) -> None:
        """Idempotent, and safe when many calls' first sentences arrive at once. The batcher
        lives on the loop that started it; a new loop (a restarted server) gets a new one."""
        loop = asyncio.get_running_loop()
        if self._starting is None or self._starting.get_loop() is not loop:
            self._starting = asyncio.ensure_future(self._start())
        await asyncio.shield(self._starting)

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._config.threads:
            await loop.run_in_executor(self._executor, torch.set_num_threads, self._config.threads)
        if self._config.compile:
            self._decode = await loop.run_in_executor(self._executor, self._compiled_decode)
        self._queue = asyncio.Queue()
        self._worker = asyncio.create_task(self._run(), name="snac-batcher")

    def _compiled_decode(self):
        model = self._decoder.model
        model.decode = torch.compile(model.decode, dynamic=False)
        return self._decoder.decode

    def warm_up(self) -> None:
        """Blocking: one decode of a steady-state window, so the first caller pays no lazy init."""
        frames = torch.zeros(1, 8, 7, dtype=torch.long)
        self._executor.submit(self._decoder.decode, frames, torch.zeros(1, dtype=torch.long)).result()

    async def close(self) -> None:
        worker, self._worker, self._starting = self._worker, None, None
        if worker is not None:
            if worker.get_loop() is asyncio.get_running_loop():
                worker.cancel()
                await asyncio.gather(worker, return_exceptions=True)
            elif not worker.get_loop().is_closed():
                worker.get_loop().call_soon_threadsafe(worker.cancel)
        while self._queue is not None and not self._queue.empty():
            request = self._queue.get_nowait()
            if not request.future.done():
                request.future.set_exception(CapacityError("SNAC decode service closed"))
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def decode(self, frames: np.ndarray, first_frame: int) -> np.ndarray:
        """Audio (float32, 24 kHz) for a window of frames whose first is stream frame `first_frame`."""
        if self._queue is None:
            raise RuntimeError("SnacDecodeService.start() was not awaited")
        if self._queue.qsize() >= self._config.max_pending:
            raise CapacityError(f"SNAC decoder has {self._config.max_pending} windows waiting; refusing more")
        future = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Request(np.asarray(frames, dtype=np.int64), first_frame, future, self._clock()))
        return await future

    async def _run(self) -> None:
        assert self._queue is not None
        while True:
            batch = [await self._next_live(None)]
            deadline = self._clock() + self._config.batch_timeout_ms / 1000
            while len(batch) < self._config.max_batch:
                remaining = deadline - self._clock()
                if remaining <= 0:
                    break
                try:
                    batch.append(await self._next_live(remaining))
                except asyncio.TimeoutError:
                    break
            await self._decode_batch(batch)

    async def _next_live(self, timeout: float | None) -> _Request:
        """The next request whose caller still waits: a cancelled one (barge-in) takes no batch slot."""
        assert self._queue is not None
        while True:
            request = await asyncio.wait_for(self._queue.get(), timeout) if timeout is not None \
                else await self._queue.get()
            if not request.future.done():
                return request

    async def _decode_batch(self, batch: list[_Request]) -> None:
        by_length: dict[int, list[_Request]] = {}
        for request in batch:
            by_length.setdefault(len(request.frames), []).append(request)
        loop = asyncio.get_running_loop()
        for group in by_length.values():
            frames = torch.as_tensor(np.stack([r.frames for r in group]))
            starts = torch.as_tensor([r.first_frame for r in group], dtype=torch.long)
            started = self._clock()
            try:
                audio = await loop.run_in_executor(self._executor, self._decode, frames, starts)
            except Exception as exc:  # a bad window fails its own requests, not the service
                for request in group:
                    if not request.future.done():
                        request.future.set_exception(exc)
                continue
            self.stats.record(len(group), self._clock() - started)
            audio = audio.float().cpu().numpy()
            for request, samples in zip(group, audio):
                if not request.future.done():
                    request.future.set_result(samples)
