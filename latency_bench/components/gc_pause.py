"""How long a full collection of Python's cyclic garbage collector stalls a loaded server,
before and after the startup objects are frozen (agent/gc_pauses.py).

    python -m latency_bench gc-pause [--config configs/default.yaml] [--repeats 5]

In a fresh process: the server's modules imported, the config's engines built with every model
in this process (the LLM too, where the deployment would run it as a worker: more objects, not
fewer), loaded and warmed, and the app built on them. Then `repeats` full collections are timed,
the startup objects frozen as the server does once loaded, and `repeats` more timed. Printed:
the objects the collector tracks, and the median and longest full collection before and after.
A full collection holds the GIL: for its length the event loop, and every call's audio, waits.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path

from latency_bench.components.fresh_process import run_fresh
from latency_bench.servers import DEFAULT_CONFIG


def _full_collections_ms(repeats: int) -> list[float]:
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        gc.collect()
        timings.append((time.perf_counter() - started) * 1000)
    return timings


def measure_one(config_path: Path, repeats: int) -> dict:
    from agent.app import create_app
    from agent.config import load_config
    from agent.engine_factory import build_engines, load_and_warm
    from agent.gc_pauses import freeze_startup_objects

    config = load_config(config_path)
    engines = build_engines(config)  # no endpoints: every engine in this process
    load_and_warm(engines)
    create_app(config, engines=engines, engines_loaded=True)
    tracked = len(gc.get_objects())
    before = _full_collections_ms(repeats)
    frozen = freeze_startup_objects()
    after = _full_collections_ms(repeats)
    return {"tracked_objects": tracked, "frozen_objects": frozen,
            "before_ms": [round(ms, 1) for ms in before], "after_ms": [round(ms, 1) for ms in after]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m latency_bench gc-pause", description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # the child: JSON out
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure_one(args.config, args.repeats)))
        return 0
    row = run_fresh("gc-pause", "--config", str(args.config), "--repeats", str(args.repeats))
    print(f"objects tracked once loaded: {row['tracked_objects']} ({row['frozen_objects']} frozen)\n"
          "| full collection | median | longest | each |\n|---|---|---|---|")
    for label, key in (("before the freeze", "before_ms"), ("after the freeze", "after_ms")):
        timings = row[key]
        print(f"| {label} | {statistics.median(timings):.1f} ms | {max(timings):.1f} ms | {timings} |")
    return 0
