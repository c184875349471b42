"""latency_bench against real servers on loopback: Cadence (every transport) and the stock baseline.

What is tested is the bench: its callers on every transport, what they measure, and how
their turns are joined with the server's records. So Cadence's models are fakes on the real
engine interfaces (a scripted ASR and LLM, a sine for a voice; the VAD is real and hears the
callers' spoken questions); the real models on every transport are the e2e tests'
(tests/test_e2e_*.py). The Realtime caller's barge-in runs on the real models: that way in
sends a reply's audio as fast as it is made, so only a reply written at a model's pace is still
being sent when the caller talks over it. The stock baseline runs its real models (`system`: `make test-system`)."""

from __future__ import annotations

import json
import subprocess
import sys

import aioice.ice
import pytest

from latency_bench import servers
from latency_bench.load import runner
from latency_bench.load.runner import Scenario
from pipelines.voice import Engines
from tests.conftest import running_server
from tests.fakes import HashingEmbedder, ScriptedASR, ScriptedLLM, ToneTTS

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture
def fake_server(server_config):
    # A reply of five sentences written over ~2 s, as a model writes it, with ~1 s of audio each:
    # still being sent when a barge-in talks over it (the Realtime way in sends audio as it comes).
    engines = Engines(asr=ScriptedASR("What time do you open on Saturdays?"),
                      llm=ScriptedLLM(["We open at nine. ", "We close at noon on Saturdays. ", "Sundays we rest. ",
                                       "Call us on a weekday. ", "Thank you for calling."], delay_s=0.4),
                      tts=ToneTTS(chunks=10, frequency_hz=440.0), embedder=HashingEmbedder())
    with running_server(server_config, engines) as running:
        yield running


def assert_every_turn_answered_and_joined(level: dict, *, turns: int) -> None:
    assert level["summary"]["errors"] == 0, level["summary"]["error_kinds"]
    assert len(level["turns"]) == turns
    for turn in level["turns"]:
        assert 0 < turn["ttfb_ms"] <= turn["ttfs_ms"] < 10_000
        assert turn["reply_seconds"] > 0.3
        server = turn["server"]
        assert server is not None, f"turn {turn['turn']} of caller {turn['caller']} not found on the server"
        # Same wall clock on both sides: the caller hears the reply just after the server sends it.
        assert -50 < turn["ttfs_ms"] - server["ttfs_ms"] < 500, (turn["ttfs_ms"], server["ttfs_ms"])


async def test_two_phone_callers_are_measured_and_joined_with_the_server_stages(fake_server):
    results = await runner.run(Scenario(url=fake_server.base_url, transport="twilio", turns=2, stagger_s=0.3), [2],
                               progress=False)
    level, = results["levels"]
    assert level["callers"] == 2
    assert_every_turn_answered_and_joined(level, turns=4)
    assert {t["voice"] for t in level["turns"] if t["caller"] == 0} != {t["voice"] for t in level["turns"]
                                                                       if t["caller"] == 1}
    stages = results["summary"]["server_stage_ms"]
    assert stages["asr_final"]["p50"] < stages["llm_first_token"]["p50"] < stages["first_audio_sent"]["p50"]


async def test_a_webrtc_caller_is_measured_and_joined(fake_server, monkeypatch):
    # As in test_e2e_webrtc: both peers gather 127.0.0.1 only, so the call stays on loopback.
    monkeypatch.setattr(aioice.ice, "get_host_addresses", lambda use_ipv4, use_ipv6: ["127.0.0.1"] if use_ipv4 else [])
    results = await runner.run(Scenario(url=fake_server.base_url, transport="webrtc", turns=2), [1], progress=False)
    assert_every_turn_answered_and_joined(results["levels"][0], turns=2)


async def test_a_realtime_caller_is_measured_and_joined_and_its_barge_in_stops_the_reply(server):
    results = await runner.run(Scenario(url=server.base_url, transport="realtime", turns=3, barge_in_every=2), [1],
                               progress=False)
    level, = results["levels"]
    turns = level["turns"]
    assert [t["barged_in"] for t in turns] == [False, True, False]
    assert 0 < turns[1]["barge_in_stop_ms"] < 2000
    for turn in (turns[0], turns[2]):  # joined with the server's record, on the same wall clock
        assert turn["server"] is not None and -50 < turn["ttfs_ms"] - turn["server"]["ttfs_ms"] < 500, turn


async def test_a_barge_in_turn_reports_when_the_reply_stopped(fake_server):
    results = await runner.run(Scenario(url=fake_server.base_url, transport="twilio", turns=3, barge_in_every=2), [1],
                               progress=False)
    turns = results["levels"][0]["turns"]
    assert [t["barged_in"] for t in turns] == [False, True, False]
    assert 0 < turns[1]["barge_in_stop_ms"] < 2000
    assert turns[2]["ttfs_ms"] is not None


def test_the_cli_writes_results_and_plots(fake_server, tmp_path):
    out = tmp_path / "bench"
    done = subprocess.run([sys.executable, "-m", "latency_bench", "run", "--url", fake_server.base_url, "--callers", "1",
                           "--turns", "1", "--out", str(out), "--quiet"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed["all"]["turns"] == 1 and printed["all"]["errors"] == 0
    assert {p.name for p in out.iterdir()} == {"results.json", "ttfs_distribution.png",
                                               "median_turn_waterfall.png", "ttfs_vs_callers.png"}
    stored = json.loads((out / "results.json").read_text())
    assert stored["levels"][0]["turns"][0]["server"]["stage_ms"]["first_audio_sent"] > 0


def test_the_cli_refuses_bad_arguments_with_a_message():
    done = subprocess.run([sys.executable, "-m", "latency_bench", "run", "--url", "http://127.0.0.1:9",
                           "--callers", "0", "--out", "/tmp/x"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--callers, --turns and --runs must be at least 1" in done.stderr


@pytest.mark.system
async def test_the_stock_pipecat_baseline_answers_a_phone_call(tmp_path):
    with servers.stock_pipecat(tmp_path) as url:
        results = await runner.run(Scenario(url=url, transport="twilio", turns=1), [1], progress=False)
    level = results["levels"][0]
    assert level["summary"]["errors"] == 0, level["summary"]["error_kinds"]
    turn, = level["turns"]
    assert 0 < turn["ttfs_ms"] < 15_000 and turn["reply_seconds"] > 0.3
    # The baseline's transcript times (an observer; pipecat keeps no per-turn record itself).
    from latency_bench.stats import final_transcript_ms

    assert turn["server"]["stage_ms"]["asr_final"] > 0 and 0 < final_transcript_ms(turn) < 5_000
