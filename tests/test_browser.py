"""The call page and the dashboard in a real headless Chromium, against the real server and models.

Chromium's fake microphone plays an espeak-ng question from a wav file; the node script
(tests/browser/call_and_dashboard.mjs, Playwright's playwright-core driving Debian's
/usr/bin/chromium) calls the agent, waits for reply audio, watches the turn arrive on a
dashboard opened beforehand, hangs up and reloads the dashboard. Screenshots of both
pages are left in test-artifacts/browser/.

As in test_e2e_webrtc.py, aioice is pinned to 127.0.0.1 (it never offers loopback by
itself); Chromium gathers loopback candidates with --allow-loopback-in-peer-connection,
so the call stays on this machine whatever its other interfaces.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import aioice.ice
import httpx
import numpy as np
import pytest

from latency_bench.callers.audio import resample, speak, write_wav
from tests.call_checks import assert_answered_capital_question
from tests.conftest import REPO_ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

QUESTION = "Hello. What is the capital of France?"
CHROMIUM = Path("/usr/bin/chromium")
HARNESS = REPO_ROOT / "tests" / "browser"
ARTIFACTS = REPO_ROOT / "test-artifacts" / "browser"
WAV_RATE = 48_000  # Chromium's capture rate: the fake device then needs no resampling
# The fake microphone starts with the page's getUserMedia, before ICE and DTLS are up; the
# question starts after this much silence so none of it is lost to call setup.
LEAD_SILENCE_S = 4.0
TRAIL_SILENCE_S = 1.0
SCRIPT_TIMEOUT_S = 180


@pytest.fixture(autouse=True)
def loopback_ice_only(monkeypatch):
    monkeypatch.setattr(aioice.ice, "get_host_addresses",
                        lambda use_ipv4, use_ipv6: ["127.0.0.1"] if use_ipv4 else [])


def browser_tools() -> str:
    """The node binary; fails (never skips) with what is missing and how to install it."""
    node = shutil.which("node")
    missing = [what for what, ok in (
        ("Debian chromium (/usr/bin/chromium)", CHROMIUM.exists()),
        ("node", node is not None),
        ("playwright-core in tests/browser/node_modules (npm ci)", (HARNESS / "node_modules" / "playwright-core").is_dir()),
    ) if not ok]
    if missing:
        pytest.fail(f"browser test needs {', '.join(missing)}; `make setup` installs them")
    return node  # type: ignore[return-value]


def question_wav(path: Path) -> Path:
    samples, rate = speak(QUESTION)
    speech = resample(samples, rate, WAV_RATE)
    silence = lambda seconds: np.zeros(int(WAV_RATE * seconds), dtype=np.int16)  # noqa: E731
    write_wav(path, np.concatenate([silence(LEAD_SILENCE_S), speech, silence(TRAIL_SILENCE_S)]), WAV_RATE)
    return path


@pytest.fixture
def partials_server(server_config, embedded_engines):
    """The real server with streaming partials on, so the call page has words to show live."""
    from dataclasses import replace

    from tests.conftest import running_server

    config = replace(server_config, asr=replace(server_config.asr, partial_every_s=0.5))
    with running_server(config, embedded_engines) as running:
        yield running


def test_a_browser_call_is_answered_and_its_turn_shows_on_the_dashboard(partials_server, tmp_path):
    server = partials_server
    node = browser_tools()
    wav = question_wav(tmp_path / "question.wav")
    if ARTIFACTS.exists():
        shutil.rmtree(ARTIFACTS)
    run = subprocess.run(
        [node, str(HARNESS / "call_and_dashboard.mjs"), "--base-url", server.base_url, "--wav", str(wav),
         "--out", str(ARTIFACTS), "--chromium", str(CHROMIUM)],
        cwd=HARNESS, capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S,
    )
    assert run.returncode == 0, f"browser script failed:\n{run.stderr}\n{run.stdout}"
    seen = json.loads(run.stdout.strip().splitlines()[-1])

    with httpx.Client(base_url=server.base_url) as http:
        call = http.get(f"/api/calls/{seen['call_id']}").json()
    assert call["transport"] == "webrtc" and not call["live"]
    # While the caller spoke, the page showed some of their words (partial transcripts).
    shown = " ".join(seen["hearing"]).lower()
    assert {"capital", "france", "hello"} & set(re.findall(r"[a-z']+", shown)), seen["hearing"]
    assert_answered_capital_question(call)
    stored_ttfs = call["turns"][0]["ttfs_ms"]
    # The dashboard showed this call's first turn with the stored TTFS, live and after a reload.
    assert seen["live_row"]["ttfs_ms"] == pytest.approx(stored_ttfs, abs=0.1)
    assert seen["stored_row"]["ttfs_ms"] == pytest.approx(stored_ttfs, abs=0.1)
    assert f"{math.floor(stored_ttfs + 0.5)}" in seen["stored_row"]["text"]  # the page's Math.round: halves up
    # The default agent has knowledge: its turns have a retrieval stage.
    assert seen["segments"] == ["asr_final", "retrieval", "llm_first_token", "first_sentence", "tts_first_audio", "first_audio_sent"]
    assert seen["dashboard_p50"].endswith(" ms")
    for shot in seen["screenshots"]:
        assert Path(shot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{shot} is not a PNG"
