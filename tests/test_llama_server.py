"""llama.cpp's own server as the LLM worker: started by the supervisor from a deployment,
serving several calls' replies at once, and coming back after it is killed mid-reply; and
as the LLM of a process with no deployment, started and stopped by its engine."""

import asyncio
import os
import signal
import time

import pytest

from agent.model_plane import free_port_run
from models.assets import resolve_local
from models.base import Sampling
from models.errors import ModelAssetError, WorkerUnavailableError
from models.openai_chat import OpenAIChatLLMEngine, OpenAIChatOptions
from workers.binaries import find_binary
from workers.own_llama_server import LlamaServerOptions, OwnLlamaServerLLMEngine
from workers.deployment import parse_deployment
from workers.placement import plan
from workers.supervisor import SupervisorOptions, WorkerSupervisor

pytestmark = pytest.mark.slow

SLOTS = 3


def _deployment(source: str):
    return parse_deployment({"name": "llm-only", "workers": {"llm": {
        "engine": "llama-server", "run": "process", "model": "package:smollm2-135m-instruct",
        "device": "cpu", "threads": 2, "max_streams": SLOTS, "context_tokens_per_stream": 1024}}}, source)


@pytest.fixture
async def llm_worker(tmp_path):
    assert find_binary("llama-server"), "llama-server is not built: run `make llama-server`"
    placed = plan(_deployment(str(tmp_path / "d.yaml")), (), find_binary=find_binary, resolve_model=resolve_local,
                  base_port=free_port_run(2))
    supervisor = WorkerSupervisor(placed.launches, log_dir=tmp_path / "logs",
                                  options=SupervisorOptions(ready_timeout_s=60, backoff_initial_s=0.2))
    await supervisor.start()
    engine = OpenAIChatLLMEngine(OpenAIChatOptions(base_url=placed.launches[0].base_url,
                                                   default_sampling=Sampling(temperature=0.0)))
    try:
        yield supervisor, engine
    finally:
        await engine.close()
        await supervisor.stop()


async def _timed_reply(engine, question: str, start: float) -> list[float]:
    messages = [{"role": "system", "content": "Answer in one long sentence."}, {"role": "user", "content": question}]
    return [time.perf_counter() - start async for piece in engine.stream_chat(messages, max_tokens=32) if piece]


async def test_several_slots_generate_side_by_side(llm_worker):
    _, engine = llm_worker
    start = time.perf_counter()
    questions = ["What is the capital of France?", "Name three fruits.", "Why is the sky blue?"]
    stamps = await asyncio.gather(*(_timed_reply(engine, q, start) for q in questions))
    assert all(len(s) >= 4 for s in stamps), [len(s) for s in stamps]
    # Continuous batching: every reply's first piece comes before every other reply's last,
    # which one-at-a-time generation cannot do for three replies.
    assert max(s[0] for s in stamps) < min(s[-1] for s in stamps), stamps
    assert engine.batch_size is not None and engine.batch_size >= 2


async def test_a_request_sent_the_instant_a_streamed_reply_ends_is_answered(llm_worker):
    """llama-server closes its connection after each streamed reply, and a request that goes
    out on it in that instant (a turn right after its prefix's warm-up) met the close: 9 of 40
    failed so before the engine sent such a request again on a fresh connection."""
    _, engine = llm_worker
    for n in range(20):
        messages = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": f"Say {n}."}]
        await engine.warm_prefix(messages)
        assert [piece async for piece in engine.stream_chat(messages, max_tokens=2)], n


async def test_a_long_prompt_is_read_with_a_report_after_each_batch(llm_worker):
    """The proof of life the stall watch restarts its deadline on (models/stalls.py): on a CPU the
    server reads 512 prompt tokens a step (workers/launch.py) and reports after each."""
    _, engine = llm_worker
    words = "The clinic opens at nine and closes at five on weekdays; parking is behind the building. "
    messages = [{"role": "system", "content": (words * 40)[:3500]}, {"role": "user", "content": "When do you open?"}]
    pieces = [piece async for piece in engine.stream_chat(messages, max_tokens=4)]
    first_text = next(i for i, piece in enumerate(pieces) if piece)
    assert first_text >= 3 and set(pieces[:first_text]) == {""}, pieces  # started, 512 read, all ~750 read


async def test_a_killed_worker_fails_its_reply_fast_and_is_back_soon(llm_worker):
    supervisor, engine = llm_worker
    worker = supervisor.workers[0]
    messages = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]
    reply = engine.stream_chat(messages, max_tokens=200, sampling=Sampling(temperature=0.7))
    await reply.__anext__()
    os.kill(worker.process.pid, signal.SIGKILL)
    killed_at = time.perf_counter()
    with pytest.raises(WorkerUnavailableError, match="LLM server at"):
        async for _ in reply:
            pass
    assert time.perf_counter() - killed_at < 2.0
    with pytest.raises(WorkerUnavailableError):  # while it is down: refused at once, not a hang
        await asyncio.wait_for(_timed_reply(engine, "hi", time.perf_counter()), 2.0)
    deadline = time.perf_counter() + 30
    while not (worker.ready and worker.restarts == 1):
        assert time.perf_counter() < deadline, "the worker did not come back within 30 s"
        await asyncio.sleep(0.1)
    assert await _timed_reply(engine, "What is two plus two?", time.perf_counter())


# The LLM without a deployment: a llama-server of the engine's own (workers/own_llama_server.py).


async def test_an_engine_of_its_own_starts_its_server_replies_and_leaves_no_process(tmp_path):
    engine = OwnLlamaServerLLMEngine(LlamaServerOptions(context_tokens=1024, slots=1))
    await asyncio.to_thread(engine.load)
    pid = engine._process.pid
    try:
        pieces = [piece async for piece in engine.stream_chat(
            [{"role": "user", "content": "Say hello."}], max_tokens=8, sampling=Sampling(temperature=0.0))]
        assert "".join(pieces).strip(), pieces
        assert engine.reports_prompt_progress and engine.context_tokens == 1024
    finally:
        await engine.close()
    assert engine.base_url is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # gone, and reaped
    await engine.close()  # idempotent


def test_an_engine_whose_server_cannot_start_says_why(tmp_path, monkeypatch):
    failing = tmp_path / "llama-server"
    failing.write_text("#!/bin/sh\necho 'error: unable to load model' >&2\nexit 3\n")
    failing.chmod(0o755)
    monkeypatch.setenv("CADENCE_LLAMA_SERVER", str(failing))
    engine = OwnLlamaServerLLMEngine(LlamaServerOptions())
    with pytest.raises(WorkerUnavailableError, match="exited with 3 .*unable to load model"):
        engine.load()


def test_an_engine_given_no_such_model_names_the_reference():
    with pytest.raises(ModelAssetError, match="no-such.gguf"):
        OwnLlamaServerLLMEngine(LlamaServerOptions(model="/nowhere/no-such.gguf")).load()
