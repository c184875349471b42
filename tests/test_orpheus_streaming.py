"""Streaming SNAC decode on the real SNAC 24 kHz architecture with random weights: the exact
streaming decoder (cached convolution state) against the offline decode, the batching
service, and the stream driver (head start, steady start, barge-in)."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import numpy as np
import pytest
import torch

from agent.errors import CapacityError
from models.orpheus import snac_codes_to_tokens
from latency_bench.components.codec_bench import baseline_stream_decode, exact_stream_decode
from models.orpheus.decode_service import DecodeServiceConfig, SnacDecodeService
from models.orpheus.snac_decoder import frames_tensor, load_snac, receptive_field_frames, snr_db
from models.orpheus.snac_stream import SnacStreamer
from models.orpheus.streaming import FRAME_SECONDS, StreamPlan, StreamStats, stream_audio
from models.orpheus.tokens import END_OF_SPEECH, SAMPLES_PER_FRAME, frames_to_levels

EXACT_ATOL = 2e-5  # float rounding: the streamed sums run in another order than the offline ones
HEAD_START_SNR_FLOOR_DB = 45.0  # the whole stream, frame 0 decoded with one frame of look-ahead


def test_bad_plans_are_refused():
    with pytest.raises(ValueError):
        StreamPlan(head_start_max_frames=0)
    with pytest.raises(ValueError):
        StreamPlan(step_sizes=())
    with pytest.raises(ValueError):
        StreamPlan(step_sizes=(2, 4))  # a lone waiting frame could never be stepped
    with pytest.raises(ValueError):
        StreamPlan(head_start_lookahead=-1)


@pytest.mark.parametrize("speed, step_s, frames_covered, seamless", [
    (1.0, 0.0, 1, False), (1.0, 0.0, 2, False),  # real time: the exact stream can never catch up in time
    (1.25, 0.005, 1, False), (1.25, 0.005, 2, True),  # a loaded GPU server: two frames of head start
    (1.25, 0.05, 2, False),  # ... unless the decoder is slow to follow
    (3.0, 0.005, 1, True),  # fast tokens: one frame, 14 tokens
])
def test_a_head_start_is_taken_only_where_the_exact_stream_takes_over_in_time(speed, step_s, frames_covered,
                                                                             seamless):
    from models.orpheus.streaming import head_start_is_seamless

    assert head_start_is_seamless(StreamPlan(), frames_covered, FRAME_SECONDS / speed, step_s, 4757) is seamless


def test_steps_take_the_largest_size_that_has_arrived():
    plan = StreamPlan(step_sizes=(1, 2, 4))
    assert [plan.step_frames(n) for n in (1, 2, 3, 4, 9)] == [1, 2, 2, 4, 4]
    assert plan.tokens_to_first_audio == 14


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


@pytest.fixture(scope="module")
def streamer(snac):
    return SnacStreamer(snac)


def offline(snac, frames):
    return snac.decode(frames_tensor(frames))[0].numpy()


def stream(streamer, frames, arrivals, *, flush_with_last=False):
    state, pieces, start = streamer.new_state(), [], 0
    for i, n in enumerate(arrivals):
        last = flush_with_last and i == len(arrivals) - 1
        pieces += [a.numpy() for a in streamer.step([state], torch.as_tensor(frames[None, start : start + n]),
                                                    final=last)]
        start += n
    if not flush_with_last:
        pieces += [a.numpy() for a in streamer.step([state], None)]
    assert state.finished
    return np.concatenate(pieces)


@pytest.mark.slow
def test_the_stream_lags_by_snacs_look_ahead_and_flushes_it_at_the_end(streamer):
    assert streamer.delay_samples == 4757  # ~2.3 frames, summed over the decoder's layers
    assert streamer.flush_latent_steps == 10  # 10 x 512 samples cover it


@pytest.mark.slow
@pytest.mark.parametrize("arrivals, flush_with_last", [([1] * 30, False), ([3, 1, 7, 2, 9, 8], False),
                                                       ([30], True), ([2] * 15, True)])
def test_streamed_audio_is_the_offline_audio_whatever_the_arrival_pattern(snac, streamer, arrivals, flush_with_last):
    frames = np.random.default_rng(5).integers(0, 4096, (30, 7))
    frames[0, 0], frames[-1, -1] = 0, 4095
    streamed = stream(streamer, frames, arrivals, flush_with_last=flush_with_last)
    assert len(streamed) == 30 * SAMPLES_PER_FRAME
    np.testing.assert_allclose(streamed, offline(snac, frames), atol=EXACT_ATOL)


@pytest.mark.slow
@pytest.mark.parametrize("length", [1, 2, 3])
def test_utterances_shorter_than_the_look_ahead_come_out_whole(snac, streamer, length):
    frames = np.random.default_rng(length).integers(0, 4096, (length, 7))
    streamed = stream(streamer, frames, [1] * length)
    np.testing.assert_allclose(streamed, offline(snac, frames), atol=EXACT_ATOL)


@pytest.mark.slow
def test_streams_at_different_points_share_a_step_and_each_gets_its_own_audio(snac, streamer):
    rng = np.random.default_rng(11)
    old, new = rng.integers(0, 4096, (14, 7)), rng.integers(0, 4096, (4, 7))
    a, b = streamer.new_state(), streamer.new_state()
    pieces_a = [x.numpy() for x in streamer.step([a], torch.as_tensor(old[None, :10]))]
    pieces_b = []
    for i in range(4):  # `new` starts (its edge is masked) while `old` is mid-stream
        out_a, out_b = streamer.step([a, b], torch.as_tensor(np.stack([old[10 + i : 11 + i], new[i : i + 1]])))
        pieces_a.append(out_a.numpy())
        pieces_b.append(out_b.numpy())
    flushed_a, flushed_b = streamer.step([a, b], None)
    np.testing.assert_allclose(np.concatenate(pieces_a + [flushed_a.numpy()]), offline(snac, old), atol=EXACT_ATOL)
    np.testing.assert_allclose(np.concatenate(pieces_b + [flushed_b.numpy()]), offline(snac, new), atol=EXACT_ATOL)


@pytest.mark.slow
def test_misuse_of_a_stream_is_refused(streamer):
    state = streamer.new_state()
    with pytest.raises(ValueError, match=r"\(streams, n, 7\)"):
        streamer.step([state], torch.zeros(1, 2, 6, dtype=torch.long))
    streamer.step([state], torch.zeros(1, 2, 7, dtype=torch.long), final=True)
    with pytest.raises(ValueError, match="after its end"):
        streamer.step([state], torch.zeros(1, 1, 7, dtype=torch.long))
    with pytest.raises(ValueError, match="after its end"):
        streamer.step([state], None)


@pytest.mark.slow
def test_the_head_start_frame_is_close_and_everything_after_it_exact(snac, streamer):
    frames = np.random.default_rng(12).integers(0, 4096, (20, 7))
    streamed, decoded = exact_stream_decode(frames, streamer, snac)
    reference = offline(snac, frames)
    assert len(streamed) == len(reference)
    assert snr_db(reference, streamed) > HEAD_START_SNR_FLOOR_DB
    np.testing.assert_allclose(streamed[SAMPLES_PER_FRAME:], reference[SAMPLES_PER_FRAME:], atol=EXACT_ATOL)
    assert decoded == 20 + 2 + 2.5  # each frame once, plus the head start (2) and the flush (10 latent steps)


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


@contextlib.asynccontextmanager
async def blocked_service(config: DecodeServiceConfig):
    """A service whose first window (the blocker) is held inside the decoder until the
    test opens `decoder.gate`: whatever is submitted next waits in the queue."""
    decoder = GatedDecoder()
    service = SnacDecodeService(decoder, config)
    await service.start()
    try:
        blocker = asyncio.create_task(service.decode(WINDOW, 0))
        await wait_until(decoder.entered.is_set)  # the blocker's batch is inside the decoder
        yield decoder, service, blocker
    finally:
        decoder.gate.set()
        await service.close()


WINDOW = np.zeros((4, 7), dtype=np.int64)


async def test_a_cancelled_window_takes_no_batch_slot():
    async with blocked_service(DecodeServiceConfig(max_batch=2, batch_timeout_ms=20)) as (decoder, service, blocker):
        doomed = asyncio.create_task(service.decode(WINDOW, 1))
        kept = [asyncio.create_task(service.decode(WINDOW, i)) for i in (2, 3)]
        await wait_until(lambda: service.queue_depth == 3)
        doomed.cancel()  # the caller barged in before its window was batched
        decoder.gate.set()
        await asyncio.gather(blocker, *kept)
        assert decoder.batches == [1, 2]  # the two live windows shared a batch; the cancelled one took none


async def test_a_full_queue_refuses_at_once_instead_of_queueing():
    async with blocked_service(DecodeServiceConfig(max_batch=1, max_pending=3)) as (decoder, service, blocker):
        waiting = [asyncio.create_task(service.decode(WINDOW, i)) for i in range(3)]
        await wait_until(lambda: service.queue_depth == 3)
        with pytest.raises(CapacityError, match="3 requests waiting"):
            await service.decode(WINDOW, 9)
        decoder.gate.set()
        assert len(await asyncio.gather(blocker, *waiting)) == 4  # the admitted ones all finish


@pytest.mark.slow
async def test_the_batcher_stops_waiting_once_every_open_stream_is_in(snac):
    service = SnacDecodeService(snac, DecodeServiceConfig(max_batch=8, batch_timeout_ms=3000))
    await service.start()
    try:
        states = [service.open_stream() for _ in range(2)]
        frames = np.random.default_rng(13).integers(0, 4096, (2, 2, 7))
        loop = asyncio.get_running_loop()
        began = loop.time()
        await asyncio.gather(*(service.step(state, f) for state, f in zip(states, frames)))
        assert loop.time() - began < 2.0  # not the 3 s timeout: no other stream could join
        assert service.stats.batch_sizes == [2]
        for state in states:
            service.release(state)
        assert service.open_streams == 0
    finally:
        await service.close()


@pytest.mark.system
@pytest.mark.slow
def test_the_codec_bench_prints_the_side_by_side_figures():
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "agent.cli", "bench", "tts-codec", "--json", "--quick",
                           "--max-streams", "2", "--trials", "1"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["tokens_to_first_audio"] == 14 and result["baseline_tokens_to_first_audio"] == 28
    assert result["tokens_to_first_exact_audio"] == 21
    assert result["tokens_to_first_audio_at_real_time"] >= 21
    # On a GPU (~5 ms a step) 21 tokens; a CPU's slower steps may rule the head start out.
    assert result["tokens_to_first_audio_at_1_25x_real_time"] % 7 == 0
    assert result["tokens_to_first_audio_at_1_25x_real_time"] >= 21
    assert result["decode_frames_per_emitted_frame"] < 1.2 < result["baseline_decode_frames_per_emitted_frame"] == 4
    assert result["fidelity_snr_db"] > HEAD_START_SNR_FLOOR_DB
    assert result["fidelity_snr_db_without_head_start"] > 90  # float rounding only
    assert result["streamed_length_exact"] and result["frames_emitted"] == result["frames_in_stream"]
    assert result["baseline_frames_emitted"] == result["frames_in_stream"] - 3
    assert set(result["realtime_worst_lag_s_by_streams"]) >= {"1"}
    for key in ("decode_rtf_per_stream", "realtime_streams_cpu", "batched_speedup"):
        assert key in result


async def scripted_tokens(token_ids: list[int], chunk: int, closed: list[bool], clock=None):
    """A token source's stream, scripted: `chunk` ids at a time, then end of speech.
    With `clock` (a FakeClock), a frame's worth of tokens takes one frame of time."""
    try:
        for start in range(0, len(token_ids), chunk):
            if clock is not None:
                clock.now += FRAME_SECONDS * chunk / 7
            yield token_ids[start : start + chunk]
            await asyncio.sleep(0)
        yield [END_OF_SPEECH]
    finally:
        closed.append(True)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TimedCodec:
    """A codec whose every decode takes `seconds` on `clock` (a FakeClock), whatever it
    took on this machine's: with tokens that take no time, a stream's choices (a head start
    or not, how long) come out the same on a loaded machine as on an idle one."""

    def __init__(self, codec, clock: FakeClock, seconds: float) -> None:
        self._codec, self._clock, self._seconds = codec, clock, seconds

    def __getattr__(self, name: str):
        return getattr(self._codec, name)

    async def decode(self, *args, **kwargs) -> np.ndarray:
        audio = await self._codec.decode(*args, **kwargs)
        self._clock.now += self._seconds
        return audio

    async def step(self, *args, **kwargs) -> np.ndarray:
        audio = await self._codec.step(*args, **kwargs)
        self._clock.now += self._seconds
        return audio


