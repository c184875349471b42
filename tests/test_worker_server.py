"""The model worker for real on loopback: uvicorn serves fake engines on the test's own event loop,
and the remote engines (models/remote.py) talk to it over HTTP.

Running the server on the test's loop lets the fakes use asyncio.Events: a test waits for
"the engine was entered" or "the stream was closed" instead of sleeping. A killed worker is
a child process on an inherited listening socket, killed with SIGKILL mid-stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import numpy as np
import pytest
import uvicorn

from models.errors import CadenceError, CapacityError, ConfigError, WorkerUnavailableError
from models.remote import RemoteASREngine, RemoteEmbeddingEngine, RemoteOptions, RemoteTTSEngine
from models.scheduling import answer_within
from tests.fakes_workers import GatedASR, GatedEmbedder, ScriptedTTS, fake_vector
from workers.batched_embedder import BatchedEmbedder
from workers.batcher import BatchPolicy
from workers.server import WorkerLimits, build_worker_app

ROOT = Path(__file__).resolve().parent.parent
WAIT_S = 5.0  # bound on an event that must come; never reached when the code is right
CLEAR_ERROR_S = 2.0  # a call must learn that its worker is gone within this


def _listening_socket(port: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(64)  # connections queue here even before uvicorn accepts: no start-up wait
    return sock


@contextlib.asynccontextmanager
async def serving(app, *, port: int = 0) -> AsyncIterator[str]:
    """`app` on loopback, on `port` (0: a free one), until the block ends."""
    sock = _listening_socket(port)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


async def until(condition: Callable[[], bool]) -> None:
    """Lets the loop run (zero-length yields, no timed sleeps) until `condition` holds."""
    async with asyncio.timeout(WAIT_S):
        while not condition():
            await asyncio.sleep(0)


def _app(engine, role: str, *, max_in_flight: int = 8, loaded: bool = True, **kwargs):
    return build_worker_app(engine, role=role, name=f"test-{role}", max_in_flight=max_in_flight, loaded=loaded,
                            **kwargs)


def _metric(text: str, name: str) -> float:
    lines = [line for line in text.splitlines() if line.startswith(name)]
    assert lines, f"{name} not in /metrics"
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


# --- readiness, health, metrics -------------------------------------------------------------

async def test_readiness_flips_once_the_engine_is_loaded_and_warmed():
    engine = GatedEmbedder(dimensions=4)
    engine.load_gate.clear()
    app = _app(engine, "embedder", loaded=False)
    async with serving(app) as url, httpx.AsyncClient(base_url=url) as http:
        assert (await http.get("/healthz")).status_code == 200
        not_ready = await http.get("/readyz")
        assert not_ready.status_code == 503 and not_ready.json()["ready"] is False
        refused = await http.post("/v1/embed", json={"texts": ["hi"]})
        assert refused.status_code == 503 and refused.json()["retryable"] is True
        engine.load_gate.set()
        await asyncio.wait_for(app.state.worker.became_ready.wait(), WAIT_S)
        ready = await http.get("/readyz")
        assert ready.status_code == 200 and ready.json() == {"ready": True, "worker": "test-embedder",
                                                             "role": "embedder", "dimensions": 4}
    assert engine.closed  # the app owns its engine


async def test_a_worker_whose_engine_failed_to_load_says_why_and_the_client_gets_unavailable():
    class BrokenEmbedder(GatedEmbedder):
        def load(self) -> None:
            raise OSError("weights missing")

    failures: list[BaseException] = []
    app = _app(BrokenEmbedder(), "embedder", loaded=False, on_load_failure=failures.append)
    async with serving(app) as url:
        await until(lambda: bool(failures))
        remote = RemoteEmbeddingEngine(url, 4)
        with pytest.raises(WorkerUnavailableError, match="weights missing"):
            await asyncio.to_thread(remote.load)
        await remote.close()


async def test_load_refuses_a_worker_of_another_role_or_shape():
    async with serving(_app(ScriptedTTS(), "tts")) as url:
        for remote in (RemoteASREngine(url), RemoteTTSEngine(url, sample_rate=16_000)):
            with pytest.raises(ConfigError):
                await asyncio.to_thread(remote.load)
            await remote.close()
        good = RemoteTTSEngine(url, sample_rate=ScriptedTTS.sample_rate)
        await asyncio.to_thread(good.load)
        await good.close()


async def test_metrics_show_batch_sizes_queue_depth_and_refusals():
    inner = GatedEmbedder(dimensions=4)
    inner.load()
    engine = BatchedEmbedder(inner, BatchPolicy(max_batch=4, timeout_s=0.0, max_pending=16))
    engine.load()
    app = _app(engine, "embedder")
    async with serving(app) as url, httpx.AsyncClient(base_url=url) as http:
        remote = RemoteEmbeddingEngine(url, 4)
        inner.gate.clear()
        first = asyncio.create_task(remote.embed(["first call"]))
        await until(lambda: len(inner.calls) == 1)  # its batch runs, held
        others = [asyncio.create_task(remote.embed([f"call {i}", f"call {i} again"])) for i in range(3)]
        await until(lambda: engine.queue_depth == 4)  # three wait behind the running batch
        metrics = (await http.get("/metrics")).text
        assert _metric(metrics, "cadence_worker_queue_depth{") == 4
        inner.gate.set()
        results = await asyncio.gather(first, *others)
        # The three waiting calls became one pass over their six texts, split back per call.
        assert inner.calls[1] == ["call 0", "call 0 again", "call 1", "call 1 again", "call 2", "call 2 again"]
        for i, vectors in enumerate(results[1:]):
            np.testing.assert_allclose(vectors, np.stack([fake_vector(f"call {i}", 4), fake_vector(f"call {i} again", 4)]))
        metrics = (await http.get("/metrics")).text
        assert _metric(metrics, "cadence_worker_batch_size_count") == 2
        assert _metric(metrics, "cadence_worker_batch_size_sum") == 4
        assert _metric(metrics, 'cadence_worker_batch_size_bucket{le="1.0"') == 1
        assert _metric(metrics, "cadence_worker_request_seconds_count") == 4  # the /metrics reads not counted
        assert _metric(metrics, "cadence_worker_queue_depth{") == 0
        await remote.close()


# --- admission: full, deadlines, disconnects -------------------------------------------------

async def test_a_full_worker_answers_503_retryable_at_once_and_the_client_sees_capacity():
    engine = GatedASR()
    engine.gate.clear()
    app = _app(engine, "asr", max_in_flight=1)
    async with serving(app) as url, httpx.AsyncClient(base_url=url) as http:
        remote = RemoteASREngine(url)
        held = asyncio.create_task(remote.transcribe(b"\x00\x01" * 160))
        await asyncio.wait_for(engine.entered.wait(), WAIT_S)
        refused = await http.post("/v1/transcribe", content=b"\x00\x01" * 160, headers={"X-Request-Id": "call-7.turn-3"})
        assert refused.status_code == 503
        assert refused.headers["Retry-After"] == "1" and refused.headers["X-Request-Id"] == "call-7.turn-3"
        assert refused.json()["retryable"] is True and "in flight" in refused.json()["error"]
        with pytest.raises(CapacityError, match="in flight"):
            await remote.transcribe(b"\x00\x01" * 160)
        assert _metric((await http.get("/metrics")).text, "cadence_worker_refused_total{") == 2
        engine.gate.set()
        assert (await held).text == "160 samples"
        await remote.close()


async def test_a_client_that_disconnects_cancels_the_engine_call():
    engine = GatedASR()
    engine.gate.clear()
    app = _app(engine, "asr", max_in_flight=1)
    async with serving(app) as url:
        remote = RemoteASREngine(url)
        call = asyncio.create_task(remote.transcribe(b"\x00\x01" * 160))
        await asyncio.wait_for(engine.entered.wait(), WAIT_S)
        call.cancel()  # the hang-up: httpx drops the connection
        await asyncio.wait_for(engine.cancelled.wait(), WAIT_S)
        await until(lambda: app.state.worker.in_flight == 0)  # the slot is back
        engine.gate.set()
        assert (await remote.transcribe(b"\x00\x01" * 8)).text == "8 samples"
        await remote.close()


async def test_a_deadline_that_passes_is_a_retryable_504_and_capacity_for_the_client():
    engine = GatedASR()
    engine.gate.clear()
    async with serving(_app(engine, "asr")) as url:
        remote = RemoteASREngine(url)
        with answer_within(0.001), pytest.raises(CapacityError, match="deadline"):
            await remote.transcribe(b"\x00\x01" * 160)
        await remote.close()


# --- the roles end to end ---------------------------------------------------------------------

async def test_transcribe_round_trip_with_prompt_and_request_id():
    engine = GatedASR()
    async with serving(_app(engine, "asr")) as url, httpx.AsyncClient(base_url=url) as http:
        remote = RemoteASREngine(url)
        transcript = await remote.transcribe(b"\x00\x01" * 16_000, prompt="café, 20% off & more")
        assert transcript.text == "16000 samples" and transcript.audio_seconds == 1.0
        assert engine.prompts == ["café, 20% off & more"]
        answer = await http.post("/v1/transcribe", content=b"\x00\x01")
        assert len(answer.headers["X-Request-Id"]) == 16  # generated when the client sends none
        assert remote.queue_depth == 0
        await remote.close()


async def test_embed_round_trip_and_blocking_variant():
    engine = GatedEmbedder(dimensions=8)
    engine.load()
    async with serving(_app(engine, "embedder")) as url:
        remote = RemoteEmbeddingEngine(url, 8)
        texts = ["How late are you open?", "", "Ünïcode ✓"]
        expected = np.stack([fake_vector(t, 8) for t in texts])
        np.testing.assert_array_equal(await remote.embed(texts), expected)
        np.testing.assert_array_equal(await asyncio.to_thread(remote.embed_blocking, texts), expected)
        assert (await remote.embed([])).shape == (0, 8)
        await remote.close()


async def test_synthesis_streams_whole_samples_at_the_workers_rate():
    engine = ScriptedTTS([b"\x01\x02\x03", b"\x04", b"\x05\x06"])
    async with serving(_app(engine, "tts")) as url, httpx.AsyncClient(base_url=url) as http:
        remote = RemoteTTSEngine(url, sample_rate=8_000)
        chunks = [chunk async for chunk in remote.synthesize("Hello there.")]
        assert b"".join(chunks) == b"\x01\x02\x03\x04\x05\x06"
        assert all(len(chunk) % 2 == 0 for chunk in chunks)
        answer = await http.post("/v1/synthesize", json={"text": "Hi."})
        assert answer.headers["X-Sample-Rate"] == "8000" and answer.headers["content-type"] == "application/octet-stream"
        await remote.close()


async def test_closing_the_tts_stream_early_closes_the_engines_iterator():
    engine = ScriptedTTS([b"\x01\x02"])
    engine.hold.clear()  # after its first chunk the engine would run on and on
    app = _app(engine, "tts")
    async with serving(app) as url:
        remote = RemoteTTSEngine(url, sample_rate=8_000)
        stream = remote.synthesize("A long answer that the caller interrupts.")
        assert await anext(stream) == b"\x01\x02"
        await stream.aclose()  # barge-in
        await asyncio.wait_for(engine.closed.wait(), WAIT_S)
        await until(lambda: app.state.worker.in_flight == 0)
        assert remote.queue_depth == 0
        await remote.close()


async def test_an_engine_failure_is_a_500_and_the_worker_keeps_serving():
    asr = GatedASR()
    async with serving(_app(asr, "asr")) as url, httpx.AsyncClient(base_url=url) as http:
        failed = await http.post("/v1/transcribe", content=asr.fail_on)
        assert failed.status_code == 500 and "the model broke" in failed.json()["error"]
        assert failed.json()["retryable"] is False
        remote = RemoteASREngine(url)
        with pytest.raises(CadenceError) as raised:
            await remote.transcribe(asr.fail_on)
        assert not raised.value.retryable
        assert (await remote.transcribe(b"\x00\x01")).text == "1 samples"
        await remote.close()


async def test_a_stream_that_fails_midway_cuts_the_connection_and_the_client_sees_unavailable():
    engine = ScriptedTTS([b"\x01\x02"])
    engine.fail_after = True
    async with serving(_app(engine, "tts")) as url:
        remote = RemoteTTSEngine(url, sample_rate=8_000)
        received = []
        with pytest.raises(WorkerUnavailableError, match=url):
            async for chunk in remote.synthesize("Hello."):
                received.append(chunk)
        assert received == [b"\x01\x02"]
        await remote.close()


@pytest.mark.parametrize(("role", "engine", "path", "request_kwargs", "status", "words"), [
    ("asr", GatedASR, "/v1/transcribe", {"content": b"\x00\x01\x02"}, 422, "even number of bytes"),
    ("asr", GatedASR, "/v1/transcribe", {"content": b""}, 422, "non-empty"),
    ("asr", GatedASR, "/v1/transcribe", {"content": b"\x00" * 40_000}, 413, "at most 32000"),
    ("asr", GatedASR, "/v1/transcribe", {"content": b"\x00\x01", "params": {"prompt": "x" * 30}}, 413, "prompt"),
    ("asr", GatedASR, "/v1/transcribe", {"content": b"\x00\x01", "headers": {"X-Deadline-Ms": "soon"}}, 422,
     "X-Deadline-Ms"),
    ("embedder", GatedEmbedder, "/v1/embed", {"content": b"{not json"}, 422, "JSON"),
    ("embedder", GatedEmbedder, "/v1/embed", {"json": ["a"]}, 422, "JSON object"),
    ("embedder", GatedEmbedder, "/v1/embed", {"json": {"texts": "a"}}, 422, "texts"),
    ("embedder", GatedEmbedder, "/v1/embed", {"json": {"texts": ["a"] * 5}}, 413, "at most 4"),
    ("embedder", GatedEmbedder, "/v1/embed", {"json": {"texts": ["a", "b" * 50]}}, 413, "texts[1]"),
    ("tts", ScriptedTTS, "/v1/synthesize", {"json": {"text": "  "}}, 422, "non-empty"),
    ("tts", ScriptedTTS, "/v1/synthesize", {"json": {"text": "b" * 50}}, 413, "text is 50"),
    ("tts", ScriptedTTS, "/v1/transcribe", {"content": b"\x00\x01"}, 404, "Not Found"),
])
async def test_bad_input_is_a_4xx_naming_the_problem(role, engine, path, request_kwargs, status, words):
    limits = WorkerLimits(max_audio_seconds=1.0, max_prompt_chars=20, max_texts=4, max_text_chars=40)
    built = engine()
    built.load()
    async with serving(_app(built, role, limits=limits)) as url, httpx.AsyncClient(base_url=url) as http:
        answer = await http.post(path, **request_kwargs)
        assert answer.status_code == status
        assert words in answer.json()["error"] and answer.json()["retryable"] is False
        assert (await http.get("/healthz")).status_code == 200  # and the worker still serves


async def test_a_wrong_method_is_a_405_in_json():
    async with serving(_app(ScriptedTTS(), "tts")) as url, httpx.AsyncClient(base_url=url) as http:
        answer = await http.get("/v1/synthesize")
        assert answer.status_code == 405 and "GET /v1/synthesize" in answer.json()["error"]


# --- a worker that is gone --------------------------------------------------------------------

async def test_a_closed_worker_is_reported_unavailable_within_two_seconds():
    async with serving(_app(GatedASR(), "asr")) as url:
        remote = RemoteASREngine(url, options=RemoteOptions(connect_timeout_s=1.0))
        assert (await remote.transcribe(b"\x00\x01")).text == "1 samples"  # a pooled connection now exists
    async with asyncio.timeout(CLEAR_ERROR_S):
        with pytest.raises(WorkerUnavailableError, match=url):
            await remote.transcribe(b"\x00\x01")
    with pytest.raises(WorkerUnavailableError, match=url):
        await asyncio.to_thread(remote.load)
    await remote.close()


async def test_a_worker_killed_mid_stream_is_reported_unavailable_within_two_seconds():
    sock = _listening_socket()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    child = subprocess.Popen(
        [sys.executable, "-c", f"from tests.fakes_workers import serve_stalling_tts; serve_stalling_tts({sock.fileno()})"],
        cwd=ROOT, pass_fds=[sock.fileno()])
    sock.close()  # the child holds the listening socket now
    remote = RemoteTTSEngine(url, sample_rate=8_000)
    try:
        stream = remote.synthesize("An answer the worker never finishes.")
        async with asyncio.timeout(60):  # the child imports the server first
            assert await anext(stream) == b"\x01\x02"
        os.kill(child.pid, signal.SIGKILL)
        async with asyncio.timeout(CLEAR_ERROR_S):
            with pytest.raises(WorkerUnavailableError, match=url):
                await anext(stream)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=10)
        await remote.close()


# --- the real embedder behind the worker ------------------------------------------------------

@pytest.mark.slow
async def test_the_real_embedder_served_remotely_gives_the_in_process_vectors():
    from models.embedding import EmbeddingOptions, build_embedder

    texts = ["How do I reset my password?", "What time does the pharmacy open on Sundays?", ""]
    local = build_embedder(EmbeddingOptions())
    local.load()
    expected = local.embed_blocking(texts)
    await local.close()
    served = BatchedEmbedder(build_embedder(EmbeddingOptions()))
    app = _app(served, "embedder", loaded=False)
    async with serving(app) as url:
        await asyncio.wait_for(app.state.worker.became_ready.wait(), 120)
        remote = RemoteEmbeddingEngine(url, expected.shape[1])
        await asyncio.to_thread(remote.load)
        together = await asyncio.gather(*(remote.embed([text]) for text in texts))  # merged into batches
        np.testing.assert_allclose(np.concatenate(together), expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(await remote.embed(texts), expected, rtol=1e-5, atol=1e-6)
        await remote.close()


def _words(text: str) -> list[str]:
    return "".join(c for c in text.lower() if c.isalnum() or c.isspace()).split()


@pytest.mark.slow
async def test_whisper_batched_across_calls_hears_what_it_hears_in_process():
    from latency_bench.callers.audio import resample, speak
    from models.whisper_asr import WhisperASREngine, WhisperOptions
    from workers.batched_whisper import BatchedWhisperASR

    def turn(text: str) -> bytes:
        samples, rate = speak(text)
        return resample(samples, rate, 16_000).astype(np.int16).tobytes()

    turns = [turn("What is the capital of France?"), turn("Cancel my order."),
             turn("Please book me a table for four people tomorrow evening at seven.")]
    prompt = "I would like to make a reservation."
    local = WhisperASREngine(WhisperOptions())
    local.load()
    expected = [(await local.transcribe(pcm)).text for pcm in turns]
    expected_with_prompt = (await local.transcribe(turns[2], prompt=prompt)).text
    await local.close()
    # A long timeout: the three turns must meet in one batch, which fires when the third arrives.
    served = BatchedWhisperASR(WhisperOptions(), BatchPolicy(max_batch=3, timeout_s=10.0, max_pending=8))
    app = _app(served, "asr", loaded=False)
    async with serving(app) as url:
        await asyncio.wait_for(app.state.worker.became_ready.wait(), 120)
        remote = RemoteASREngine(url)
        together = await asyncio.gather(*(remote.transcribe(pcm) for pcm in turns))
        assert served.batch_record.recent == (3,)
        # Each turn was encoded on the longest turn's window: the same words, casing aside.
        assert [_words(t.text) for t in together] == [_words(text) for text in expected]
        # A batch of one is the in-process fast path exactly, prompt included.
        alone = await remote.transcribe(turns[2], prompt=prompt)
        assert alone.text == expected_with_prompt
        await remote.close()


# --- the worker's command line --------------------------------------------------------------

def test_serve_worker_takes_its_settings_from_flags_or_the_deployment_file():
    from workers.batched_whisper import BatchedWhisperASR
    from workers.serve_worker import build_engine, parse_args

    args, level = parse_args(["--engine", "minilm-onnx", "--port", "8101", "--max-batch", "4",
                              "--batch-timeout-ms", "3", "--threads", "2", "--log-level", "debug"])
    assert (args.served_role, args.max_batch, args.policy().timeout_s, args.threads, level) == \
        ("embedder", 4, 0.003, 2, "debug")
    planned, _ = parse_args(["--deployment", str(ROOT / "configs/deployments/h200-mig.yaml"), "--worker", "asr",
                             "--port", "8102", "--max-in-flight", "3"])
    assert (planned.engine, planned.model, planned.device, planned.precision) == \
        ("faster-whisper", "large-v3", "cuda", "fp16")
    assert planned.max_in_flight == 3  # a flag overrides the file's max_streams
    engine = build_engine(planned)  # built, not loaded: no weights are read here
    assert isinstance(engine, BatchedWhisperASR) and engine._options.compute_type == "float16"


@pytest.mark.parametrize("argv", [
    ["--engine", "vllm", "--port", "1"],  # not one of ours
    ["--engine", "snac", "--precision", "fp16", "--port", "1"],  # SNAC decodes in fp32
    ["--engine", "piper", "--role", "asr", "--port", "1"],
    ["--deployment", "x.yaml", "--port", "1"],  # without --worker
    ["--port", "1"],
])
def test_serve_worker_refuses_what_it_cannot_serve(argv):
    from workers.serve_worker import parse_args

    with pytest.raises((ConfigError, SystemExit)):
        parse_args(argv)


# --- when an answer is wanted ----------------------------------------------------------------

async def test_when_the_pipeline_wants_an_answer_reaches_the_workers_queue_for_calls_and_streams():
    import time

    from models.scheduling import wanted_in
    from workers.batcher import REQUEST_WANTED_BY

    seen: list[float | None] = []

    class WantedASR(GatedASR):
        async def transcribe(self, pcm16: bytes, *, prompt: str | None = None):
            seen.append(REQUEST_WANTED_BY.get())
            return await super().transcribe(pcm16, prompt=prompt)

    class WantedTTS(ScriptedTTS):
        async def synthesize(self, text: str):
            seen.append(REQUEST_WANTED_BY.get())
            async for chunk in super().synthesize(text):
                yield chunk

    async with serving(_app(WantedASR(), "asr")) as asr_url, serving(_app(WantedTTS(), "tts")) as tts_url:
        asr, tts = RemoteASREngine(asr_url), RemoteTTSEngine(tts_url, sample_rate=8_000)
        try:
            asked_at = time.monotonic()
            with wanted_in(2.0):
                await asr.transcribe(b"\x01\x00" * 160)
                sentence = tts.synthesize("A later sentence.")  # its generator runs outside the block
            audio = b"".join([chunk async for chunk in sentence])
            await asr.transcribe(b"\x01\x00" * 160)  # nothing said: arrival order at the worker
        finally:
            await asr.close()
            await tts.close()
    assert audio and seen[2] is None
    for wanted_by in seen[:2]:
        assert wanted_by is not None and asked_at + 1.8 < wanted_by < asked_at + 2.2
