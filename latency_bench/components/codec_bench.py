"""`python -m latency_bench tts-codec` (or `cadence bench tts-codec`): our streaming SNAC decode
against the public sliding-window one.

Both decode the same random code stream with the same decoder (random weights of the
real SNAC 24 kHz architecture: compute and exactness do not depend on the weights).
The reference ("baseline") decoder, as published with Orpheus and copied widely,
waits for 28 tokens, then on every 7th token decodes the last 4 frames and emits the
second of them: frame 0 and the last two frames are never emitted, and every emitted
frame costs a 4-frame decode at batch 1. Ours streams every frame once through cached
convolution state (`snac_stream`), with a one-frame head start when tokens come fast.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable

import numpy as np
import torch

from models.orpheus.decode_service import DecodeServiceConfig, SnacDecodeService
from models.orpheus.snac_decoder import LATENT_STEPS_PER_FRAME, SnacDecoder, frames_tensor, load_snac, snr_db
from models.orpheus.snac_stream import SnacStreamer
from models.orpheus.start_plan import frames_for_exact_audio_past
from models.orpheus.streaming import FRAME_SECONDS, StreamPlan, StreamStats, stream_audio
from models.orpheus.tokens import (CODEBOOK_SIZE, END_OF_SPEECH, FRAME_TOKENS, SAMPLES_PER_FRAME, frames_to_levels,
                                   snac_codes_to_tokens)

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


def exact_stream_decode(frames: np.ndarray, streamer: SnacStreamer, decoder: SnacDecoder, *,
                        head_start: bool = True, arrival: int = 1) -> tuple[np.ndarray, int]:
    """Our streamed decode, synchronously (tests and the bench): frames arrive `arrival` at a
    time. Returns (audio, frames run through the decoder)."""
    state, pieces, decoded = streamer.new_state(), [], 0
    plan = StreamPlan()
    for start in range(0, len(frames), arrival):
        chunk = frames[start : start + arrival]
        if head_start and start <= plan.head_start_lookahead < start + len(chunk):
            window = frames[: 1 + plan.head_start_lookahead]
            pieces.append(decoder.decode(frames_tensor(window))[0, :SAMPLES_PER_FRAME].numpy())
            state.next_sample = SAMPLES_PER_FRAME
            decoded += len(window)
        pieces += [a.numpy() for a in streamer.step([state], torch.as_tensor(chunk[None]))]
        decoded += len(chunk)
    pieces += [a.numpy() for a in streamer.step([state], None)]
    return np.concatenate(pieces), decoded + streamer.flush_latent_steps / LATENT_STEPS_PER_FRAME


def exact_tokens_to_first_audio(streamer: SnacStreamer) -> int:
    """Without a head start: frames until the exact stream's first sample is final."""
    return frames_for_exact_audio_past(0, streamer.delay_samples) * FRAME_TOKENS


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


def step_throughput(streamer: SnacStreamer, batch: int, frames_per_step: int, repeats: int = 3) -> float:
    """Seconds of audio per second of decode for `batch` streams stepped together."""
    states = [streamer.new_state() for _ in range(batch)]
    frames = torch.randint(0, CODEBOOK_SIZE, (batch, frames_per_step, FRAME_TOKENS))
    for _ in range(3):  # past the stream's start, into steady state
        streamer.step(states, frames)
    seconds = _time(lambda: streamer.step(states, frames), repeats)
    return batch * frames_per_step * FRAME_SECONDS / seconds


def window_throughput(decoder: SnacDecoder, window_frames: int, emit_frames: int, repeats: int = 3) -> float:
    """Seconds of emitted audio per second of decode for one window at a time (the baseline)."""
    frames = torch.randint(0, CODEBOOK_SIZE, (1, window_frames, FRAME_TOKENS))
    seconds = _time(lambda: decoder.decode(frames, torch.zeros(1, dtype=torch.long)), repeats)
    return emit_frames * FRAME_SECONDS / seconds


