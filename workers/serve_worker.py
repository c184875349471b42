"""`python -m workers.serve_worker`: one of Cadence's own model workers, as a process.

Either every setting as a flag:

    python -m workers.serve_worker --engine faster-whisper --model package:whisper-base \
        --port 8101 --max-in-flight 16 --max-batch 8 --batch-timeout-ms 10 --threads 2

or the deployment file and the worker's key, as workers/launch.py starts it (flags given as
well override the file):

    python -m workers.serve_worker --deployment configs/deployments/h200-mig.yaml --worker asr --port 8101

The device comes from the environment the supervisor sets (CUDA_VISIBLE_DEVICES pins one
GPU or MIG slice): `--device cuda` uses whatever CUDA shows this process.
Engines: faster-whisper (asr, batched across calls), minilm-onnx (embedder, batched),
piper (tts, one synthesis at a time: Piper has no batch path), snac (codec: Orpheus' codes
to audio, every stream's steps batched; --model random gives random weights of the real
architecture, for tests).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

from models.base import Engine
from models.errors import ConfigError
from workers.batcher import BatchPolicy

ENGINE_ROLES = {"faster-whisper": "asr", "minilm-onnx": "embedder", "piper": "tts", "snac": "codec"}
# CTranslate2 compute types for the deployment's weight precision, on CPU and on CUDA.
_WHISPER_COMPUTE = {"int8": ("int8", "int8_float16"), "fp16": ("float32", "float16"),
                    "bf16": ("float32", "bfloat16"), "fp32": ("float32", "float32")}


@dataclass(frozen=True)
class WorkerArgs:
    engine: str  # faster-whisper | minilm-onnx | piper
    port: int  # where it listens
    model: str | None = None  # package:<name>, a path or a hub id; None: the engine's default
    role: str | None = None  # must match the engine's; None: the engine's
    name: str | None = None  # in logs and metrics; None: the role
    host: str = "127.0.0.1"  # loopback unless the worker is shared across machines
    device: str = "cpu"  # cpu | cuda (the slice CUDA_VISIBLE_DEVICES shows)
    precision: str | None = None  # faster-whisper: int8 | fp16 | bf16 | fp32; None: int8 on CPU, fp16 on CUDA
    max_in_flight: int = 16  # HTTP requests admitted at once; more get 503 at once
    max_batch: int = 8  # most requests one batch takes (batching engines)
    batch_timeout_ms: float = 10.0  # longest the first request waits for others to join
    max_pending: int = 64  # requests waiting for a batch past which new ones get 503
    threads: int = 1  # CPU threads of the engine's runtime

    def __post_init__(self) -> None:
        if self.engine not in ENGINE_ROLES:
            raise ConfigError(f"engine {self.engine!r} is not served by workers.serve_worker; "
                              f"it serves {', '.join(ENGINE_ROLES)}")
        if self.role not in (None, ENGINE_ROLES[self.engine]):
            raise ConfigError(f"engine {self.engine} serves role {ENGINE_ROLES[self.engine]}, not {self.role}")
        if self.device not in ("cpu", "cuda"):
            raise ConfigError(f"device must be cpu or cuda, not {self.device!r}")
        if self.precision is not None and self.precision not in _WHISPER_COMPUTE:
            raise ConfigError(f"precision must be one of {', '.join(_WHISPER_COMPUTE)}, not {self.precision!r}")
        if self.engine == "snac" and self.precision not in (None, "fp32"):
            raise ConfigError(f"snac decodes in fp32 (its noise and upsampling are precision-sensitive), "
                              f"not {self.precision}")

    @property
    def served_role(self) -> str:
        return ENGINE_ROLES[self.engine]

    def policy(self) -> BatchPolicy:
        return BatchPolicy(max_batch=self.max_batch, timeout_s=self.batch_timeout_ms / 1000.0,
                           max_pending=self.max_pending)


def build_engine(args: WorkerArgs) -> Engine:
    """The engine, not loaded: the server loads and warms it in the background."""
    if args.engine == "faster-whisper":
        from models.whisper_asr import WhisperOptions
        from workers.batched_whisper import BatchedWhisperASR

        on_cuda = args.device == "cuda"
        compute = _WHISPER_COMPUTE[args.precision or ("fp16" if on_cuda else "int8")][on_cuda]
        options = WhisperOptions(device=args.device, compute_type=compute, cpu_threads=args.threads)
        if args.model:
            options = replace(options, model=args.model)
        return BatchedWhisperASR(options, args.policy())
    if args.engine == "minilm-onnx":
        from models.embedding import EmbeddingOptions, build_embedder
        from workers.batched_embedder import BatchedEmbedder

        embedder = build_embedder(EmbeddingOptions(engine="onnx", model=args.model, device=args.device,
                                                   threads=args.threads))
        return BatchedEmbedder(embedder, args.policy())
    if args.engine == "snac":
        return _snac_codec(args)
    from models.piper_tts import PiperOptions, PiperTTSEngine

    options = PiperOptions() if not args.model else PiperOptions(voice=args.model)
    return PiperTTSEngine(options, max_waiting=args.max_in_flight)


def _snac_codec(args: WorkerArgs) -> Engine:
    from models.orpheus.codec_engine import SnacCodecEngine
    from models.orpheus.decode_service import DecodeServiceConfig
    from models.orpheus.snac_decoder import load_snac
    from workers.batcher import BatchRecord

    source = None if args.model in (None, "random") else args.model
    config = DecodeServiceConfig(max_batch=args.max_batch, batch_timeout_ms=args.batch_timeout_ms,
                                 max_pending=args.max_pending, threads=args.threads if args.device == "cpu" else 0)
    return SnacCodecEngine(lambda: load_snac(source, device=args.device), config,
                           batch_record=BatchRecord(args.max_batch))


def parse_args(argv: Sequence[str] | None = None) -> tuple[WorkerArgs, str]:
    """The worker's settings and the log level."""
    parser = argparse.ArgumentParser(prog="python -m workers.serve_worker", description=__doc__.split("\n\n")[0])
    parser.add_argument("--deployment", help="deployment YAML; with --worker, fills every setting below")
    parser.add_argument("--worker", help="the worker's key under workers: in the deployment")
    parser.add_argument("--engine", choices=sorted(ENGINE_ROLES))
    parser.add_argument("--port", type=int, required=True)
    for flag, kind in [("--model", str), ("--role", str), ("--name", str), ("--host", str), ("--device", str),
                       ("--precision", str), ("--max-in-flight", int), ("--max-batch", int),
                       ("--batch-timeout-ms", float), ("--max-pending", int), ("--threads", int)]:
        parser.add_argument(flag, type=kind)
    parser.add_argument("--log-level", default="info")
    flags = parser.parse_args(argv)
    given = {k: v for k, v in vars(flags).items() if v is not None and k not in ("deployment", "worker", "log_level")}
    if flags.deployment or flags.worker:
        if not (flags.deployment and flags.worker):
            parser.error("--deployment and --worker go together")
        given = {**_from_deployment(flags.deployment, flags.worker), **given}
    if "engine" not in given:
        parser.error("--engine is required (or --deployment with --worker)")
    return WorkerArgs(**given), flags.log_level


