"""Streaming SNAC decode: the window plan (pure), and the real SNAC 24 kHz architecture with
random weights: streamed audio matches an offline decode, every frame exactly once."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
import torch

from agent.errors import CapacityError
from models.orpheus.codec_bench import baseline_stream_decode, tokens_before_first_audio
from models.orpheus import snac_codes_to_tokens
from models.orpheus.decode_service import DecodeServiceConfig, SnacDecodeService
from models.orpheus.engine import stream_audio
from models.orpheus.snac_decoder import frames_tensor, load_snac, receptive_field_frames, snr_db
from models.orpheus.streaming import StreamPlan, WindowPlanner, stream_decode
from models.orpheus.tokens import END_OF_SPEECH, SAMPLES_PER_FRAME, frames_to_levels

STREAMED_SNR_FLOOR_DB = 45.0  # the whole stream, first frame (1 frame of look-ahead) included
STEADY_SNR_FLOOR_DB = 75.0  # every frame after the first (2 frames of context either side)


@pytest.mark.parametrize("arrivals", [[1] * 30, [3, 1, 7, 2, 9, 8], [30], [1, 1], [2]])
def test_every_frame_is_emitted_once_in_order_whatever_the_arrival_pattern(arrivals):
    planner = WindowPlanner(StreamPlan())
    windows = [w for n in arrivals for w in planner.add(n)] + planner.finish()
    emitted = [f for w in windows for f in range(w.emit_start, w.emit_stop)]
    assert emitted == list(range(sum(arrivals)))
    for w in windows:
        assert 0 <= w.start <= w.emit_start < w.emit_stop <= w.stop <= sum(arrivals)


def test_first_audio_needs_two_frames_and_later_chunks_wait_for_their_lookahead():
    planner = WindowPlanner(StreamPlan(left_context=2, lookahead=2, first_lookahead=1, chunk_schedule=(1, 1, 2, 4)))
    assert planner.add(1) == []
    first, = planner.add(1)
    assert (first.start, first.stop, first.emit_start, first.emit_stop) == (0, 2, 0, 1)
    assert planner.add(1) == []  # frame 1 needs frames 2 and 3 after it
    second, = planner.add(1)
    assert (second.start, second.stop, second.emit_start, second.emit_stop) == (0, 4, 1, 2)
    assert tokens_before_first_audio(StreamPlan()) == 14


def test_a_stream_shorter_than_the_first_chunk_is_emitted_at_its_end():
    planner = WindowPlanner(StreamPlan())
    assert planner.add(1) == []  # one frame is not enough for the first chunk's look-ahead
    rest = planner.finish()
    assert [(w.start, w.stop, w.emit_start, w.emit_stop) for w in rest] == [(0, 1, 0, 1)]


def test_bad_plans_are_refused():
    with pytest.raises(ValueError):
        StreamPlan(chunk_schedule=())
    with pytest.raises(ValueError):
        StreamPlan(lookahead=-1)


@pytest.fixture(scope="module")
def snac():
    torch.set_num_threads(2)
    return load_snac(None, seed=0)


def decode_fn(snac):
    return lambda window, first: snac.decode(frames_tensor(window), torch.tensor([first]))[0].numpy()


@pytest.mark.slow
def test_the_decoders_receptive_field_is_three_frames_each_side(snac):
    assert receptive_field_frames(snac) == (3, 3)


@pytest.mark.slow
def test_weight_norm_is_folded_and_noise_is_locked_to_position(snac):
    from torch.nn.utils import parametrize

    assert not any(parametrize.is_parametrized(m) for m in snac.model.modules())
    frames = np.random.default_rng(2).integers(0, 4096, (6, 7))
    a = snac.decode(frames_tensor(frames))
    b = snac.decode(frames_tensor(frames))
    torch.testing.assert_close(a, b, rtol=0, atol=0)  # SNAC's own NoiseBlock would differ every call
    shifted = snac.decode(frames_tensor(frames), torch.tensor([5]))
    assert not torch.equal(a, shifted)  # the noise follows the absolute position


@pytest.mark.slow
@pytest.mark.parametrize("arrival", [1, 3])
def test_streamed_audio_matches_the_offline_decode(snac, arrival):
    frames = np.random.default_rng(5).integers(0, 4096, (30, 7))
    frames[0, 0], frames[-1, -1] = 0, 4095
    decode = decode_fn(snac)
    offline = decode(frames, 0)
    streamed, planner = stream_decode(frames, StreamPlan(), decode, arrival=arrival)
    assert len(streamed) == len(offline) == 30 * SAMPLES_PER_FRAME
    assert snr_db(offline, streamed) > STREAMED_SNR_FLOOR_DB
    assert snr_db(offline[SAMPLES_PER_FRAME:], streamed[SAMPLES_PER_FRAME:]) > STEADY_SNR_FLOOR_DB
    assert planner.decoded_frames / 30 < 2.5  # the public decoder: 4


@pytest.mark.slow
def test_full_context_streaming_is_exact(snac):
    frames = np.random.default_rng(6).integers(0, 4096, (16, 7))
    decode = decode_fn(snac)
    plan = StreamPlan(left_context=3, lookahead=3, first_lookahead=3)
    streamed, _ = stream_decode(frames, plan, decode)
    np.testing.assert_allclose(streamed, decode(frames, 0), atol=2e-5)


@pytest.mark.slow
def test_the_public_sliding_window_loses_the_first_and_last_frames(snac):
    frames = np.random.default_rng(7).integers(0, 4096, (10, 7))
    audio, emitted, decoded = baseline_stream_decode(frames, decode_fn(snac))
    assert emitted == list(range(1, 8)) and decoded / len(emitted) == 4
    assert len(audio) == 7 * SAMPLES_PER_FRAME


@pytest.mark.slow
async def test_the_service_batches_concurrent_windows_and_returns_each_its_own_audio(snac):
    service = SnacDecodeService(snac, DecodeServiceConfig(max_batch=8, batch_timeout_ms=50))
    await service.start()
    try:
        rng = np.random.default_rng(8)
        windows = [rng.integers(0, 4096, (n, 7)) for n in (8, 8, 8, 5)]
        results = await asyncio.gather(*(service.decode(w, 10 * i) for i, w in enumerate(windows)))
        assert service.stats.batches == 2 and sorted(service.stats.batch_sizes) == [1, 3]  # by length
        for i, (window, audio) in enumerate(zip(windows, results)):
            alone = snac.decode(frames_tensor(window), torch.tensor([10 * i]))[0].numpy()
            np.testing.assert_allclose(audio, alone, atol=1e-4)
    finally:
        await service.close()


class GatedDecoder:
    """The SnacDecoder interface, held inside `decode` until the test opens the gate."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.batches: list[int] = []

    def decode(self, frames: torch.Tensor, first_frames: torch.Tensor) -> torch.Tensor:
        self.entered.set()
        self.gate.wait(10)
        self.batches.append(len(frames))
        return torch.zeros(len(frames), frames.shape[1] * SAMPLES_PER_FRAME)


