"""What one transcription costs the process in memory, by the length of the window Whisper encodes.

    python -m latency_bench asr-workspace [--seconds 5 15 30] [--config configs/default.yaml]

Each length runs in a fresh process: the config's Whisper loaded and warmed up, then one
transcription of the endless caller's monologue (latency_bench/chaos/endless.py) cut to that
length. Printed per length: resident memory before, the process's peak during the
transcription (VmHWM, reset just before it), and what is left after. The peak over "before"
is the engine's workspace for that window: it exists while one window is encoded, whichever
call it belongs to, and an engine encodes one window at a time (models/runner.py). It is the
model's, not a call's: a long turn cut at 30 s meets it at every cut (chaos endless's peaks).
Linux only (/proc/self/status).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from agent.config import load_config
from agent.engine_factory import build_asr
from latency_bench.callers.audio import resample
from latency_bench.chaos.endless import monologue
from latency_bench.components.fresh_process import run_fresh, status_mb
from latency_bench.servers import DEFAULT_CONFIG

ASR_RATE = 16000


def measure_one(seconds: float, config: Path) -> dict:
    """In this process: the engine loaded and warm, then one `seconds` window transcribed."""
    engine = build_asr(load_config(config))
    engine.load()
    engine.warm_up()
    audio, rate, _ = monologue(seconds)
    pcm16 = resample(audio, rate, ASR_RATE).astype("int16").tobytes()
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM back to the current RSS
    before = status_mb("VmRSS")
    transcript = asyncio.run(engine.transcribe(pcm16))
    peak, after = status_mb("VmHWM"), status_mb("VmRSS")
    return {"window_s": seconds, "rss_before_mb": round(before, 1), "peak_mb": round(peak, 1),
            "workspace_mb": round(peak - before, 1), "kept_mb": round(after - before, 1),
            "words": len(transcript.text.split())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m latency_bench asr-workspace", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, nargs="+", default=[5.0, 15.0, 30.0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # the child: one length, JSON out
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure_one(args.seconds[0], args.config)))
        return 0
    print("| window | RSS before | peak | workspace | kept after | words |\n|---|---|---|---|---|---|")
    for seconds in args.seconds:
        row = run_fresh("asr-workspace", "--seconds", str(seconds), "--config", str(args.config))
        print(f"| {row['window_s']:g} s | {row['rss_before_mb']} MB | {row['peak_mb']} MB | +{row['workspace_mb']} MB "
              f"| +{row['kept_mb']} MB | {row['words']} |")
    return 0
