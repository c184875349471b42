"""What a model worker's process hop costs one request: the same requests in-process and
through a worker on loopback, alternating, on an otherwise idle machine.

    python -m latency_bench hop-bench [--rounds 200] [--json]

- embedder: one short query (what retrieval sends per turn), in-process ONNX against the
  same model in `workers.serve_worker`; the difference is the hop (HTTP, JSON, base64).
- codec: one stream step of one SNAC frame (what an Orpheus stream sends ~12 times a
  second), the in-process decode service against the codec worker (WebSocket), both on
  one thread with the same random-weight SNAC (the decode costs the same with real weights).

Prints p50/p95 of each and of the difference, in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from agent.model_plane import free_port_run
from models.assets import resolve_local
from models.embedding import EmbeddingOptions, build_embedder
from models.orpheus.decode_service import DecodeServiceConfig, SnacDecodeService
from models.orpheus.remote_codec import RemoteSnacCodec
from models.orpheus.snac_decoder import load_snac
from models.remote import RemoteEmbeddingEngine
from workers.binaries import find_binary
from workers.deployment import load_deployment
from workers.placement import plan
from workers.supervisor import WorkerSupervisor

QUERY = "What time does the clinic open on Saturdays?"


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"p50": round(statistics.median(ordered), 2),
            "p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 2), "n": len(ordered)}


async def measure(rounds: int) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="hop-bench-"))
    source = folder / "deployment.yaml"  # our own workers read their entry from the file
    source.write_text(yaml.safe_dump({"name": "hop-bench", "workers": {
        "embedder": {"engine": "minilm-onnx", "run": "process", "model": "package:all-minilm-l6-v2-int8",
                     # max_batch 1: a lone request runs at once, so what is measured is the hop,
                     # not the batcher's wait for company (up to its timeout_ms under load).
                     "threads": 1, "max_streams": 4, "batching": {"max_batch": 1, "timeout_ms": 1}},
        "codec": {"engine": "snac", "run": "process", "model": "random", "threads": 1, "max_streams": 4,
                  "batching": {"max_batch": 16, "timeout_ms": 15}}}}))
    deployment = load_deployment(source)
    placed = plan(deployment, (), find_binary=find_binary, resolve_model=resolve_local, base_port=free_port_run(2))
    urls = {w.spec.role: w.url for w in placed.workers}
    supervisor = WorkerSupervisor(placed.launches, log_dir=folder)
    await supervisor.start()
    local_embedder = build_embedder(EmbeddingOptions(threads=1))
    remote_embedder = RemoteEmbeddingEngine(urls["embedder"], 384)
    local_codec = SnacDecodeService(load_snac(None), DecodeServiceConfig(threads=1))
    remote_codec = await asyncio.to_thread(RemoteSnacCodec(urls["codec"]).load)
    try:
        for engine in (local_embedder, remote_embedder):
            await asyncio.to_thread(engine.load)
            await asyncio.to_thread(engine.warm_up)
        results: dict[str, dict[str, list[float]]] = {"embedder": {"local": [], "remote": []}}
        for _ in range(rounds):  # alternating, so drift in the machine's load hits both alike
            for name, engine in (("local", local_embedder), ("remote", remote_embedder)):
                start = time.perf_counter()
                await engine.embed([QUERY])
                results["embedder"][name].append((time.perf_counter() - start) * 1000)
        results["codec_step"] = await _codec_steps(local_codec, remote_codec, rounds)
    finally:
        for engine in (local_embedder, remote_embedder, local_codec, remote_codec):
            await engine.close()
        await supervisor.stop()
    report = {}
    for stage, runs in results.items():
        hop = [r - l for l, r in zip(runs["local"], runs["remote"])]
        report[stage] = {"in_process_ms": percentiles(runs["local"]), "worker_ms": percentiles(runs["remote"]),
                         "hop_ms": percentiles(hop)}
    return report


async def _codec_steps(local: SnacDecodeService, remote: RemoteSnacCodec, rounds: int) -> dict[str, list[float]]:
    """One open stream on each side, stepped a frame at a time, alternating. With one stream
    open, neither batcher waits for company: what differs is the hop."""
    await local.start()
    local.warm_up()
    frames = np.random.default_rng(0).integers(0, 4096, (rounds, 1, 7))
    streams = {"local": (local, local.open_stream()), "remote": (remote, remote.open_stream())}
    times: dict[str, list[float]] = {"local": [], "remote": []}
    for frame in frames:
        for name, (codec, stream) in streams.items():
            start = time.perf_counter()
            await codec.step(stream, frame)
            times[name].append((time.perf_counter() - start) * 1000)
    for codec, stream in streams.values():
        codec.release(stream)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m latency_bench hop-bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200, help="embedder requests and codec steps each way")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    report = asyncio.run(measure(args.rounds))
    if args.json:
        print(json.dumps(report))
        return 0
    for stage, figures in report.items():
        for what, p in figures.items():
            print(f"{stage:16s} {what:14s} p50 {p['p50']:8.2f} ms   p95 {p['p95']:8.2f} ms   (n={p['n']})")
    return 0
