"""Admission under pressure (issue 13, scenarios 3 and 4), the short versions of
`latency_bench chaos handshake admission`, judged by the bench's own pass figures: sockets
that never finish Twilio's handshake hold no call slot and are closed at
limits.handshake_timeout_seconds; the cap plus 50 callers at once admit exactly the cap and
refuse the rest at once with 1013."""

from __future__ import annotations

from dataclasses import replace

import pytest

from latency_bench.chaos import admission
from pipelines.voice import Engines
from tests.conftest import running_server
from tests.fakes import HashingEmbedder, ScriptedASR, ScriptedLLM, ToneTTS

CAP = 3
HANDSHAKE_TIMEOUT_S = 0.5


@pytest.fixture
def server(server_config):
    config = replace(server_config, server=replace(server_config.server, max_concurrent_calls=CAP),
                     limits=replace(server_config.limits, handshake_timeout_seconds=HANDSHAKE_TIMEOUT_S))
    engines = Engines(asr=ScriptedASR("hi"), llm=ScriptedLLM(["Hello there."]), tts=ToneTTS(),
                      embedder=HashingEmbedder())
    with running_server(config, engines) as running:
        yield running


async def test_sockets_that_never_start_hold_no_slot_and_are_closed_at_the_handshake_timeout(server):
    # More silent sockets than call slots (and than a key's session cap of 10).
    figures = await admission.run_handshake(server.base_url, silent=12, timeout_s=HANDSHAKE_TIMEOUT_S,
                                            slack_s=1.0)
    verdict = admission.judge_handshake(figures)
    assert verdict.passed, verdict.measured
    assert figures["max_close_s"] < HANDSHAKE_TIMEOUT_S + 1.0


@pytest.mark.slow
async def test_the_cap_plus_fifty_callers_admit_exactly_the_cap_and_refuse_the_rest_at_once(server):
    figures = await admission.run_burst(server.base_url, cap=CAP, extra=50)
    verdict = admission.judge_admission(figures)
    assert verdict.passed, verdict.measured
    assert figures["calls_active_at_peak"] == CAP
