"""What the CPU voice (Piper) keeps in memory after a long sentence, with ONNX Runtime's CPU
arena on and off, and how soon the long sentence's first audio comes.

    python -m latency_bench tts-memory [--config configs/default.yaml] [--repeats 3] [--max-run-chars N]

Each mode runs in a fresh process: the config's Piper voice loaded and warmed up as the server
does it (with the arena, on a run as long as `max_run_chars`), short sentences said until its
memory settles, then one run-on sentence of ~55 words (the kind a small LLM writes as one
sentence, up to max_reply_tokens), then the short sentences again. Printed per mode: resident
memory after the short sentences, after the long one and after the short ones again, and the
CPU seconds per short sentence (the median over `repeats` rounds). What the arena gains after
the long sentence stays for the life of the process, on top of what the loaded voice showed:
the step an operator's memory graph would show mid-call. Linux only (/proc/self/status).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from dataclasses import replace
from pathlib import Path

from agent.config import load_config
from latency_bench.components.fresh_process import run_fresh, status_mb
from latency_bench.servers import DEFAULT_CONFIG
from models.piper_tts import PiperTTSEngine

SHORT = ("We open at nine on Saturday.", "Parking is free behind the building.",
         "Yes, walk-in patients are seen until ten.")
# 55 words, one sentence: what a 135M model writes when asked for one (a reply of 64 tokens).
LONG = ("The name is not available to the public without a valid certificate of authenticity and all other "
        "information about it must be verified by a certified copy of the certificate issued by the "
        "International Association of Medical and Dental Associations and everything else that the clinic "
        "keeps on file for its patients")


def measure_one(config: Path, arena: bool, repeats: int, max_run_chars: int | None = None) -> dict:
    cadence = load_config(config)
    tts = replace(cadence.tts, cpu_mem_arena=arena,
                  max_run_chars=cadence.tts.max_run_chars if max_run_chars is None else max_run_chars)
    engine = PiperTTSEngine(tts)
    engine.load()
    engine.warm_up()
    first_audio_s = 0.0

    def say(text: str) -> float:
        nonlocal first_audio_s
        started, started_wall = time.process_time(), time.perf_counter()
        for index, _ in enumerate(engine._synthesize_blocking(text, threading.Event())):
            if index == 0:
                first_audio_s = time.perf_counter() - started_wall
        return time.process_time() - started

    for text in SHORT * 3:  # until the arena (or the heap) has what short sentences need
        say(text)
    cpu = [statistics.mean(say(text) for text in SHORT) for _ in range(repeats)]
    before = status_mb("VmRSS")
    long_cpu = say(LONG)
    long_first_audio_s = first_audio_s
    after_long = status_mb("VmRSS")
    for text in SHORT * 3:
        say(text)
    after_short = status_mb("VmRSS")
    return {"arena": arena, "rss_mb": round(before, 1), "after_long_mb": round(after_long - before, 1),
            "after_short_again_mb": round(after_short - before, 1),
            "cpu_ms_per_short_sentence": round(statistics.median(cpu) * 1000), "cpu_ms_long_sentence": round(long_cpu * 1000),
            "first_audio_ms_long_sentence": round(long_first_audio_s * 1000), "max_run_chars": tts.max_run_chars}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m latency_bench tts-memory", description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-run-chars", type=int, help="tts.max_run_chars for both modes (default: the config's)")
    parser.add_argument("--one", choices=["on", "off"], help=argparse.SUPPRESS)  # the child: one mode, JSON out
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure_one(args.config, args.one == "on", args.repeats, args.max_run_chars)))
        return 0
    print(f"The long sentence: {len(LONG)} characters.\n"
          "| CPU arena | longest run | RSS | after the long sentence | after short ones again | CPU per short sentence "
          "| CPU, long sentence | first audio, long sentence |\n|---|---|---|---|---|---|---|---|")
    run_chars = () if args.max_run_chars is None else ("--max-run-chars", str(args.max_run_chars))
    for mode in ("on", "off"):
        row = run_fresh("tts-memory", mode, "--config", str(args.config), "--repeats", str(args.repeats),
                        *run_chars)
        print(f"| {mode} | {row['max_run_chars']} chars | {row['rss_mb']} MB | {row['after_long_mb']:+} MB "
              f"| {row['after_short_again_mb']:+} MB | {row['cpu_ms_per_short_sentence']} ms "
              f"| {row['cpu_ms_long_sentence']} ms | {row['first_audio_ms_long_sentence']} ms |")
    return 0
