"""`cadence workers up --deployment FILE`: start a deployment's process workers on this
machine, keep them up (restarts with backoff), and stop them all on SIGTERM or Ctrl-C.

On a GPU box this is the model plane without the agent server: each worker pinned to its
slice, the agent servers elsewhere pointing at them as `run: external` workers.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from models.assets import resolve_local
from models.errors import CadenceError
from workers.binaries import find_binary
from workers.deployment import load_deployment
from workers.gpus import discover
from workers.placement import DEFAULT_BASE_PORT, plan
from workers.supervisor import WorkerSupervisor

log = logging.getLogger(__name__)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="cadence workers up", description=__doc__.split("\n\n")[0])
    parser.add_argument("--deployment", required=True, help="configs/deployments/<file>.yaml")
    parser.add_argument("--base-port", type=int, default=DEFAULT_BASE_PORT, help="ports for workers without one")
    parser.add_argument("--log-dir", default="data/logs/workers", help="one log file per worker")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per readiness probe otherwise
    try:
        placed = plan(load_deployment(args.deployment), discover(), find_binary=find_binary,
                      resolve_model=resolve_local, base_port=args.base_port)
    except CadenceError as exc:
        print(f"cadence: {exc}", file=sys.stderr)
        return 2
    if not placed.launches:
        print("cadence: the deployment has no `run: process` workers to start", file=sys.stderr)
        return 2
    return asyncio.run(_run(WorkerSupervisor(placed.launches, log_dir=args.log_dir)))


async def _run(supervisor: WorkerSupervisor) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await supervisor.start()
    except CadenceError as exc:
        print(f"cadence: {exc}", file=sys.stderr)
        return 1
    for worker in supervisor.workers:
        print(f"{worker.launch.name:12s} ready at {worker.launch.base_url} on {worker.launch.device}", flush=True)
    await stop.wait()
    log.info("stopping workers")
    await supervisor.stop()
    return 0
