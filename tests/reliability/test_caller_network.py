"""A browser caller's bad network (issue 13, scenarios 10 and 11), the short version of
`chaos lossy blackhole`: a WebRTC caller in a network namespace of its own, on fake engines.

At 10 % loss each way and 256 kbit/s, about 90 % of the caller's audio reaches the ASR (the rest
is what the network lost, no more) and every reply is heard. After 5 s with no network the call
goes on by itself, heard both ways within 2 s; a network gone for good ends the call, stored as
`network_lost`, when ICE consent expires (~30 s), not a zombie holding its slot.

Needs root (namespaces, iptables): CI runs as root, and `make setup` installs iptables there."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from latency_bench.chaos import network as chaos_network, netns
from pipelines.voice import Engines
from tests.conftest import running_server
from tests.fakes import HashingEmbedder, ScriptedASR, ScriptedLLM, ToneTTS
from tests.test_bad_input import server_errors  # noqa: F401 - a fixture

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.system]
if os.geteuid() != 0:
    pytestmark.append(pytest.mark.skip(reason="network namespaces need root; CI runs as root"))

LOSSY_SECONDS = 20.0


@pytest.fixture
def caller_network_server(server_config):
    # A sine, not the constant signal of ToneTTS's default: Opus takes a constant signal out.
    engines = Engines(asr=ScriptedASR("what time do you open"), llm=ScriptedLLM(["We open at nine."]),
                      tts=ToneTTS(chunks=10, frequency_hz=440.0), embedder=HashingEmbedder())
    config = replace(server_config, server=replace(server_config.server, max_concurrent_calls=2))
    with netns.create() as network, running_server(config, engines, host=network.host_ip) as server:
        yield network, server


async def test_a_call_at_ten_percent_loss_and_256_kbits_loses_only_what_the_network_lost(
        caller_network_server, server_errors, tmp_path: Path):
    network, server = caller_network_server
    figures = await chaos_network.run_lossy(network, server.base_url, seconds=LOSSY_SECONDS, out=tmp_path,
                                            profiles=(netns.LinkProfile(loss=0.10, rate_kbit=256),))
    (lossy,) = figures["profiles"]
    assert 0.84 <= lossy["audio_reached"] <= 0.96, lossy  # 10 % lost by the network, no more
    assert lossy["turns"] >= 2 and lossy["answered"] == lossy["turns"], lossy
    assert lossy["call_error"] is None and lossy["end_reason"] == "caller_hung_up", lossy
    assert server_errors == []


async def test_a_short_outage_resumes_by_itself_and_a_lasting_one_ends_the_call_as_network_lost(
        caller_network_server, server_errors, tmp_path: Path):
    network, server = caller_network_server
    figures = await chaos_network.run_blackhole(network, server.base_url, outage_s=5.0, out=tmp_path)
    verdict = chaos_network.judge_blackhole(figures)
    assert verdict.passed, verdict.measured
    assert server_errors == []
