"""Callers who vanish (issue 13, scenario 5), the short version of `latency_bench chaos
vanishing` on fake engines, judged by the bench's own pass figure: connect, start and vanish,
half of them mid-greeting and half dropping TCP without a close; the server's memory, open
files and threads come back, and every call is stored as ended."""

from __future__ import annotations

from dataclasses import replace

import pytest

from latency_bench.chaos import vanishing
from pipelines.voice import Engines
from tests.conftest import running_server
from tests.fakes import HashingEmbedder, ScriptedASR, ScriptedLLM, ToneTTS


@pytest.fixture
def server(server_config):
    config = replace(server_config, server=replace(server_config.server, max_concurrent_calls=4))
    engines = Engines(asr=ScriptedASR("hi"), llm=ScriptedLLM(["Hello there."]), tts=ToneTTS(),
                      embedder=HashingEmbedder())
    with running_server(config, engines) as running:
        yield running


@pytest.mark.slow
async def test_vanishing_callers_leave_nothing_behind(server):
    figures = await vanishing.run(server.base_url, cycles=60, warmup=20)
    verdict = vanishing.judge(figures)
    assert verdict.passed, verdict.measured
    assert figures["mid_reply_cycles_that_heard_audio"] == 30  # half left while the greeting played
    assert set(figures["end_reasons"]) == {"caller_hung_up"}