FAST_STEP_S = 0.02  # a decode step on a GPU, well inside a frame (85 ms)


def scripted_stream(token_ids: list[int], chunk: int, closed: list[bool], codec, clock: FakeClock | None):
    """`stream_audio`'s token source, codec and clock for a scripted utterance. With `clock`,
    tokens come at real-time pace on it and decodes take none of it; without, tokens come as
    fast as they can and each decode takes FAST_STEP_S on a fake clock of its own."""
    if clock is None:
        clock = FakeClock()
        return scripted_tokens(token_ids, chunk, closed), TimedCodec(codec, clock, FAST_STEP_S), clock
    return scripted_tokens(token_ids, chunk, closed, clock), codec, clock


async def run_stream(snac, frames, chunk, *, clock=None):
    tokens = snac_codes_to_tokens(*frames_to_levels(frames))
    service = SnacDecodeService(snac, DecodeServiceConfig(batch_timeout_ms=5))
    await service.start()
    service.warm_up()  # as the engine does at load: a cold first step would rule the 1-frame head start out
    stats, closed = StreamStats(), []
    try:
        source, codec, clock = scripted_stream(tokens, chunk, closed, service, clock)
        chunks = [a async for a in stream_audio(source, codec, stats=stats, clock=clock)]
        assert service.open_streams == 0 and closed == [True]
    finally:
        await service.close()
    return chunks, stats