def _from_deployment(path: str, worker: str) -> dict[str, object]:
    from workers.deployment import load_deployment

    deployment = load_deployment(path)
    spec = next((w for w in deployment.workers if w.name == worker), None)
    if spec is None:
        raise ConfigError(f"{path}: no worker {worker!r}; it has {', '.join(w.name for w in deployment.workers)}")
    settings: dict[str, object] = {
        "engine": spec.engine, "role": spec.role, "name": worker, "host": deployment.host,
        "device": "cpu" if all(d == "cpu" for d in spec.devices) else "cuda",
        "max_in_flight": spec.max_streams, "threads": spec.threads,
    }
    if spec.model:
        settings["model"] = spec.model
    if spec.engine == "faster-whisper" and spec.precision.weights:
        settings["precision"] = spec.precision.weights
    if spec.batching is not None:
        settings["max_batch"] = spec.batching.max_batch
        settings["batch_timeout_ms"] = spec.batching.timeout_ms
    return settings


def main(argv: Sequence[str] | None = None) -> None:
    from workers.server import serve

    try:
        args, log_level = parse_args(argv)
    except ConfigError as exc:
        raise SystemExit(f"serve_worker: {exc}") from None
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    engine = build_engine(args)
    serve(engine, role=args.served_role, name=args.name or args.served_role, host=args.host, port=args.port,
          max_in_flight=args.max_in_flight, log_level=log_level)


if __name__ == "__main__":
    main()
