"""A deployment: which model workers exist, what runs each, where, and for how many streams.

Frozen dataclasses, filled from YAML by the strict loader the server config uses too
(models/config_loader.py): an unknown key, a wrong type or a value out of range is a
`ConfigError` naming the key's path (`workers.llm.batching.max_bach: unknown key`). Each
section checks its own ranges in `__post_init__` (raising ValueError with a message relative
to the section); the loader adds the path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.config_loader import build_dataclass, coerce, construct, read_yaml, refuse_unknown
from models.errors import ConfigError

ROLES = ("asr", "llm", "tts", "codec", "embedder")
# Which roles each engine can fill. The first three are external servers; the rest are
# Cadence's own worker process (workers.serve_worker) around an engine in models/.
ENGINE_ROLES: dict[str, tuple[str, ...]] = {
    "llama-server": ("llm", "tts"),  # tts: an Orpheus GGUF served as a token source
    "vllm": ("llm", "tts"),
    "trtllm-serve": ("llm", "tts"),
    "faster-whisper": ("asr",),
    "piper": ("tts",),
    "snac": ("codec",),
    "minilm-onnx": ("embedder",),
}
RUN_MODES = ("process", "in-process", "external")
WEIGHT_PRECISIONS = ("fp32", "fp16", "bf16", "fp8", "int8", "q4_1", "q8_0")
KV_CACHE_PRECISIONS = ("f16", "fp16", "bf16", "fp8", "q8_0")
# cpu | cuda:N | MIG-<uuid> (as nvidia-smi -L prints it) | <profile>#<index among that profile>
DEVICE_SYNTAX = re.compile(r"^(cpu|cuda:\d+|MIG-[0-9A-Za-z/-]+|[0-9a-z.+]+#\d+)$")
# Worker names become log file names and process names: keep them plain.
WORKER_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")
MAX_BATCH_TIMEOUT_MS = 1000.0  # a batcher that waits longer than this stalls live audio


@dataclass(frozen=True)
class Precision:
    weights: str | None = None  # fp32|fp16|bf16|fp8|int8|q4_1|q8_0; None: the checkpoint's own
    kv_cache: str | None = None  # f16|fp16|bf16|fp8|q8_0; None: the engine's default

    def __post_init__(self) -> None:
        if self.weights is not None and self.weights not in WEIGHT_PRECISIONS:
            raise ValueError(f"weights must be one of {', '.join(WEIGHT_PRECISIONS)}, not {self.weights!r}")
        if self.kv_cache is not None and self.kv_cache not in KV_CACHE_PRECISIONS:
            raise ValueError(f"kv_cache must be one of {', '.join(KV_CACHE_PRECISIONS)}, not {self.kv_cache!r}")


@dataclass(frozen=True)
class Batching:
    max_batch: int = 8  # most requests one forward pass takes (our dynamic batcher)
    timeout_ms: float = 15.0  # longest the first request waits for others to join its batch

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        if not 0 < self.timeout_ms <= MAX_BATCH_TIMEOUT_MS:
            raise ValueError(f"timeout_ms must be in (0, {MAX_BATCH_TIMEOUT_MS:.0f}]")


@dataclass(frozen=True)
class MemoryBudget:
    """What one worker needs on its device, in GB (GiB: what NVML's totals divide into)."""

    weights_gb: float = 0.0  # the loaded weights at the planned precision
    kv_cache_gb_per_stream: float = 0.0  # KV cache (or per-stream state) of one full-length stream
    overhead_gb: float = 0.0  # CUDA context, allocator slack, activations, CUDA graphs

    def __post_init__(self) -> None:
        if min(self.weights_gb, self.kv_cache_gb_per_stream, self.overhead_gb) < 0:
            raise ValueError("memory figures must be >= 0")

    def planned_gb(self, streams: int) -> float:
        return self.weights_gb + self.kv_cache_gb_per_stream * streams + self.overhead_gb


@dataclass(frozen=True)
class WorkerSpec:
    name: str  # the key under `workers:`; replicas are named <name>-<i>
    role: str  # asr | llm | tts | codec | embedder; defaults to the name
    engine: str = field(metadata={"required": f"one of {', '.join(ENGINE_ROLES)}"})  # one of ENGINE_ROLES
    # process: started by `cadence serve` / `cadence workers up`; in-process: inside the agent
    # server; external: someone else runs it at `url`.
    run: str = "process"
    url: str | None = None  # external only: the worker's base URL
    model: str | None = None  # package:<name>, a local path, or a hub id the engine loads itself
    # cpu | cuda:N | MIG-<uuid> | <profile>#<i>; a list gives one device per replica. A single
    # <profile>#<i> with replicas > 1 takes slices #i, #i+1, ...
    device: str | tuple[str, ...] = "cpu"
    binary: str | None = None  # llama-server only: its path; default: the built one (`make llama-server`)
    threads: int = 1  # CPU threads (OMP_NUM_THREADS; llama-server --threads)
    precision: Precision = field(default_factory=Precision)
    batching: Batching | None = None  # engines that batch through our dynamic batcher
    replicas: int = 1  # copies of this worker, each on its own device unless they share
    max_streams: int = 1  # concurrent requests/streams each replica is planned (and sized) for
    context_tokens_per_stream: int = 2048  # LLM engines: prompt + reply tokens one stream may hold
    share_slice: bool = False  # may share its GPU slice with other workers that also say so
    memory: MemoryBudget | None = None  # required on a GPU; on CPU only shown, never checked
    port: int | None = None  # None: allocated by the plan (base port + index)

    def __post_init__(self) -> None:
        _check_worker(self)

    @property
    def devices(self) -> tuple[str, ...]:
        return (self.device,) if isinstance(self.device, str) else self.device

    def planned_memory_gb(self) -> float | None:
        return None if self.memory is None else self.memory.planned_gb(self.max_streams)


def _check_worker(spec: WorkerSpec) -> None:
    checks = [
        (WORKER_NAME.match(spec.name) is not None, "the name must be lower case letters, digits, - or _"),
        (spec.role in ROLES, f"role must be one of {', '.join(ROLES)}, not {spec.role!r}"),
        (spec.engine in ENGINE_ROLES, f"engine must be one of {', '.join(ENGINE_ROLES)}, not {spec.engine!r}"),
        (spec.run in RUN_MODES, f"run must be one of {', '.join(RUN_MODES)}, not {spec.run!r}"),
        ((spec.url is not None) == (spec.run == "external"), "url is required for run: external, and only there"),
        (spec.threads >= 1, "threads must be >= 1"),
        (spec.replicas >= 1, "replicas must be >= 1"),
        (spec.max_streams >= 1, "max_streams must be >= 1"),
        (spec.context_tokens_per_stream >= 1, "context_tokens_per_stream must be >= 1"),
        (spec.port is None or 1 <= spec.port <= 65535, "port must be 1..65535"),
        (spec.port is None or spec.replicas == 1, "port: a fixed port cannot serve several replicas; leave it null"),
        (len(spec.devices) in (1, spec.replicas), f"device: give one device, or one per replica ({spec.replicas})"),
        (spec.run != "in-process" or spec.replicas == 1, "replicas: an in-process worker has exactly one"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)
    if spec.role not in ENGINE_ROLES[spec.engine]:
        raise ValueError(f"engine {spec.engine} serves {', '.join(ENGINE_ROLES[spec.engine])}, not role {spec.role}")
    for device in spec.devices:
        if not DEVICE_SYNTAX.match(device):
            raise ValueError(f"device {device!r}: use cpu, cuda:N, MIG-<uuid> or <profile>#<index> (e.g. 1g.10gb#0)")


@dataclass(frozen=True)
class Deployment:
    name: str  # shown in logs and plans
    source: str  # the file it was read from; Cadence's own workers are started with it
    workers: tuple[WorkerSpec, ...]  # in file order, which is also port order
    host: str = "127.0.0.1"  # where process workers listen; loopback unless a worker is shared

    def __post_init__(self) -> None:
        if not self.workers:
            raise ValueError("workers: a deployment needs at least one worker")


def load_deployment(path: str | Path) -> Deployment:
    """Reads a deployment YAML file; any problem is a ConfigError naming the key."""
    path = Path(path)
    return parse_deployment(read_yaml(path, "deployment"), str(path.resolve()))


def parse_deployment(data: Any, source: str) -> Deployment:
    if not isinstance(data, dict):
        raise ConfigError(f"deployment {source} must be a mapping at top level")
    refuse_unknown(data, {"name", "host", "workers"}, "")
    workers = data.get("workers")
    if not isinstance(workers, dict) or not workers:
        raise ConfigError(f"deployment {source}: workers must be a mapping of worker name -> settings")
    specs = tuple(_worker(str(name), settings) for name, settings in workers.items())
    fields = {"name": coerce(str, data.get("name"), "name"), "source": source, "workers": specs}
    if "host" in data:
        fields["host"] = coerce(str, data["host"], "host")
    return construct(Deployment, fields, "deployment")


def _worker(name: str, settings: Any) -> WorkerSpec:
    """The key under `workers:` is the worker's name, and its role unless it names one."""
    where = f"workers.{name}"
    if not isinstance(settings, dict):
        raise ConfigError(f"{where} must be a mapping, got {type(settings).__name__}")
    return build_dataclass(WorkerSpec, {"role": name, **settings}, where, given={"name": name})
