"""The SNAC codec worker: the real SNAC 24 kHz architecture (random weights) behind
`WS /v1/codec/stream`, the Orpheus stream driver talking to it through RemoteSnacCodec.

The worker runs on the test's loop (uvicorn on an inherited socket, as in
test_worker_server.py), except where a real process must be killed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from websockets.asyncio.client import connect

from models.errors import CapacityError, ConfigError, WorkerUnavailableError
from models.orpheus import snac_codes_to_tokens
from models.orpheus.codec_engine import SnacCodecEngine
from models.orpheus.codec_wire import (
    FINAL, FLUSH, PATH, STEP, WINDOW, CodecRequest, CodecWireError, decode_audio, decode_request, encode_request)
from models.orpheus.decode_service import DecodeServiceConfig
from models.orpheus.remote_codec import RemoteSnacCodec
from models.orpheus.snac_decoder import frames_tensor, load_snac
from models.orpheus.streaming import StreamStats, stream_audio
from models.orpheus.tokens import SAMPLES_PER_FRAME, frames_to_levels
from tests.test_orpheus_streaming import EXACT_ATOL, FakeClock, scripted_stream
from tests.test_worker_server import _listening_socket, serving, until
from workers.batcher import BatchRecord
from workers.server import WorkerLimits, build_worker_app

ROOT = Path(__file__).resolve().parent.parent
CLEAR_ERROR_S = 2.0  # a call must learn that its codec worker is gone within this


# --- the wire format --------------------------------------------------------------------------

def test_requests_survive_the_wire_and_malformed_ones_are_named():
    frames = np.random.default_rng(0).integers(0, 4096, (3, 7))
    for kind in (WINDOW, STEP, FINAL):
        back = decode_request(encode_request(CodecRequest(kind, frames, 5, 2048)), max_frames=8)
        assert (back.kind, back.first_frame, back.skip_to) == (kind, 5, 2048)
        np.testing.assert_array_equal(back.frames, frames)
    assert decode_request(encode_request(CodecRequest(FLUSH, None)), max_frames=8).frames is None
    message = encode_request(CodecRequest(STEP, frames))
    bad = {
        "header": message[:5],
        "unknown": bytes([9]) + message[1:],
        "at most 2": None,
        "bytes of codes": message[:-2],
        "at most 4095": message[:13] + np.full(21, 4096, "<u2").tobytes(),
        "no frames": encode_request(CodecRequest(FLUSH, frames))[:13] + message[13:],
        "at least one": encode_request(CodecRequest(STEP, np.zeros((0, 7), np.int64))),
    }
    for problem, raw in bad.items():
        with pytest.raises(CodecWireError, match=problem):
            decode_request(raw if raw is not None else message, max_frames=8 if raw is not None else 2)
    with pytest.raises(CodecWireError, match="whole float32"):
        decode_audio(b"\x00" * 6)


# --- a worker on the test's loop ------------------------------------------------------------

@pytest.fixture(scope="module")
def snac():
    torch.set_num_threads(2)
    return load_snac(None, seed=0)


def codec_app(snac, *, max_in_flight: int = 8, limits: WorkerLimits = WorkerLimits()):
    engine = SnacCodecEngine(lambda: snac, DecodeServiceConfig(batch_timeout_ms=5), batch_record=BatchRecord(16))
    engine.load()
    engine.warm_up()
    return build_worker_app(engine, role="codec", name="test-codec", max_in_flight=max_in_flight,
                            limits=limits, loaded=True)


def offline(snac, frames: np.ndarray) -> np.ndarray:
    return snac.decode(frames_tensor(frames))[0].numpy()


async def remote_stream(url: str, frames: np.ndarray, chunk: int, *, clock=None):
    codec = await asyncio.to_thread(RemoteSnacCodec(url).load)
    tokens = snac_codes_to_tokens(*frames_to_levels(frames))
    stats, closed = StreamStats(), []
    try:
        source, timed_codec, clock = scripted_stream(tokens, chunk, closed, codec, clock)
        chunks = [a async for a in stream_audio(source, timed_codec, stats=stats, clock=clock)]
        assert codec.open_streams == 0 and closed == [True]
    finally:
        await codec.close()
    return chunks, stats


@pytest.mark.slow
async def test_real_time_tokens_through_the_worker_give_the_offline_audio_exactly(snac):
    frames = np.random.default_rng(14).integers(0, 4096, (12, 7))
    app = codec_app(snac)
    async with serving(app) as url:
        chunks, stats = await remote_stream(url, frames, 7, clock=FakeClock())
        await until(lambda: app.state.worker.in_flight == 0)  # the stream's state was released
        async with httpx.AsyncClient() as client:
            metrics = (await client.get(f"{url}/metrics")).text
    assert not stats.head_start
    np.testing.assert_allclose(np.concatenate(chunks), offline(snac, frames), atol=EXACT_ATOL)
    steps = [line for line in metrics.splitlines() if line.startswith("cadence_worker_batch_size_count")]
    assert steps and float(steps[0].rsplit(" ", 1)[1]) >= 3  # the steps and the flush were batches


@pytest.mark.slow
async def test_fast_tokens_get_the_head_start_and_the_worker_skips_what_it_covered(snac):
    frames = np.random.default_rng(9).integers(0, 4096, (20, 7))
    async with serving(codec_app(snac)) as url:
        chunks, stats = await remote_stream(url, frames, 5)
    streamed, reference = np.concatenate(chunks), offline(snac, frames)
    assert stats.head_start and len(chunks[0]) == SAMPLES_PER_FRAME
    assert len(streamed) == len(reference)  # no sample twice, none missing
    np.testing.assert_allclose(streamed[SAMPLES_PER_FRAME:], reference[SAMPLES_PER_FRAME:], atol=EXACT_ATOL)


@pytest.mark.slow
async def test_streams_of_concurrent_calls_share_the_workers_batches(snac):
    rng = np.random.default_rng(3)
    streams = [rng.integers(0, 4096, (10, 7)) for _ in range(4)]
    app = codec_app(snac)
    async with serving(app) as url:
        results = await asyncio.gather(*(remote_stream(url, f, 7, clock=FakeClock()) for f in streams))
        record = app.state.worker.engine.batch_record
    for frames, (chunks, _) in zip(streams, results):
        np.testing.assert_allclose(np.concatenate(chunks), offline(snac, frames), atol=EXACT_ATOL)
    assert max(size for size, count in enumerate(record.counts) if count) >= 2


@pytest.mark.slow
async def test_a_full_worker_refuses_the_next_stream_at_once_and_takes_it_once_one_ends(snac):
    frames = np.random.default_rng(1).integers(0, 4096, (2, 7))
    app = codec_app(snac, max_in_flight=1)
    async with serving(app) as url:
        codec = await asyncio.to_thread(RemoteSnacCodec(url).load)
        try:
            first, second = codec.open_stream(), codec.open_stream()
            await codec.step(first, frames)
            started = time.monotonic()
            with pytest.raises(CapacityError, match="1 streams open, its bound"):
                await codec.step(second, frames)
            assert time.monotonic() - started < 1.0  # refused, not queued
            codec.release(first)
            codec.release(second)
            await until(lambda: app.state.worker.in_flight == 0)
            third = codec.open_stream()
            assert len(await codec.step(third, frames, final=True)) == 2 * SAMPLES_PER_FRAME
        finally:
            await codec.close()


@pytest.mark.slow
async def test_bad_requests_are_refused_and_the_stream_goes_on(snac):
    frames = np.random.default_rng(2).integers(0, 4096, (3, 7))
    async with serving(codec_app(snac, limits=WorkerLimits(max_codec_frames=4))) as url:
        async with connect(f"ws{url.removeprefix('http')}{PATH}") as ws:
            for bad, problem in [("hello", "binary messages"), (b"\x01\x02", "header"),
                                 (encode_request(CodecRequest(STEP, np.zeros((5, 7), np.int64))), "at most 4")]:
                await ws.send(bad)
                refusal = json.loads(await ws.recv())
                assert problem in refusal["error"] and refusal["retryable"] is False
            await ws.send(encode_request(CodecRequest(FINAL, frames)))
            assert len(decode_audio(await ws.recv())) == 3 * SAMPLES_PER_FRAME


@pytest.mark.slow
async def test_a_silent_stream_is_closed_and_its_slot_freed(snac):
    app = codec_app(snac, max_in_flight=1, limits=WorkerLimits(codec_idle_s=0.2))
    async with serving(app) as url:
        async with connect(f"ws{url.removeprefix('http')}{PATH}") as ws:
            await until(lambda: app.state.worker.in_flight == 1)
            await ws.wait_closed()
            assert ws.close_code == 1000 and "idle" in ws.close_reason
        await until(lambda: app.state.worker.in_flight == 0)


@pytest.mark.slow
async def test_load_refuses_a_worker_that_is_not_a_codec_or_not_there(snac):
    from tests.fakes_workers import GatedEmbedder

    with pytest.raises(ConfigError, match="must start with http:// or https://"):
        RemoteSnacCodec("ws://x")
    embedder = build_worker_app(GatedEmbedder(dimensions=4), role="embedder", name="e", max_in_flight=1, loaded=True)
    async with serving(embedder) as other, serving(codec_app(snac)) as url:
        with pytest.raises(ConfigError, match="serves 'embedder', not codec"):
            await asyncio.to_thread(RemoteSnacCodec(other).load)
        with pytest.raises(WorkerUnavailableError, match="127.0.0.1:1 cannot be reached"):
            await asyncio.to_thread(RemoteSnacCodec([url, "http://127.0.0.1:1"]).load)
        assert (await asyncio.to_thread(RemoteSnacCodec(url).load)).delay_samples > 0
    with pytest.raises(ConfigError, match="repeat one another"):
        RemoteSnacCodec([url, url + "/"])


@pytest.mark.slow
async def test_streams_spread_over_codec_replicas_and_avoid_one_that_is_gone(snac):
    import contextlib

    frames = np.random.default_rng(5).integers(0, 4096, (2, 7))
    first, second = codec_app(snac), codec_app(snac)
    async with serving(first) as url_a, contextlib.AsyncExitStack() as stack:
        url_b = await stack.enter_async_context(serving(second))
        codec = await asyncio.to_thread(RemoteSnacCodec([url_a, url_b]).load)
        try:
            streams = [codec.open_stream() for _ in range(4)]
            await asyncio.gather(*(codec.step(s, frames) for s in streams))
            assert sorted(s.url for s in streams) == sorted([url_a, url_a, url_b, url_b])
            for stream in streams:
                codec.release(stream)
            await stack.aclose()  # replica b is gone
            later = [codec.open_stream() for _ in range(2)]
            for stream in later:
                assert len(await codec.step(stream, frames, final=True)) == 2 * SAMPLES_PER_FRAME
            assert {s.url for s in later} == {url_a}
        finally:
            await codec.close()


# --- a real worker process --------------------------------------------------------------------

@pytest.mark.slow
async def test_a_codec_worker_process_killed_mid_stream_is_reported_within_two_seconds():
    sock = _listening_socket()
    port = sock.getsockname()[1]
    sock.close()
    url = f"http://127.0.0.1:{port}"
    child = subprocess.Popen([sys.executable, "-m", "workers.serve_worker", "--engine", "snac", "--model", "random",
                              "--port", str(port), "--max-in-flight", "4", "--batch-timeout-ms", "15"],
                             cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    codec = RemoteSnacCodec(url)
    try:
        deadline = time.monotonic() + 120  # the child imports torch and builds SNAC first
        while True:
            assert child.poll() is None, child.stderr.read().decode()[-2000:]
            try:
                await asyncio.to_thread(codec.load)
                break
            except WorkerUnavailableError:
                assert time.monotonic() < deadline, "the codec worker never became ready"
                await asyncio.sleep(0.2)  # polling another process's readiness: nothing to wait on here
        stream = codec.open_stream()
        frames = np.random.default_rng(4).integers(0, 4096, (4, 7))
        assert len(await codec.step(stream, frames)) > 0
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
        started = time.monotonic()
        with pytest.raises(WorkerUnavailableError, match=str(port)):
            await codec.step(stream, frames)
        assert time.monotonic() - started < CLEAR_ERROR_S
        with pytest.raises(WorkerUnavailableError, match="cannot be reached"):
            await codec.step(codec.open_stream(), frames)  # a new stream finds nobody there
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=10)
        await codec.close()


# --- the agent server's side ------------------------------------------------------------------

@pytest.mark.slow
async def test_the_engine_factory_points_the_orpheus_voice_at_the_codec_worker(snac, default_config):
    from dataclasses import replace

    from agent.config import OrpheusConfig, TTSConfig
    from agent.engine_factory import build_tts
    from agent.errors import ConfigError as AgentConfigError
    from agent.model_plane import Endpoint

    app = codec_app(snac)
    async with serving(app) as url:
        codec = Endpoint(role="codec", engine="snac", urls=(url,), model=None, max_streams=8)
        with pytest.raises(AgentConfigError, match="the voice is piper"):
            build_tts(default_config, None, codec)
        config = replace(default_config, tts=replace(TTSConfig(), engine="orpheus",
                                                     orpheus=OrpheusConfig(fallback_to_piper=False)))
        voice = build_tts(config, None, codec)
        await asyncio.to_thread(voice.load)
        try:
            audio = b"".join([chunk async for chunk in voice.synthesize("Hello there.")])
        finally:
            await voice.close()
        assert len(audio) > 0 and sum(app.state.worker.engine.batch_record.counts) > 0


@pytest.mark.slow
@pytest.mark.e2e
async def test_a_call_speaks_through_a_codec_worker_the_server_started(default_config, tmp_path):
    from dataclasses import replace

    from agent.config import OrpheusConfig, StoreConfig, TTSConfig
    from latency_bench.callers import twilio_caller
    from latency_bench.callers.audio import speak
    from latency_bench.callers.conversation import PlannedTurn
    from tests.conftest import running_server

    deployment = tmp_path / "codec.yaml"
    deployment.write_text(
        "name: cpu-codec\n"
        "workers:\n"
        "  codec:\n"
        "    engine: snac\n"
        "    run: process\n"
        "    model: random\n"
        "    device: cpu\n"
        "    threads: 1\n"
        "    batching: {max_batch: 16, timeout_ms: 15}\n"
        "    max_streams: 4\n")
    config = replace(default_config, store=StoreConfig(path=str(tmp_path / "calls.sqlite3")),
                     deployment=str(deployment),
                     tts=replace(TTSConfig(), engine="orpheus", orpheus=OrpheusConfig(fallback_to_piper=False)))
    samples, rate = speak("Hello. What is the capital of France?")
    with running_server(config, None, ready_timeout_s=240) as server:
        workers = server.app.state.model_plane.supervisor.workers
        assert [w.launch.role for w in workers] == ["codec"]
        codec_url = workers[0].launch.base_url
        result = await twilio_caller.call(f"{server.ws_url}/ws/twilio", [PlannedTurn.of(samples, rate)])
        async with httpx.AsyncClient() as http:
            metrics = (await http.get(f"{codec_url}/metrics")).text
    turn, = result.turns
    assert turn.error is None and turn.reply_audio_seconds > 1.0
    streams = [line for line in metrics.splitlines()
               if line.startswith("cadence_worker_request_seconds_count") and "#final" in line]
    assert streams and sum(float(line.rsplit(" ", 1)[1]) for line in streams) >= 1  # a sentence ended there