@pytest.mark.slow
async def test_fast_tokens_get_a_head_start_and_the_offline_audio_after_it(snac):
    frames = np.random.default_rng(9).integers(0, 4096, (20, 7))
    chunks, stats = await run_stream(snac, frames, 5)
    streamed, reference = np.concatenate(chunks), offline(snac, frames)
    assert stats.head_start and stats.frames_for_first_audio == 2  # 14 tokens
    assert len(chunks[0]) == SAMPLES_PER_FRAME and len(streamed) == len(reference)
    np.testing.assert_allclose(streamed[SAMPLES_PER_FRAME:], reference[SAMPLES_PER_FRAME:], atol=EXACT_ATOL)
    assert stats.decoded_frames == 20 + 2 + 2.5


@pytest.mark.slow
async def test_real_time_tokens_start_exact_with_enough_audio_to_not_stall(snac):
    frames = np.random.default_rng(14).integers(0, 4096, (12, 7))
    chunks, stats = await run_stream(snac, frames, 7, clock=FakeClock())  # 7 tokens per frame time
    assert not stats.head_start  # a head start would leave a gap after frame 0 at this speed
    assert len(chunks[0]) >= SAMPLES_PER_FRAME  # covers the wait for the next frame
    np.testing.assert_allclose(np.concatenate(chunks), offline(snac, frames), atol=EXACT_ATOL)


