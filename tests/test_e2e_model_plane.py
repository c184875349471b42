"""Calls through the model plane: the server starts its deployment's workers as child
processes (llama-server for the LLM), talks to them over loopback, and survives one dying."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from agent.config import StoreConfig
from latency_bench.callers import twilio_caller
from latency_bench.callers.audio import speak
from latency_bench.callers.conversation import PlannedTurn
from pipelines.llm import FALLBACK_REPLY
from tests.call_checks import assert_answered_capital_question, wait_until_ended
from tests.conftest import REPO_ROOT, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

QUESTION = "Hello. What is the capital of France?"


def spoken(text: str, pause_before_s: float = 0.6) -> PlannedTurn:
    samples, rate = speak(text)
    return PlannedTurn.of(samples, rate, text, pause_before_s=pause_before_s)


@pytest.fixture
def plane_config(default_config, tmp_path: Path):
    return replace(default_config, store=StoreConfig(path=str(tmp_path / "calls.sqlite3")),
                   deployment=str(REPO_ROOT / "configs" / "deployments" / "cpu.yaml"))


async def test_a_call_is_answered_by_the_llm_worker_the_server_started(plane_config):
    with running_server(plane_config, None, ready_timeout_s=180) as server:
        plane = server.app.state.model_plane
        assert [w.launch.engine for w in plane.supervisor.workers] == ["llama-server"]
        result = await twilio_caller.call(f"{server.ws_url}/ws/twilio", [spoken(QUESTION)])
        turn, = result.turns
        assert turn.error is None and turn.first_audible_at is not None
        async with httpx.AsyncClient(base_url=server.base_url) as http:
            call_id = (await http.get("/api/calls")).json()["calls"][0]["id"]
            assert_answered_capital_question(await wait_until_ended(http, call_id))
        llm_pid = plane.supervisor.workers[0].process.pid
    with pytest.raises(ProcessLookupError):  # stopped with the server
        os.kill(llm_pid, 0)


async def test_a_call_runs_through_every_model_in_a_worker_process(plane_config):
    config = replace(plane_config, deployment=str(REPO_ROOT / "configs" / "deployments" / "cpu-workers.yaml"))
    with running_server(config, None, ready_timeout_s=240) as server:
        workers = server.app.state.model_plane.supervisor.workers
        assert sorted(w.launch.role for w in workers) == ["asr", "embedder", "llm", "tts"]
        engines = server.app.state.engines
        assert {type(e).__name__ for e in (engines.asr, engines.llm, engines.tts, engines.embedder)} == {
            "FallbackASREngine", "OpenAIChatLLMEngine", "FallbackTTSEngine", "RemoteEmbeddingEngine"}
        # The Whisper and the CPU voice here cover their workers' failures.
        assert type(engines.asr._primary).__name__ == "RemoteASREngine"
        assert type(engines.tts._primary).__name__ == "RemoteTTSEngine"
        assert type(engines.turn_end).__name__ == "SmartTurnEngine"  # ~40 ms on one core: stays in-process
        result = await twilio_caller.call(f"{server.ws_url}/ws/twilio", [spoken(QUESTION)])
        turn, = result.turns
        assert turn.error is None and turn.first_audible_at is not None
        assert turn.reply_audio_seconds > 0.5
        async with httpx.AsyncClient(base_url=server.base_url) as http:
            call_id = (await http.get("/api/calls")).json()["calls"][0]["id"]
            assert_answered_capital_question(await wait_until_ended(http, call_id))
        # The ASR worker killed while it transcribes the next turn: the in-process Whisper
        # transcribes it (and the turns after it, until the worker is back): a real answer.
        asr_worker = next(w for w in workers if w.launch.role == "asr")

        async def kill_when_transcribing() -> None:
            while engines.asr.queue_depth == 0:
                await asyncio.sleep(0.005)
            os.kill(asr_worker.process.pid, signal.SIGKILL)

        killer = asyncio.create_task(kill_when_transcribing())
        result = await twilio_caller.call(f"{server.ws_url}/ws/twilio", [spoken(QUESTION)])
        await asyncio.wait_for(killer, 1)
        turn, = result.turns
        assert turn.error is None and turn.first_audible_at is not None
        assert engines.asr.fallbacks >= 1
        async with httpx.AsyncClient(base_url=server.base_url) as http:
            call_id = (await http.get("/api/calls")).json()["calls"][0]["id"]
            assert_answered_capital_question(await wait_until_ended(http, call_id))  # not an apology
        pids = [w.process.pid for w in workers]
    for pid in pids:  # every worker stopped with the server
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


async def test_a_call_hears_a_fallback_when_the_llm_worker_dies_and_goes_on_once_it_is_back(plane_config):
    with running_server(plane_config, None, ready_timeout_s=180) as server:
        worker = server.app.state.model_plane.supervisor.workers[0]
        llm = server.app.state.engines.llm
        killed_at: list[float] = []

        async def requests_open(opened: bool) -> None:
            while (llm.queue_depth > 0) != opened:
                await asyncio.sleep(0.005)

        async def kill_when_the_reply_starts() -> None:
            await requests_open(True)  # the LLM's first request: the agent's prompt, read as the call starts
            await requests_open(False)
            await requests_open(True)  # the reply
            os.kill(worker.process.pid, signal.SIGKILL)
            killed_at.append(time.monotonic())

        killer = asyncio.create_task(kill_when_the_reply_starts())
        # The second question comes after the fallback was heard and a pause of 3 s, by
        # which the supervisor has the worker back (backoff 0.5 s + load ~0.5 s).
        plan = [spoken(QUESTION), spoken(QUESTION, pause_before_s=3.0)]
        result = await twilio_caller.call(f"{server.ws_url}/ws/twilio", plan)
        await asyncio.wait_for(killer, 1)
        first, second = result.turns
        assert first.error is None and first.first_audible_at is not None, "no fallback was heard"
        assert second.error is None and second.first_audible_at is not None, "the call did not go on"
        async with httpx.AsyncClient(base_url=server.base_url) as http:
            call_id = (await http.get("/api/calls")).json()["calls"][0]["id"]
            call = await wait_until_ended(http, call_id)
        stored = [t["reply_text"] for t in call["turns"]]
        assert stored[0].strip() == FALLBACK_REPLY, stored
        assert stored[1] and FALLBACK_REPLY not in stored[1], stored
        assert call["turns"][0]["ttfs_ms"] < 4000, "the fallback took too long to be heard"
        assert worker.restarts == 1 and worker.ready