async def realtime_tokens(token_ids: list[int], speed: float = 1.0):
    """A token source at `speed` x real time (1.0: ~82 tokens/s, the slowest it may be)."""
    started = time.perf_counter()
    for frame in range(len(token_ids) // FRAME_TOKENS):
        await asyncio.sleep(max(0.0, started + (frame + 1) * FRAME_SECONDS / speed - time.perf_counter()))
        yield token_ids[frame * FRAME_TOKENS : (frame + 1) * FRAME_TOKENS]
    yield [END_OF_SPEECH]


async def service_realtime_check(decoder: SnacDecoder, streams: int, frames_per_stream: int,
                                 config: DecodeServiceConfig = DecodeServiceConfig(max_batch=64),
                                 stats: list[StreamStats] | None = None, speed: float = 1.0) -> float:
    """`streams` concurrent utterances, tokens at real time, through the production path
    (`stream_audio` on the batching service). Returns the worst lag (s) of any audio chunk
    behind its playback deadline, playback starting with each stream's first chunk."""
    service = SnacDecodeService(decoder, config)
    await service.start()
    service.warm_up()
    rng = np.random.default_rng(3)

    async def one_stream() -> float:
        frames = rng.integers(0, CODEBOOK_SIZE, (frames_per_stream, FRAME_TOKENS))
        tokens = snac_codes_to_tokens(*frames_to_levels(frames))
        worst, played_until = 0.0, None
        stream_stats = StreamStats()
        if stats is not None:
            stats.append(stream_stats)
        async for chunk in stream_audio(realtime_tokens(tokens, speed), service, stats=stream_stats):
            now = time.perf_counter()
            if played_until is None:
                played_until = now
            worst = max(worst, now - played_until)  # > 0: the caller heard a gap
            played_until = max(played_until, now) + len(chunk) / SAMPLES_PER_FRAME * FRAME_SECONDS
        return worst

    try:
        return max(await asyncio.gather(*(one_stream() for _ in range(streams))))
    finally:
        await service.close()


def run(*, frames: int = 48, seed: int = 0, max_streams: int = 32, quick: bool = False, device: str = "cpu",
        batches: tuple[int, ...] = (1, 2, 4, 8, 16), compile: bool = False, trials: int = 3) -> dict:
    torch.manual_seed(seed)
    decoder = load_snac(None, seed=seed, device=device)
    streamer = SnacStreamer(decoder, compile=compile)
    plan = StreamPlan()
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, CODEBOOK_SIZE, (frames, FRAME_TOKENS))
    codes[0, 0], codes[-1, -1] = 0, 4095  # the edge codes public decoders mishandle
    decode = _sync_decoder(decoder)
    offline = decode(codes, 0)

    ours, decoded = exact_stream_decode(codes, streamer, decoder)
    exact, _ = exact_stream_decode(codes, streamer, decoder, head_start=False)
    base_audio, base_emitted, base_decoded = baseline_stream_decode(codes, decode)
    base_reference = np.concatenate([offline[f * SAMPLES_PER_FRAME : (f + 1) * SAMPLES_PER_FRAME]
                                     for f in base_emitted])

    # Decode cost at batch 1, a step per frame (the light-load case), against the baseline's window.
    ours_rtf = 1 / step_throughput(streamer, 1, 1)
    base_rtf = 1 / window_throughput(decoder, BASELINE_WINDOW_FRAMES, 1)
    throughput = {b: step_throughput(streamer, b, 1) for b in batches if not (quick and b > 4)}
    best_batch = max(throughput, key=throughput.get)

    # Real-time streams: the most concurrent streams whose audio does not fall behind playback
    # by more than a frame (what a client's jitter buffer absorbs), in the median of `trials`
    # runs (this machine's speed wanders); every run's worst lag is reported.
    alone: list[StreamStats] = []
    service_config = DecodeServiceConfig(max_batch=64, compile=compile)
    asyncio.run(service_realtime_check(decoder, 1, 12, service_config, stats=alone))
    # A GPU token server at full load runs a little faster than real time: the two-frame head start.
    loaded: list[StreamStats] = []
    asyncio.run(service_realtime_check(decoder, 1, 12, service_config, stats=loaded, speed=1.25))
    sustained, lags, first_audio = 0, {}, {}
    streams = 1
    while streams <= max_streams:
        stats: list[StreamStats] = []
        runs = [asyncio.run(service_realtime_check(decoder, streams, 24 if quick else 48, service_config, stats))
                for _ in range(trials)]
        lags[streams] = [round(lag, 3) for lag in runs]
        # The steady start holds more audio when the decoder is busier: first audio comes later.
        first_audio[streams] = int(np.median([s.frames_for_first_audio for s in stats])) * FRAME_TOKENS
        if float(np.median(runs)) > FRAME_SECONDS:
            break
        sustained = streams
        streams = streams + 1 if streams < 8 else streams * 2  # coarse past 8: GPU hosts reach hundreds
    return {
        "tokens_to_first_audio": plan.tokens_to_first_audio,
        "tokens_to_first_exact_audio": exact_tokens_to_first_audio(streamer),
        "tokens_to_first_audio_at_real_time": alone[0].frames_for_first_audio * FRAME_TOKENS,
        "tokens_to_first_audio_at_1_25x_real_time": loaded[0].frames_for_first_audio * FRAME_TOKENS,
        "baseline_tokens_to_first_audio": BASELINE_WINDOW_FRAMES * FRAME_TOKENS,
        "decode_frames_per_emitted_frame": round(decoded / frames, 3),
        "baseline_decode_frames_per_emitted_frame": round(base_decoded / len(base_emitted), 3),
        "fidelity_snr_db": round(snr_db(offline, ours), 1),
        "fidelity_snr_db_after_head_start": round(snr_db(offline[SAMPLES_PER_FRAME:], ours[SAMPLES_PER_FRAME:]), 1),
        "fidelity_snr_db_without_head_start": round(snr_db(offline, exact), 1),
        "baseline_fidelity_snr_db": round(snr_db(base_reference, base_audio), 1),
        "frames_emitted": len(ours) // SAMPLES_PER_FRAME,
        "baseline_frames_emitted": len(base_emitted),
        "frames_in_stream": frames,
        "streamed_length_exact": len(ours) == len(offline) == len(exact),
        "stream_delay_samples": streamer.delay_samples,
        "decode_rtf_per_stream": round(ours_rtf, 4),
        "baseline_decode_rtf_per_stream": round(base_rtf, 4),
        "baseline_realtime_streams_cpu": int(1 / base_rtf),
        "realtime_streams_cpu": sustained,
        "realtime_worst_lag_s_by_streams": lags,
        "realtime_tokens_to_first_audio_by_streams": first_audio,
        "batched_speedup": round(throughput[best_batch] / throughput[1], 2),
        "best_batch": best_batch,
        "throughput_audio_s_per_s_by_batch": {b: round(v, 2) for b, v in throughput.items()},
        "torch_threads": torch.get_num_threads(),
        "device": device,
        "compiled": compile,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m latency_bench tts-codec", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="fewer batch sizes and shorter streams")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda on GPU hosts")
    parser.add_argument("--max-streams", type=int, default=32, help="stop the real-time stream search here")
    parser.add_argument("--batches", default="1,2,4,8,16", help="batch sizes whose throughput is measured")
    parser.add_argument("--compile", action="store_true", help="torch.compile the decoder (each shape compiles once)")
    parser.add_argument("--trials", type=int, default=3, help="runs per stream count in the real-time search (median)")
    args = parser.parse_args(argv)
    batches = tuple(int(b) for b in args.batches.split(","))
    result = run(quick=args.quick, device=args.device, max_streams=args.max_streams, batches=batches,
                 compile=args.compile, trials=args.trials)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:45s} {value}")
    return 0
