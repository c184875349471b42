"""One utterance's codes in as they are generated, its audio out as soon as it is final.

`stream_audio` is the I/O around `start_plan.StartPlanner`, which decides when the audio
starts (a head start, or the exact stream held until playback will not stall) and what
each decode step takes: the frames from the token stream go in, the codec's audio comes out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import numpy as np

from models.orpheus.codec import CodecStream, SnacCodec
from models.orpheus.start_plan import (
    FRAME_SECONDS, StartPlanner, Step, StreamPlan, StreamStats, head_start_is_seamless)
from models.orpheus.tokens import FrameAssembler

__all__ = ["FRAME_SECONDS", "StreamPlan", "StreamStats", "head_start_is_seamless", "stream_audio"]


async def stream_audio(tokens: AsyncIterator[list[int]], service: SnacCodec, plan: StreamPlan = StreamPlan(),
                       *, clock: Callable[[], float] = time.monotonic,
                       stats: StreamStats | None = None) -> AsyncIterator[np.ndarray]:
    """Token chunks in, float audio chunks out: every frame exactly once, in order.
    Closing the generator (barge-in) stops the token source too."""
    planner = StartPlanner(plan, service.delay_samples, service.flush_frames, stats)
    arrivals: asyncio.Queue = asyncio.Queue()  # unbounded: one utterance's frames at most
    reader = asyncio.create_task(_read_frames(tokens, arrivals, clock), name="orpheus-frames")
    state = service.open_stream()
    frames: list[np.ndarray] = []  # every frame so far (the head start decodes the first ones)
    held: list[np.ndarray] = []  # exact audio kept back until playback can start without a stall
    try:
        while not planner.done:
            await _take_arrivals(arrivals, frames, planner)
            if (head := planner.head_start()) is not None:
                audio = await service.decode(np.stack(frames[: head.window_frames]), 0, stream=state)
                state.next_sample = head.samples
                planner.head_start_decoded(head)
                yield audio[: head.samples]
            if (step := planner.next_step()) is not None:
                began = clock()
                held.append(await _decode(service, state, frames, step))
                if planner.decoded(step, began, clock(), len(held[-1])):
                    audio = np.concatenate(held)
                    held.clear()
                    if len(audio):
                        yield audio
    finally:
        service.release(state)
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        if hasattr(tokens, "aclose"):
            await tokens.aclose()  # barge-in: stop the generation too, not just the decoding


async def _take_arrivals(arrivals: asyncio.Queue, frames: list[np.ndarray], planner: StartPlanner) -> None:
    """Every arrival queued so far; first waits for one if the planner has no frame to step."""
    if planner.needs_frames:
        _take(await arrivals.get(), frames, planner)
    while not arrivals.empty() and not planner.ended:
        _take(arrivals.get_nowait(), frames, planner)


async def _decode(service: SnacCodec, state: CodecStream, frames: list[np.ndarray], step: Step) -> np.ndarray:
    if step.count:
        return await service.step(state, np.stack(frames[step.first : step.end]), final=step.final)
    if step.first:
        return await service.step(state, None)  # the flush alone: the frames ran out before the end was seen
    return np.zeros(0, np.float32)  # an empty utterance: nothing was fed


async def _read_frames(tokens: AsyncIterator[list[int]], arrivals: asyncio.Queue, clock: Callable[[], float]) -> None:
    """Whole frames onto the queue as tokens complete them; then None, or the error."""
    assembler = FrameAssembler()
    try:
        async for chunk in tokens:
            done = assembler.push(chunk)
            if len(done):
                arrivals.put_nowait((done, clock()))
            if assembler.ended:
                break
        arrivals.put_nowait(None)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a broken source or a misaligned token: raised in the consumer
        arrivals.put_nowait(exc)


def _take(item, frames: list[np.ndarray], planner: StartPlanner) -> None:
    """Adds an arrival, or the end of the stream; raises the reader's error."""
    if item is None:
        planner.end_of_stream()
        return
    if isinstance(item, Exception):
        raise item
    done, at = item
    frames.extend(done)
    planner.frames_arrived(len(done), at)
