"""Soak (issue 13, scenario 6), the short version of `chaos soak`: two phone callers talk
without a break for three minutes, one call each, one caller's clock 0.1 % fast (its frames
come every 19.98 ms and it plays reply audio that much faster). Every turn is answered, no
reply has a hole, the fast caller's audio is never refused as running ahead, and nothing is
logged as an error. Memory and lag drift are the bench's figures (`chaos soak --minutes 60`):
in a test process shared with the rest of the suite they would measure the suite."""

from __future__ import annotations

import re
from dataclasses import replace

import httpx
import pytest

from latency_bench.chaos import soak
from pipelines.voice import Engines
from tests.conftest import running_server
from tests.fakes import HashingEmbedder, ScriptedASR, ScriptedLLM, ToneTTS
from tests.test_bad_input import server_errors  # noqa: F401 - a fixture

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.system]

MINUTES = 3.0


async def test_two_callers_one_with_a_fast_clock_are_held_for_three_minutes(server_config, server_errors):
    engines = Engines(asr=ScriptedASR("what time do you open"), llm=ScriptedLLM(["We open at nine."]),
                      tts=ToneTTS(chunks=20), embedder=HashingEmbedder())
    config = replace(server_config, server=replace(server_config.server, max_concurrent_calls=2))
    with running_server(config, engines) as server:
        figures = await soak.run(server.base_url, minutes=MINUTES, warmup_minutes=0.5, sample_every_s=10)
        async with httpx.AsyncClient(base_url=server.base_url) as http:
            metrics = (await http.get("/metrics")).text
    for caller in figures["callers"]:
        assert caller["turns"] >= 15, figures  # a turn every ~6-8 s
        assert caller["answered"] == caller["turns"] and not caller["errors"], figures["callers"]
        assert caller["underruns"] == 0 and caller["call_error"] is None, figures
    assert figures["callers"][1]["clock_rate"] == 1 + soak.SKEW
    assert not re.search(r'^cadence_bad_input_total\{[^}]*\} [1-9]', metrics, re.MULTILINE), "audio refused"
    assert len(figures["rss_samples"]) >= 10 and figures["rss_growth_mb_per_10_min"] is not None
    assert server_errors == []


def test_growth_is_the_slope_of_all_samples_not_two_end_points():
    flat_with_noise = [(0, 100.0), (60, 103.0), (120, 100.0), (180, 103.0), (240, 100.0)]
    assert abs(soak.growth_mb_per_10_min(flat_with_noise)) < 3.0
    assert soak.growth_mb_per_10_min([(0, 100.0), (300, 101.0), (600, 102.0)]) == pytest.approx(2.0)
    assert soak.growth_mb_per_10_min([(0, 1.0), (1, 2.0)]) is None


def test_the_last_caller_has_the_fast_clock_whatever_the_count():
    assert soak.clock_rates(2, 0.001) == [1.0, 1.001]
    assert soak.clock_rates(1, 0.001) == [1.001]  # a soak at one caller still tests the skew
    with pytest.raises(ValueError, match="at least one caller"):
        soak.clock_rates(0, 0.001)


def test_the_verdict_names_the_caller_count_and_fails_on_drift():
    caller = {"clock_rate": 1.001, "turns": 40, "answered": 40, "underruns": 0, "call_error": None,
              "first_p50_ms": 1000.0, "last_p50_ms": 1020.0, "drift_ms": 20.0}
    figures = {"minutes": 60, "warmup_minutes": 10, "rss_samples": [(600, 900.0)] * 3,
               "rss_growth_mb_per_10_min": 0.5, "callers": [caller]}
    verdict = soak.judge(figures)
    assert verdict.passed and verdict.pass_figure.startswith("1 caller talking for 60 min, one clock 0.1 % fast")
    drifted = dict(figures, callers=[dict(caller, last_p50_ms=1080.0, drift_ms=80.0)])
    assert not soak.judge(drifted).passed
