"""One SNAC decoder shared by every call: dynamic batching off the event loop.

Requests queue up; the batcher takes the first, waits at most `batch_timeout_ms` for
others (or until `max_batch`), and runs them together on the decoder's own thread. No
in-flight batching: a batch, once started, runs to the end, and requests arriving
meanwhile form the next one. Two kinds of request:
- a stream step: a stream's new frames (or its flush at the end) through the exact
  streaming decoder (`snac_stream`), whose cached state moves on by those frames. Steps
  with the same number of new frames share one forward pass;
- a window: frames decoded on their own, as offline (the head start of a stream, tools).
  Windows of equal length share a pass; SNAC is non-causal, so padding a short window
  to a long one would change its audio.

The batcher stops waiting early once every open stream has a request in the batch:
no other stream could add one, so the timeout would only add latency.

Policy when full: at most `max_pending` requests wait; beyond that `decode` and `step`
raise CapacityError at once instead of queueing audio that would arrive too late anyway.
A caller that cancels (barge-in) before its request is batched frees its slot.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from models.errors import CapacityError
from models.orpheus.snac_decoder import LATENT_STEPS_PER_FRAME, SnacDecoder
from models.orpheus.snac_stream import SnacStreamer, StreamState


@dataclass(frozen=True)
class DecodeServiceConfig:
    max_batch: int = 16
    batch_timeout_ms: float = 15.0
    max_pending: int = 256
    compile: bool = False  # torch.compile: windows once per length, stream steps' elementwise work once
    threads: int = 0  # torch intra-op threads on CPU; 0 leaves torch's default


@dataclass
class _Request:
    key: tuple  # requests with equal keys share a forward pass
    frames: np.ndarray | None  # (n, 7); None: flush a stream
    first_frame: int  # windows: the stream frame the window starts at (positions the noise)
    state: StreamState | None  # stream steps: the state they move on; windows: the stream asking, if any
    future: asyncio.Future


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
                 *, clock: Callable[[], float] = time.monotonic,
                 on_batch: Callable[[int], None] | None = None) -> None:
        """`on_batch`: told each forward pass's size (a worker's batch-size histogram)."""
        self._decoder = decoder
        self._on_batch = on_batch
        self._config = config
        self._clock = clock
        self._queue: asyncio.Queue[_Request] | None = None
        self._worker: asyncio.Task | None = None
        self._starting: asyncio.Future | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="snac-decode")
        self._decode = decoder.decode
        self._open_streams: set[int] = set()  # id() of each stream's state between open and release
        self.stats = DecodeStats()

    @functools.cached_property
    def _streamer(self) -> SnacStreamer:
        return SnacStreamer(self._decoder, compile=self._config.compile)

    @property
    def delay_samples(self) -> int:
        """How far the exact stream's audio trails the codes that have arrived."""
        return self._streamer.delay_samples

    @property
    def flush_frames(self) -> float:
        """Frames' worth of zeros a stream's flush runs through the decoder."""
        return self._streamer.flush_latent_steps / LATENT_STEPS_PER_FRAME

    @property
    def queue_depth(self) -> int:
        return self._queue.qsize() if self._queue else 0

    @property
    def batch_size(self) -> int | None:
        return self.stats.batch_sizes[-1] if self.stats.batch_sizes else None

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
        if not getattr(model, "cadence_compiled", False):  # a decoder shared by services compiles once
            model.decode = torch.compile(model.decode, dynamic=False)
            model.cadence_compiled = True
        return self._decoder.decode

    def warm_up(self) -> None:
        """Blocking: a head-start window and a few stream steps, so the first caller pays no lazy init."""
        def run() -> None:
            self._decoder.decode(torch.zeros(1, 2, 7, dtype=torch.long), torch.zeros(1, dtype=torch.long))
            state = self._streamer.new_state()
            for _ in range(3):
                self._streamer.step([state], torch.zeros(1, 1, 7, dtype=torch.long))
            self._streamer.step([state], torch.zeros(1, 1, 7, dtype=torch.long), final=True)
        self._executor.submit(run).result()

    def open_stream(self) -> StreamState:
        """A new stream's state; `release` it when the stream ends or is abandoned."""
        state = self._streamer.new_state()
        self._open_streams.add(id(state))
        return state

    @property
    def open_streams(self) -> int:
        return len(self._open_streams)

    def release(self, state: StreamState) -> None:
        self._open_streams.discard(id(state))

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

    async def decode(self, frames: np.ndarray, first_frame: int, *, stream: StreamState | None = None) -> np.ndarray:
        """Audio (float32, 24 kHz) for a window of frames decoded on their own, as offline;
        `first_frame` is the stream frame the window starts at. `stream`: the open stream
        asking (its state is not touched), so the batcher knows not to wait for it."""
        frames = np.asarray(frames, dtype=np.int64)
        return await self._submit(("window", len(frames)), frames, first_frame, stream)

    async def step(self, state: StreamState, frames: np.ndarray | None, *, final: bool = False) -> np.ndarray:
        """A stream's newly final audio after feeding it (n, 7) more frames. `final`: they
        are its last, and the rest of its audio comes too; `frames=None` ends a stream
        whose last frames were already fed. One step per stream at a time: each moves the
        stream's state on."""
        if frames is None:
            return await self._submit(("flush",), None, 0, state)
        frames = np.asarray(frames, dtype=np.int64)
        return await self._submit(("final" if final else "step", len(frames)), frames, 0, state)

    async def _submit(self, key: tuple, frames: np.ndarray | None, first_frame: int,
                      state: StreamState | None) -> np.ndarray:
        if self._queue is None:
            raise RuntimeError("SnacDecodeService.start() was not awaited")
        if self._queue.qsize() >= self._config.max_pending:
            raise CapacityError(f"SNAC decoder has {self._config.max_pending} requests waiting; refusing more")
        future = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Request(key, frames, first_frame, state, future))
        return await future

    async def _run(self) -> None:
        assert self._queue is not None
        while True:
            batch = [await self._next_live(None)]
            deadline = self._clock() + self._config.batch_timeout_ms / 1000
            while len(batch) < self._config.max_batch and not self._everyone_is_in(batch):
                remaining = deadline - self._clock()
                if remaining <= 0:
                    break
                try:
                    batch.append(await self._next_live(remaining))
                except asyncio.TimeoutError:
                    break
            await self._decode_batch(batch)

    def _everyone_is_in(self, batch: list[_Request]) -> bool:
        streams = {id(r.state) for r in batch if r.state is not None}
        return bool(self._open_streams) and self._open_streams <= streams

    async def _next_live(self, timeout: float | None) -> _Request:
        """The next request whose caller still waits: a cancelled one (barge-in) takes no batch slot."""
        assert self._queue is not None
        while True:
            request = await asyncio.wait_for(self._queue.get(), timeout) if timeout is not None \
                else await self._queue.get()
            if not request.future.done():
                return request

    async def _decode_batch(self, batch: list[_Request]) -> None:
        groups: dict[tuple, list[_Request]] = {}
        for request in batch:
            groups.setdefault(request.key, []).append(request)
        loop = asyncio.get_running_loop()
        for key, group in groups.items():
            started = self._clock()
            try:
                audio = await loop.run_in_executor(self._executor, self._run_group, key[0], group)
            except Exception as exc:  # a bad request fails its own group, not the service
                for request in group:
                    if not request.future.done():
                        request.future.set_exception(exc)
                continue
            self.stats.record(len(group), self._clock() - started)
            if self._on_batch is not None:
                self._on_batch(len(group))
            for request, samples in zip(group, audio):
                if not request.future.done():
                    request.future.set_result(samples)

    def _run_group(self, kind: str, group: list[_Request]) -> list[np.ndarray]:
        """On the decoder's thread: one forward pass for requests of one key."""
        if kind == "window":
            frames = torch.as_tensor(np.stack([r.frames for r in group]))
            starts = torch.as_tensor([r.first_frame for r in group], dtype=torch.long)
            return list(self._decode(frames, starts).float().cpu().numpy())
        frames = None if kind == "flush" else torch.as_tensor(np.stack([r.frames for r in group]))
        audio = self._streamer.step([r.state for r in group], frames, final=kind != "step")
        return [a.float().cpu().numpy() for a in audio]
