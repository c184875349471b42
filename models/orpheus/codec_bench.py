"""`cadence bench tts-codec`: our streaming SNAC decode against the public sliding-window one.

Both decode the same random code stream with the same decoder (random weights of the
real SNAC 24 kHz architecture: compute and exactness do not depend on the weights).
The reference ("baseline") decoder, as published with Orpheus and copied widely,
waits for 28 tokens, then on every 7th token decodes the last 4 frames and emits the
second of them: frame 0 and the last two frames are never emitted, and every emitted
frame costs a 4-frame decode at batch 1.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import numpy as np
import torch

from models.orpheus.decode_service import DecodeServiceConfig, SnacDecodeService
from models.orpheus.snac_decoder import SnacDecoder, frames_tensor, load_snac, snr_db
from models.orpheus.streaming import StreamPlan, WindowPlanner, stream_decode
from models.orpheus.tokens import FRAME_TOKENS, SAMPLE_RATE, SAMPLES_PER_FRAME

FRAME_SECONDS = SAMPLES_PER_FRAME / SAMPLE_RATE
BASELINE_WINDOW_FRAMES = 4


def baseline_stream_decode(frames: np.ndarray, decode: Callable[[np.ndarray, int], np.ndarray]
                           ) -> tuple[np.ndarray, list[int], int]:
    """The public sliding-window decoder's behaviour: (audio, frames it emitted, frames decoded)."""
    pieces, emitted, decoded = [], [], 0
    for count in range(1, len(frames) + 1):  # one more whole frame (7 tokens) has arrived
        if count < BASELINE_WINDOW_FRAMES:
            continue
        window = frames[count - BASELINE_WINDOW_FRAMES : count]
        audio = decode(window, count - BASELINE_WINDOW_FRAMES)
        decoded += BASELINE_WINDOW_FRAMES
        pieces.append(audio[SAMPLES_PER_FRAME : 2 * SAMPLES_PER_FRAME])
        emitted.append(count - BASELINE_WINDOW_FRAMES + 1)
    return np.concatenate(pieces), emitted, decoded


def tokens_before_first_audio(plan: StreamPlan) -> int:
    """Feeds a stream one token at a time and counts tokens until the first window is ready."""
    planner = WindowPlanner(plan)
    for token in range(1, 10_000):
        if token % FRAME_TOKENS == 0 and planner.add(1):
            return token
    raise AssertionError("no audio")


def _sync_decoder(decoder: SnacDecoder) -> Callable[[np.ndarray, int], np.ndarray]:
    return lambda window, first: decoder.decode(frames_tensor(window), torch.tensor([first]))[0].float().cpu().numpy()


def _time(fn: Callable[[], object], repeats: int) -> float:
    def timed() -> float:
        started = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # CUDA calls return before the work is done
        return time.perf_counter() - started

    timed()  # warm-up: allocator, kernels, compile
    return min(timed() for _ in range(repeats))


def batch_throughput(decoder: SnacDecoder, batch: int, window_frames: int, emit_frames: int,
                     repeats: int = 3) -> float:
    """Seconds of emitted audio per second of decode for `batch` windows decoded together."""
    frames = torch.randint(0, 4096, (batch, window_frames, FRAME_TOKENS))
    starts = torch.arange(batch) * 17
    seconds = _time(lambda: decoder.decode(frames, starts), repeats)
    return batch * emit_frames * FRAME_SECONDS / seconds


async def _service_realtime_check(decoder: SnacDecoder, streams: int, frames_per_stream: int,
                                  plan: StreamPlan) -> float:
    """Runs `streams` concurrent real-time streams through the batching service; returns the
    worst lag (s) of any emitted chunk behind its playback deadline."""
    service = SnacDecodeService(decoder, DecodeServiceConfig(max_batch=64))
    await service.start()
    rng = np.random.default_rng(3)

    async def one_stream() -> float:
        frames = rng.integers(0, 4096, (frames_per_stream, FRAME_TOKENS))
        planner = WindowPlanner(plan)
        started = time.perf_counter()
        worst, played_until = 0.0, None
        for arrived in range(frames_per_stream):
            # Frames arrive exactly at real time (82 tokens/s): the slowest a token source may be.
            await asyncio.sleep(max(0.0, started + (arrived + 1) * FRAME_SECONDS - time.perf_counter()))
            windows = planner.add(1) if arrived + 1 < frames_per_stream else planner.add(1) + planner.finish()
            for w in windows:
                await service.decode(frames[w.start : w.stop], w.start)
                now = time.perf_counter()
                if played_until is None:
                    played_until = now  # playback starts with the first chunk
                worst = max(worst, now - played_until)  # > 0: the caller heard a gap
                played_until = max(played_until, now) + (w.emit_stop - w.emit_start) * FRAME_SECONDS
        return worst

    try:
        return max(await asyncio.gather(*(one_stream() for _ in range(streams))))
    finally:
        await service.close()


