"""What a live call costs in memory, the short version of `latency_bench chaos call-memory`
on fake engines: the bench holds every call live past its first reply while it reads the
server's memory, and the calls end cleanly after."""

from __future__ import annotations

from dataclasses import replace

import pytest

from latency_bench.chaos import call_memory
from pipelines.voice import Engines
from tests.conftest import running_server
from tests.fakes import HashingEmbedder, ScriptedASR, ScriptedLLM, ToneTTS


@pytest.fixture
def server(server_config):
    config = replace(server_config, server=replace(server_config.server, max_concurrent_calls=3))
    engines = Engines(asr=ScriptedASR("what time do you open"), llm=ScriptedLLM(["We open at nine."]), tts=ToneTTS(),
                      embedder=HashingEmbedder())
    with running_server(config, engines) as running:
        yield running


@pytest.mark.slow
async def test_every_call_is_live_and_answered_while_its_memory_is_read(server):
    figures = await call_memory.run(server.base_url, calls=3, hold_s=8.0)
    verdict = call_memory.judge(figures)
    assert figures["live_when_measured"] == 3 and figures["errors"] == [], figures
    assert len(figures["held_rss_mb"]) == call_memory.HELD_SAMPLES
    assert verdict.passed, verdict.measured  # fake engines: a call is its pipeline and buffers