async def wait_until(condition, timeout_s: float = 5.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met")


async def test_a_cancelled_window_takes_no_batch_slot():
    decoder = GatedDecoder()
    service = SnacDecodeService(decoder, DecodeServiceConfig(max_batch=2, batch_timeout_ms=20))
    await service.start()
    try:
        window = np.zeros((4, 7), dtype=np.int64)
        blocker = asyncio.create_task(service.decode(window, 0))
        await wait_until(decoder.entered.is_set)  # the blocker's batch is inside the decoder
        doomed = asyncio.create_task(service.decode(window, 1))
        kept = [asyncio.create_task(service.decode(window, i)) for i in (2, 3)]
        await wait_until(lambda: service.queue_depth == 3)
        doomed.cancel()  # the caller barged in before its window was batched
        decoder.gate.set()
        await asyncio.gather(blocker, *kept)
        assert decoder.batches == [1, 2]  # the two live windows shared a batch; the cancelled one took none
    finally:
        decoder.gate.set()
        await service.close()


async def test_a_full_queue_refuses_at_once_instead_of_queueing():
    decoder = GatedDecoder()
    service = SnacDecodeService(decoder, DecodeServiceConfig(max_batch=1, max_pending=3))
    await service.start()
    try:
        window = np.zeros((4, 7), dtype=np.int64)
        blocker = asyncio.create_task(service.decode(window, 0))
        await wait_until(decoder.entered.is_set)
        waiting = [asyncio.create_task(service.decode(window, i)) for i in range(3)]
        await wait_until(lambda: service.queue_depth == 3)
        with pytest.raises(CapacityError, match="3 windows waiting"):
            await service.decode(window, 9)
        decoder.gate.set()
        assert len(await asyncio.gather(blocker, *waiting)) == 4  # the admitted ones all finish
    finally:
        decoder.gate.set()
        await service.close()


@pytest.mark.slow
def test_the_codec_bench_prints_the_side_by_side_figures():
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "agent.cli", "bench", "tts-codec", "--json", "--quick"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["tokens_to_first_audio"] == 14 and result["baseline_tokens_to_first_audio"] == 28
    assert result["decode_frames_per_emitted_frame"] < result["baseline_decode_frames_per_emitted_frame"] == 4
    assert result["fidelity_snr_db"] > STREAMED_SNR_FLOOR_DB
    assert result["streamed_length_exact"] and result["frames_emitted"] == result["frames_in_stream"]
    assert result["baseline_frames_emitted"] == result["frames_in_stream"] - 3
    for key in ("decode_rtf_per_stream", "realtime_streams_cpu", "batched_speedup"):
        assert key in result


async def scripted_tokens(token_ids: list[int], chunk: int, closed: list[bool]):
    """A token source's stream, scripted: `chunk` ids at a time, then end of speech."""
    try:
        for start in range(0, len(token_ids), chunk):
            yield token_ids[start : start + chunk]
            await asyncio.sleep(0)
        yield [END_OF_SPEECH]
    finally:
        closed.append(True)


@pytest.mark.slow
async def test_tokens_through_the_shared_service_give_the_offline_audio(snac):
    frames = np.random.default_rng(9).integers(0, 4096, (20, 7))
    tokens = snac_codes_to_tokens(*frames_to_levels(frames))
    service = SnacDecodeService(snac, DecodeServiceConfig(batch_timeout_ms=5))
    await service.start()
    try:
        closed: list[bool] = []
        chunks = [a async for a in stream_audio(scripted_tokens(tokens, 5, closed), service)]
    finally:
        await service.close()
    streamed = np.concatenate(chunks)
    offline = snac.decode(frames_tensor(frames))[0].numpy()
    assert len(streamed) == len(offline) and closed == [True]
    assert snr_db(offline, streamed) > STREAMED_SNR_FLOOR_DB
    assert len(chunks[0]) == SAMPLES_PER_FRAME  # the first chunk is one frame, out after 14 tokens


@pytest.mark.slow
async def test_closing_the_audio_stream_mid_sentence_stops_the_token_stream(snac):
    frames = np.random.default_rng(10).integers(0, 4096, (40, 7))
    tokens = snac_codes_to_tokens(*frames_to_levels(frames))
    service = SnacDecodeService(snac)
    await service.start()
    try:
        closed: list[bool] = []
        audio = stream_audio(scripted_tokens(tokens, 7, closed), service)
        first = await audio.__anext__()
        await audio.aclose()  # barge-in
        assert len(first) == SAMPLES_PER_FRAME and closed == [True]
        assert service.queue_depth == 0
    finally:
        await service.close()
