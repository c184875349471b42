"""Model workers die with the server, however it dies (issue 13: never a zombie): a server
killed with SIGKILL cannot stop its workers, and they run in a session of their own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

# A server stand-in: a supervisor starts one worker (Python's own HTTP server), prints its pid
# once it is ready, and waits to be killed.
SERVER = """
import asyncio, socket, sys
from pathlib import Path
from workers.launch import WorkerLaunch
from workers.supervisor import WorkerSupervisor

async def main():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    launch = WorkerLaunch(name="web", role="asr", engine="http.server",
                          argv=(sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"),
                          env={}, host="127.0.0.1", port=port, ready_path="/", device="cpu",
                          planned_memory_gb=None, max_streams=1)
    supervisor = WorkerSupervisor([launch], log_dir=Path(sys.argv[1]))
    await supervisor.start()
    print(supervisor._workers[0].process.pid, flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is dead too, only not yet reaped
        return stat.read().split(") ")[1][0] != "Z"


def test_a_worker_dies_when_its_server_is_killed(tmp_path):
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(tmp_path)], cwd=REPO_ROOT,
                              stdout=subprocess.PIPE, text=True)
    try:
        worker_pid = int(server.stdout.readline())
        assert alive(worker_pid)
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=10)
        deadline = time.monotonic() + 10
        while alive(worker_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(worker_pid), "the worker outlived its SIGKILLed server"
    finally:
        server.kill()
        server.wait(timeout=10)
