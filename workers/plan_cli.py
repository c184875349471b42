"""`cadence workers plan --deployment FILE [--json] [--base-port 8100]`

Shows where each worker of a deployment would run on this machine, how much of its GPU or
slice it is planned to use, and the environment and command it would be started with; or,
when the deployment does not fit, every reason why (on stderr, exit status 2). It starts
nothing.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from models.assets import resolve_local
from models.errors import ConfigError
from workers.binaries import find_binary
from workers.deployment import load_deployment
from workers.gpus import Gpu, discover
from workers.placement import DEFAULT_BASE_PORT, Plan, PlannedWorker, describe_machine, plan

EXIT_REFUSED = 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cadence workers plan",
                                     description="Place a deployment's model workers on this machine's GPUs.")
    parser.add_argument("--deployment", required=True, help="deployment YAML, e.g. configs/deployments/cpu.yaml")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    parser.add_argument("--base-port", type=int, default=DEFAULT_BASE_PORT,
                        help="first port handed to workers without a fixed one")
    args = parser.parse_args(argv)
    try:
        deployment = load_deployment(args.deployment)
        placed = plan(deployment, discover(), find_binary=find_binary, resolve_model=resolve_local,
                      base_port=args.base_port)
    except ConfigError as exc:
        print(f"cadence workers plan: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    print(json.dumps(plan_as_json(placed), indent=2) if args.json else render(placed))
    return 0


def plan_as_json(placed: Plan) -> dict[str, Any]:
    return {
        "deployment": placed.deployment.name,
        "source": placed.deployment.source,
        "gpus": [_gpu_json(gpu) for gpu in placed.gpus],
        "workers": [_worker_json(worker) for worker in placed.workers],
    }


def _gpu_json(gpu: Gpu) -> dict[str, Any]:
    return {"index": gpu.index, "name": gpu.name, "uuid": gpu.uuid, "memory_gb": gpu.memory_gb,
            "slices": [{"uuid": s.uuid, "profile": s.profile, "memory_gb": s.memory_gb} for s in gpu.slices]}


def _worker_json(worker: PlannedWorker) -> dict[str, Any]:
    spec, placement, launch = worker.spec, worker.placement, worker.launch
    return {
        "name": worker.name, "role": spec.role, "engine": spec.engine, "run": spec.run,
        "device": placement.device if placement else None,
        "device_described": placement.described if placement else None,
        "device_memory_gb": placement.memory_gb if placement else None,
        "planned_memory_gb": None if worker.planned_memory_gb is None else round(worker.planned_memory_gb, 3),
        "max_streams": spec.max_streams,
        "url": worker.url,
        "env": dict(launch.env) if launch else None,
        "argv": list(launch.argv) if launch else None,
        "ready_path": launch.ready_path if launch else None,
    }


def render(placed: Plan) -> str:
    deployment = placed.deployment
    lines = [f"deployment {deployment.name} ({deployment.source})", f"machine: {describe_machine(placed.gpus)}", ""]
    for worker in placed.workers:
        lines += _worker_lines(worker) + [""]
    return "\n".join(lines).rstrip() + "\n"


def _worker_lines(worker: PlannedWorker) -> list[str]:
    spec, placement, launch = worker.spec, worker.placement, worker.launch
    lines = [f"{worker.name}  [{spec.role}, {spec.engine}, {spec.run}]"]
    if placement is None:
        return lines + [f"  url      {worker.url} (run by someone else)"]
    lines.append(f"  device   {placement.described}")
    lines.append(f"  memory   {_memory(worker)}")
    lines.append(f"  streams  {spec.max_streams}")
    if launch is None:
        return lines + ["  runs     inside the agent server"]
    env = " ".join(f"{key}={shlex.quote(value)}" for key, value in launch.env.items())
    return lines + [f"  url      {launch.base_url} (ready: GET {launch.ready_path})",
                    f"  env      {env}",
                    f"  command  {shlex.join(launch.argv)}"]


def _memory(worker: PlannedWorker) -> str:
    planned = "not planned" if worker.planned_memory_gb is None else f"{worker.planned_memory_gb:.2f} GB"
    placement = worker.placement
    if placement is None or placement.memory_gb is None:
        return f"{planned} (CPU: not checked)" if placement and not placement.on_gpu else planned
    return f"{planned} of {placement.memory_gb:.1f} GB"


if __name__ == "__main__":
    sys.exit(main())