def run(*, frames: int = 48, seed: int = 0, max_streams: int = 32, quick: bool = False, device: str = "cpu",
        batches: tuple[int, ...] = (1, 2, 4, 8, 16), compile: bool = False) -> dict:
    torch.manual_seed(seed)
    decoder = load_snac(None, seed=seed, device=device)
    if compile:
        # Each (batch, window length) shape compiles once (~35 s on 2 cores), then runs ~2x faster here.
        decoder.model.decode = torch.compile(decoder.model.decode, dynamic=False)
    plan = StreamPlan()
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 4096, (frames, FRAME_TOKENS))
    codes[0, 0], codes[-1, -1] = 0, 4095  # the edge codes public decoders mishandle
    decode = _sync_decoder(decoder)
    offline = decode(codes, 0)

    ours, planner = stream_decode(codes, plan, decode)
    base_audio, base_emitted, base_decoded = baseline_stream_decode(codes, decode)
    base_reference = np.concatenate([offline[f * SAMPLES_PER_FRAME : (f + 1) * SAMPLES_PER_FRAME]
                                     for f in base_emitted])

    # Decode cost at batch 1 for our steady-state window, and for the baseline's window.
    steady = plan.left_context + plan.chunk(10) + plan.lookahead
    ours_rtf = 1 / batch_throughput(decoder, 1, steady, plan.chunk(10))
    base_rtf = 1 / batch_throughput(decoder, 1, BASELINE_WINDOW_FRAMES, 1)
    throughput = {b: batch_throughput(decoder, b, steady, plan.chunk(10)) for b in batches if not (quick and b > 4)}
    best_batch = max(throughput, key=throughput.get)

    # Real-time streams: the most concurrent streams whose audio never falls behind playback
    # (a lag under one frame is absorbed by any jitter buffer).
    sustained, lags = 0, {}
    streams = 1
    while streams <= max_streams:
        lag = asyncio.run(_service_realtime_check(decoder, streams, 24 if quick else 40, plan))
        lags[streams] = round(lag, 3)
        if lag > FRAME_SECONDS:
            break
        sustained = streams
        streams = streams + 1 if streams < 4 else streams * 2 if quick else streams + 2
    return {
        "tokens_to_first_audio": tokens_before_first_audio(plan),
        "baseline_tokens_to_first_audio": BASELINE_WINDOW_FRAMES * FRAME_TOKENS,
        "decode_frames_per_emitted_frame": round(planner.decoded_frames / frames, 3),
        "baseline_decode_frames_per_emitted_frame": round(base_decoded / len(base_emitted), 3),
        "fidelity_snr_db": round(snr_db(offline, ours), 1),
        "fidelity_snr_db_after_first_frame": round(snr_db(offline[SAMPLES_PER_FRAME:], ours[SAMPLES_PER_FRAME:]), 1),
        "baseline_fidelity_snr_db": round(snr_db(base_reference, base_audio), 1),
        "frames_emitted": len(ours) // SAMPLES_PER_FRAME,
        "baseline_frames_emitted": len(base_emitted),
        "frames_in_stream": frames,
        "streamed_length_exact": len(ours) == len(offline),
        "decode_rtf_per_stream": round(ours_rtf, 4),
        "baseline_decode_rtf_per_stream": round(base_rtf, 4),
        "baseline_realtime_streams_cpu": int(1 / base_rtf),
        "realtime_streams_cpu": sustained,
        "realtime_lag_s_by_streams": lags,
        "batched_speedup": round(throughput[best_batch] / throughput[1], 2),
        "best_batch": best_batch,
        "throughput_audio_s_per_s_by_batch": {b: round(v, 2) for b, v in throughput.items()},
        "plan": {"left_context": plan.left_context, "lookahead": plan.lookahead,
                 "first_lookahead": plan.first_lookahead, "chunk_schedule": list(plan.chunk_schedule)},
        "torch_threads": torch.get_num_threads(),
        "device": device,
        "compiled": compile,
    }