@pytest.mark.slow
async def test_closing_the_audio_stream_mid_sentence_stops_the_tokens_and_frees_the_stream(snac):
    frames = np.random.default_rng(10).integers(0, 4096, (40, 7))
    tokens = snac_codes_to_tokens(*frames_to_levels(frames))
    service = SnacDecodeService(snac)
    await service.start()
    service.warm_up()
    try:
        closed: list[bool] = []
        audio = stream_audio(scripted_tokens(tokens, 7, closed), service)
        first = await audio.__anext__()
        assert service.open_streams == 1
        await audio.aclose()  # barge-in
        assert len(first) in (SAMPLES_PER_FRAME, 2 * SAMPLES_PER_FRAME) and closed == [True]  # a head start
        assert service.queue_depth == 0 and service.open_streams == 0
    finally:
        await service.close()


@pytest.mark.slow
async def test_a_misaligned_token_fails_the_stream_with_a_clear_error(snac):
    from models.orpheus.tokens import OrpheusTokenError

    service = SnacDecodeService(snac)
    await service.start()
    try:
        closed: list[bool] = []
        bad = snac_codes_to_tokens(*frames_to_levels(np.zeros((1, 7), dtype=np.int64)))[1:] + [128266]
        with pytest.raises(OrpheusTokenError):
            async for _ in stream_audio(scripted_tokens(bad, 7, closed), service):
                pass
        assert closed == [True] and service.open_streams == 0
    finally:
        await service.close()
