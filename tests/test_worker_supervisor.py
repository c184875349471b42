"""The worker supervisor restarts a worker that crashed and one that is stuck (issue 13,
scenario 13: the engine is back within 30 s). The worker is Python's own HTTP server: a real
process, found stuck the way a real one is, by its health probe going unanswered."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys

import pytest

from workers.launch import WorkerLaunch
from workers.supervisor import SupervisorOptions, WorkerSupervisor

# Probed every 0.2 s, stuck after 2 silent probes (each given the client's 2 s at most).
FAST = SupervisorOptions(ready_timeout_s=20, backoff_initial_s=0.1, liveness_every_s=0.2, liveness_misses=2)


def _launch() -> WorkerLaunch:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return WorkerLaunch(name="web", role="asr", engine="http.server",
                        argv=(sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"),
                        env={}, host="127.0.0.1", port=port, ready_path="/", device="cpu",
                        planned_memory_gb=None, max_streams=1)


async def _until_restarted(supervisor: WorkerSupervisor, restarts: int, timeout_s: float) -> None:
    worker = supervisor.workers[0]
    async with asyncio.timeout(timeout_s):
        while not (worker.restarts >= restarts and worker.ready):
            await asyncio.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("fault", [signal.SIGKILL, signal.SIGSTOP], ids=["crashed", "stuck"])
async def test_a_worker_that_crashes_or_gets_stuck_is_restarted(tmp_path, fault):
    supervisor = WorkerSupervisor([_launch()], log_dir=tmp_path, options=FAST)
    await supervisor.start()
    try:
        first = supervisor.workers[0].process.pid
        os.kill(first, fault)
        await _until_restarted(supervisor, 1, timeout_s=15)
        assert supervisor.workers[0].process.pid != first
        with pytest.raises(ProcessLookupError):  # the stuck one was killed, not left stopped
            os.kill(first, 0)
    finally:
        await supervisor.stop()


@pytest.mark.slow
async def test_a_worker_that_answers_is_left_alone(tmp_path):
    supervisor = WorkerSupervisor([_launch()], log_dir=tmp_path, options=FAST)
    await supervisor.start()
    try:
        await asyncio.sleep(10 * FAST.liveness_every_s)  # many probes, all answered
        assert supervisor.workers[0].restarts == 0
    finally:
        await supervisor.stop()
