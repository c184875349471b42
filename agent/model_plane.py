"""Where each model of this server runs, from the config's deployment file.

Per role (asr, llm, tts, embedder) a deployment says: in-process (inside this server, as
before), process (a worker this server starts as a child and stops with itself), or
external (a worker someone else runs, e.g. on its own MIG slice or Kubernetes pod). The
engines the calls use are then in-process engines or clients of those workers; the
pipeline cannot tell them apart.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from agent.config import CadenceConfig
from models.assets import resolve_local
from workers.binaries import find_binary
from workers.deployment import WorkerSpec, load_deployment
from workers.gpus import discover
from workers.placement import Plan, plan
from workers.supervisor import WorkerSupervisor

log = logging.getLogger(__name__)

SERVED_ROLES = ("asr", "llm", "tts", "codec", "embedder")  # codec: the Orpheus voice's SNAC decoder


@dataclass(frozen=True)
class Endpoint:
    """A model served by a worker: what the engine client needs."""

    role: str  # asr | llm | tts | codec | embedder
    engine: str  # the deployment's engine name (llama-server, vllm, faster-whisper, ...)
    urls: tuple[str, ...]  # each replica's base URL (one for a worker without replicas); clients spread over them
    model: str | None  # the model's name at the server (vLLM serves it under this name)
    max_streams: int  # requests each replica is planned to serve at once
    context_tokens: int | None = None  # an LLM's context per stream (the deployment's)


@dataclass(frozen=True)
class ModelPlane:
    endpoints: Mapping[str, Endpoint] = field(default_factory=dict)  # role -> worker; absent: in-process
    supervisor: WorkerSupervisor | None = None  # the workers this server starts; None: it starts none
    plan: Plan | None = None


def model_plane_for(config: CadenceConfig) -> ModelPlane:
    """Plans the config's deployment on this machine (a ConfigError names every problem)."""
    if config.deployment is None:
        return ModelPlane()
    deployment = load_deployment(config.deployment)
    placed = plan(deployment, discover(), find_binary=find_binary, resolve_model=resolve_local,
                  base_port=free_port_run(len(deployment.workers) * 4))
    endpoints = endpoints_of(placed)
    supervisor = None
    if placed.launches:
        supervisor = WorkerSupervisor(placed.launches, log_dir=_log_dir(config))
    log.info("deployment %s: %s", deployment.name,
             ", ".join(f"{r} -> {' '.join(endpoints[r].urls)}" if r in endpoints else f"{r} in-process"
                       for r in SERVED_ROLES))
    return ModelPlane(endpoints=endpoints, supervisor=supervisor, plan=placed)


def endpoints_of(placed: Plan) -> dict[str, Endpoint]:
    """Role -> the first worker serving it, with the URLs of all its replicas (same spec)."""
    replicas: dict[str, tuple[WorkerSpec, list[str]]] = {}
    for worker in placed.workers:
        role = worker.spec.role
        if worker.url is None or role not in SERVED_ROLES:
            continue  # in-process
        spec, urls = replicas.setdefault(role, (worker.spec, []))
        if worker.spec == spec:  # a second worker of the same role gets no calls from here
            urls.append(worker.url)
    return {role: Endpoint(role=role, engine=spec.engine, urls=tuple(urls), model=spec.model,
                           max_streams=spec.max_streams,
                           context_tokens=spec.context_tokens_per_stream if role == "llm" else None)
            for role, (spec, urls) in replicas.items()}


def _log_dir(config: CadenceConfig) -> Path:
    store = Path(config.store.path)
    base = store.parent if config.store.path != ":memory:" else Path("data")
    return base / "logs" / "workers"


def free_port_run(count: int) -> int:
    """A base port whose next `count` ports are free now: two servers on one machine (tests,
    a bench beside a dev server) never hand their workers the same ports."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count < 65535 and all(_is_free(base + i) for i in range(count)):
            return base
    raise OSError(f"no run of {count} free loopback ports found")


def _is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
