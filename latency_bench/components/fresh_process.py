"""Measures that need a process of their own, so the memory they read is theirs alone.

A bench module measures one case in `measure_one` and, run as its subcommand with `--one ...`,
prints it as one line of JSON; `run_fresh` runs it so and reads that line back.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path


def status_mb(key: str) -> float:
    """A figure of this process's /proc/self/status in MB (VmRSS, VmHWM). Linux only."""
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{key}:\s+(\d+) kB", text, re.MULTILINE).group(1)) / 1024


def run_fresh(subcommand: str, *args: str) -> dict:
    """`python -m latency_bench SUBCOMMAND --one ARGS...` in a new process: the JSON of its last line of output."""
    child = subprocess.run([sys.executable, "-m", "latency_bench", subcommand, "--one", *args], capture_output=True,
                           text=True, check=True)
    return json.loads(child.stdout.strip().splitlines()[-1])
