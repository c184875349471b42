"""The CPU voice can give back what a long sentence needed (issue 13: found by the 1-caller soak,
where one run-on reply sentence stepped the server's memory up for good): `tts.cpu_mem_arena:
false`. Each memory check runs the bench's measure in a fresh process, as
`python -m latency_bench tts-memory` does."""

from __future__ import annotations

import json
import subprocess
import sys

from dataclasses import replace

import pytest

from agent.config import load_config
from models.piper_tts import PiperTTSEngine
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow


def test_the_voices_arena_is_the_configs_choice():
    tts = load_config(REPO_ROOT / "configs" / "default.yaml").tts
    for arena in (True, False):
        engine = PiperTTSEngine(replace(tts, cpu_mem_arena=arena))
        engine.load()
        assert engine._voice.session.get_session_options().enable_cpu_mem_arena is arena


def measured(arena: str) -> dict:
    child = subprocess.run([sys.executable, "-m", "latency_bench", "tts-memory", "--one", arena, "--repeats", "1"],
                           cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=True)
    return json.loads(child.stdout.strip().splitlines()[-1])


def test_without_the_arena_a_long_sentence_leaves_the_voice_no_bigger_than_short_ones_did():
    row = measured("off")
    # With the arena on and the sentence said in one run, it left +307 MB for good (the bench, both
    # modes side by side); without the arena, what is left is the heap's noise.
    assert row["after_short_again_mb"] < 60, row
    assert row["cpu_ms_long_sentence"] > row["cpu_ms_per_short_sentence"] > 0, row  # it did speak


def test_with_the_arena_the_loaded_voice_already_holds_what_a_run_on_sentence_needs():
    """The warm-up says a run as long as tts.max_run_chars, so a long reply sentence later is no
    step in a call's memory: +115 MB when the warm-up said "Hello.", +14 to +48 MB when it said
    a run of everyday words, +0.6 MB with long words (python -m latency_bench tts-memory)."""
    row = measured("on")
    assert row["after_long_mb"] < 20, row
    assert row["cpu_ms_long_sentence"] > row["cpu_ms_per_short_sentence"] > 0, row
