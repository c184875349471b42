"""The bench's measure of what one Whisper window costs in memory (latency_bench.components.asr_workspace),
short: a 3 s window on the default config's Whisper, in a child process as the bench runs it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow


def test_one_window_is_measured_in_a_fresh_process_with_its_peak_and_what_it_left():
    child = subprocess.run([sys.executable, "-m", "latency_bench", "asr-workspace", "--one", "--seconds", "3"],
                           cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=True)
    row = json.loads(child.stdout.strip().splitlines()[-1])
    assert row["window_s"] == 3.0 and row["words"] >= 5, row  # the monologue was heard
    assert row["rss_before_mb"] > 100  # a loaded Whisper, not an empty process
    assert row["peak_mb"] >= row["rss_before_mb"] and row["workspace_mb"] == pytest.approx(
        row["peak_mb"] - row["rss_before_mb"], abs=0.11)
