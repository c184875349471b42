"""How one planned worker is started: its command line, environment, port and readiness probe.

The plan decides the device and port; this module turns that into what the engine's own
server wants on its command line. Flags are those of llama.cpp's `llama-server`, `vllm
serve` and `trtllm-serve`; Cadence's own engines run in `workers.serve_worker`.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from models.errors import ConfigError
from workers.deployment import WorkerSpec

# Cadence's own workers: one process around an engine in models/, started from the deployment file.
OWN_ENGINES = ("faster-whisper", "piper", "snac", "minilm-onnx")
# vLLM's --gpu-memory-utilization never above this: the CUDA context and the allocator's
# fragmentation live outside what vLLM counts.
MAX_GPU_MEMORY_FRACTION = 0.95
# llama-server --cache-reuse: the shortest prompt chunk reused from a slot's cache by shifting
# it; 256 tokens keeps a call's system prompt and history warm across turns.
LLAMA_CACHE_REUSE_TOKENS = 256
# llama-server --n-gpu-layers on a GPU: more than any model has, i.e. all of them.
LLAMA_ALL_LAYERS = 999
# llama-server --batch-size on a CPU: the prompt tokens read per step. The server reports its
# progress through a prompt after each step (the client's proof of life, models/openai_chat.py),
# and a call's deadline restarts at each report: on 2 cores a step of 512 tokens of SmolLM2-135M
# takes ~1.7 s, of its default 2,048 up to ~6 s, as long as the deadline itself. Smaller steps
# cost little here (the long-prompt agent's first turns alike, README); a GPU keeps the default.
LLAMA_CPU_PROMPT_BATCH = 512
_LLAMA_KV_TYPES = {"f16": "f16", "fp16": "f16", "bf16": "bf16", "q8_0": "q8_0"}
_VLLM_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class WorkerLaunch:
    name: str  # worker name, with "-<i>" appended per replica when replicas > 1
    role: str  # asr | llm | tts | codec | embedder
    engine: str  # the deployment's engine name
    argv: tuple[str, ...]  # the command to exec
    env: Mapping[str, str]  # set on top of the parent's environment, before CUDA is touched
    host: str  # where it listens
    port: int  # where it listens
    ready_path: str  # GET here answers 200 when the worker can serve
    device: str  # resolved: "cpu", "cuda:0", "MIG-<uuid>"
    planned_memory_gb: float | None  # weights + KV per stream x streams + overhead; None if not given
    max_streams: int  # concurrent streams it is planned for

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass(frozen=True)
class LaunchSite:
    """What the plan decided for one replica, before its command line is built."""

    spec: WorkerSpec  # the worker as the deployment describes it
    name: str  # the replica's name
    device: str  # resolved device ("cpu", "cuda:0", "MIG-<uuid>")
    device_memory_gb: float | None  # memory of that GPU or slice; None on CPU
    env: Mapping[str, str]  # the device pinning and thread counts
    host: str  # where it will listen
    port: int  # where it will listen
    deployment_source: str  # the deployment file, for Cadence's own workers


def build_launch(site: LaunchSite, *, find_binary: Callable[[str], str | None],
                 resolve_model: Callable[[str], object | None]) -> WorkerLaunch:
    """The launch for one replica; a ConfigError naming the worker when it cannot be built."""
    spec = site.spec
    if spec.engine == "llama-server":
        argv, ready = _llama_server(site, find_binary, resolve_model), "/health"
    elif spec.engine == "vllm":
        argv, ready = _vllm(site), "/health"
    elif spec.engine == "trtllm-serve":
        argv, ready = _trtllm_serve(site), "/health"
    elif spec.engine in OWN_ENGINES:
        argv, ready = _own_worker(site), "/readyz"
    else:  # the loader admits only known engines; this is a missing builder
        raise ConfigError(f"{site.name}: no launcher for engine {spec.engine}")
    return WorkerLaunch(name=site.name, role=spec.role, engine=spec.engine, argv=tuple(argv), env=dict(site.env),
                        host=site.host, port=site.port, ready_path=ready, device=site.device,
                        planned_memory_gb=spec.planned_memory_gb(), max_streams=spec.max_streams)


def _llama_server(site: LaunchSite, find_binary: Callable[[str], str | None],
                  resolve_model: Callable[[str], object | None]) -> list[str]:
    spec = site.spec
    binary = spec.binary or find_binary("llama-server")
    if binary is None:
        raise ConfigError(f"{site.name}: llama-server is not built; run `make llama-server` "
                          f"(it lands in ~/.cache/cadence/bin), or set workers.{spec.name}.binary to its path")
    model = _required_model(site)
    gguf = resolve_model(model)
    if gguf is None:
        raise ConfigError(f"{site.name}: model {model!r} is not a local GGUF file; llama-server needs "
                          "package:<name> or a path to a .gguf")
    streams = spec.max_streams
    argv = [binary, "-m", str(gguf), "--host", site.host, "--port", str(site.port),
            "--parallel", str(streams), "-c", str(streams * spec.context_tokens_per_stream),
            "--threads", str(spec.threads), "--cont-batching", "--metrics", "--no-webui",
            "--cache-reuse", str(LLAMA_CACHE_REUSE_TOKENS)]
    kv = spec.precision.kv_cache
    if kv is not None:
        if kv not in _LLAMA_KV_TYPES:
            raise ConfigError(f"{site.name}: llama-server has no {kv} KV cache; use f16, bf16 or q8_0")
        # A quantized V cache needs flash attention, which llama-server turns on by itself
        # where the backend has it (-fa auto).
        argv += ["--cache-type-k", _LLAMA_KV_TYPES[kv], "--cache-type-v", _LLAMA_KV_TYPES[kv]]
    if site.device != "cpu":
        argv += ["--n-gpu-layers", str(LLAMA_ALL_LAYERS)]
    else:
        argv += ["--batch-size", str(LLAMA_CPU_PROMPT_BATCH)]
    return argv


def _vllm(site: LaunchSite) -> list[str]:
    spec = site.spec
    argv = ["vllm", "serve", _required_model(site), "--host", site.host, "--port", str(site.port),
            "--max-num-seqs", str(spec.max_streams), "--enable-prefix-caching",
            "--gpu-memory-utilization", _fraction(_gpu_share(site)),
            "--max-model-len", str(spec.context_tokens_per_stream),
            # A call's reply goes ahead of background prefix warm-ups (the client sends priority).
            "--scheduling-policy", "priority"]
    weights, kv = spec.precision.weights, spec.precision.kv_cache
    if weights == "fp8":  # quantized at load from a bf16/fp16 checkpoint
        argv += ["--quantization", "fp8"]
    elif weights in _VLLM_DTYPES:
        argv += ["--dtype", _VLLM_DTYPES[weights]]
    elif weights is not None:
        raise ConfigError(f"{site.name}: vllm takes weights fp8, bf16 or fp16 here; for a checkpoint "
                          "quantized another way leave precision.weights unset")
    if kv == "fp8":
        argv += ["--kv-cache-dtype", "fp8"]
    elif kv not in (None, "f16", "fp16", "bf16"):
        raise ConfigError(f"{site.name}: vllm has no {kv} KV cache; use fp8, or leave it unset")
    return argv


def _trtllm_serve(site: LaunchSite) -> list[str]:
    spec = site.spec
    memory = spec.memory
    assert memory is not None  # the plan refuses a GPU worker without a memory budget
    # trtllm-serve gives the KV cache a fraction of the memory left free after weights and
    # runtime buffers: ask for exactly the planned KV cache out of that remainder.
    free = (site.device_memory_gb or 0.0) - memory.weights_gb - memory.overhead_gb
    if free <= 0:
        raise ConfigError(f"{site.name}: weights and overhead leave no memory for a KV cache on {site.device}")
    kv_fraction = memory.kv_cache_gb_per_stream * spec.max_streams / free
    # Precision comes from the checkpoint (an FP8 checkpoint from ModelOpt): trtllm-serve
    # takes no quantization flag.
    return ["trtllm-serve", _required_model(site), "--host", site.host, "--port", str(site.port),
            "--max_batch_size", str(spec.max_streams), "--max_seq_len", str(spec.context_tokens_per_stream),
            "--kv_cache_free_gpu_memory_fraction", _fraction(kv_fraction)]


def _own_worker(site: LaunchSite) -> list[str]:
    # --worker is the deployment's key: every replica serves the same settings.
    return [sys.executable, "-m", "workers.serve_worker", "--deployment", site.deployment_source,
            "--worker", site.spec.name, "--port", str(site.port)]


def _required_model(site: LaunchSite) -> str:
    if not site.spec.model:
        raise ConfigError(f"{site.name}: engine {site.spec.engine} needs workers.{site.spec.name}.model")
    return site.spec.model


def _gpu_share(site: LaunchSite) -> float:
    planned = site.spec.planned_memory_gb()
    if site.device == "cpu" or not site.device_memory_gb or planned is None:
        raise ConfigError(f"{site.name}: {site.spec.engine} runs on a GPU with a known memory size and a "
                          f"memory budget; give workers.{site.spec.name} a cuda:N or MIG device and memory:")
    return planned / site.device_memory_gb


def _fraction(share: float) -> str:
    """Two decimals, rounded up so the engine gets at least its plan, capped below the whole device."""
    return f"{min(MAX_GPU_MEMORY_FRACTION, math.ceil(round(share * 100, 6)) / 100):.2f}"
