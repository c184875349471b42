"""Starts a plan's workers as child processes, keeps them up, and stops them.

Each worker gets its environment (CUDA_VISIBLE_DEVICES=MIG-<uuid>, thread counts) set in
the child before it runs a line of its own, so CUDA only ever sees its slice. A worker that
exits unexpectedly is restarted with exponential backoff; one that stays up a while earns
its backoff back. Its output goes to a log file per worker (never an unread pipe, which
would fill and stall it). Stopping sends SIGTERM to all, waits a grace period, then SIGKILLs.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from models.errors import WorkerUnavailableError
from workers.launch import WorkerLaunch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SupervisorOptions:
    ready_timeout_s: float = 120.0  # a worker not ready by then fails the start (weights load, warm-up)
    ready_poll_s: float = 0.1  # how often readiness is probed while waiting
    stop_grace_s: float = 10.0  # SIGTERM -> this long to exit -> SIGKILL
    backoff_initial_s: float = 0.5  # first restart delay: a crash is back within a second or two
    backoff_max_s: float = 10.0  # the delay doubles per crash up to this
    # Up this long since its last start, a worker's next crash counts as the first again.
    backoff_reset_after_s: float = 60.0
    # A ready worker is probed this often; one that has not answered `liveness_misses` probes in
    # a row (each given the client's 2 s) is stuck (a deadlock, a stopped process, a wedged
    # device): it is killed and restarted like a crash. Answering at all is alive: a busy
    # worker's 503 counts as an answer. Calls meanwhile get apologies at their deadlines.
    liveness_every_s: float = 2.0
    liveness_misses: int = 3


class RestartBackoff:
    """Exponential restart delays, forgiven after a stable run. Pure: the clock is passed in."""

    def __init__(self, options: SupervisorOptions) -> None:
        self._options = options
        self._crashes = 0

    def next_delay(self, *, ran_for_s: float) -> float:
        if ran_for_s >= self._options.backoff_reset_after_s:
            self._crashes = 0
        delay = min(self._options.backoff_max_s, self._options.backoff_initial_s * 2 ** self._crashes)
        self._crashes += 1
        return delay


@dataclass
class WorkerState:
    launch: WorkerLaunch
    process: asyncio.subprocess.Process | None = None
    started_at: float = 0.0
    restarts: int = 0
    ready: bool = False


def _load_prctl():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # loaded here: nothing is loaded after fork
    except (OSError, AttributeError):  # not Linux
        return None


_PRCTL = _load_prctl()
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Runs in the child between fork and exec: the kernel sends it SIGTERM when the server
    dies, however it dies. A server killed with SIGKILL (an OOM kill, a stop's last resort)
    cannot stop its workers itself, and its own session keeps them from its process group;
    without this they would hold their GPU slices and ports as orphans."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


class WorkerSupervisor:
    def __init__(self, launches: Sequence[WorkerLaunch], *, log_dir: str | Path,
                 options: SupervisorOptions = SupervisorOptions(),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._workers = [WorkerState(launch) for launch in launches]
        self._log_dir = Path(log_dir)
        self._options = options
        self._clock = clock
        self._watchers: list[asyncio.Task] = []
        self._stopping = False
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(2.0, connect=0.5))

    @property
    def workers(self) -> tuple[WorkerState, ...]:
        return tuple(self._workers)

    async def start(self) -> None:
        """Starts every worker and returns once all are ready; raises if one is not."""
        self._log_dir.mkdir(parents=True, exist_ok=True)
        for worker in self._workers:
            await self._spawn(worker)
        try:
            await asyncio.gather(*(self._wait_ready(w) for w in self._workers))
        except BaseException:
            await self.stop()
            raise
        self._watchers = [asyncio.create_task(self._watch(w), name=f"watch-{w.launch.name}") for w in self._workers]

    async def _spawn(self, worker: WorkerState) -> None:
        launch = worker.launch
        env = {**os.environ, **launch.env}
        with open(self._log_dir / f"{launch.name}.log", "ab") as output:
            worker.process = await asyncio.create_subprocess_exec(
                *launch.argv, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=output, stderr=output,
                start_new_session=True,  # its own process group: a Ctrl-C on serve reaches it once, from us
                preexec_fn=die_with_parent)
        worker.started_at = self._clock()
        worker.ready = False
        log.info("worker %s started (pid %d) on %s at %s", launch.name, worker.process.pid, launch.device,
                 launch.base_url)

    async def _wait_ready(self, worker: WorkerState) -> None:
        launch = worker.launch
        deadline = self._clock() + self._options.ready_timeout_s
        while self._clock() < deadline:
            if worker.process is not None and worker.process.returncode is not None:
                raise WorkerUnavailableError(
                    f"worker {launch.name} exited with {worker.process.returncode} before it was ready; "
                    f"see {self._log_dir / (launch.name + '.log')}")
            if await self._is_ready(launch):
                worker.ready = True
                return
            await asyncio.sleep(self._options.ready_poll_s)
        raise WorkerUnavailableError(f"worker {launch.name} was not ready within {self._options.ready_timeout_s:.0f} s; "
                                     f"see {self._log_dir / (launch.name + '.log')}")

    async def _is_ready(self, launch: WorkerLaunch) -> bool:
        try:
            answer = await self._http.get(launch.base_url + launch.ready_path)
        except httpx.HTTPError:
            return False
        return answer.status_code == 200

    async def _watch(self, worker: WorkerState) -> None:
        backoff = RestartBackoff(self._options)
        while not self._stopping:
            assert worker.process is not None
            code = await self._until_exit_or_stuck(worker)
            if self._stopping:
                return
            worker.ready = False
            delay = backoff.next_delay(ran_for_s=self._clock() - worker.started_at)
            log.warning("worker %s exited with %s; restarting in %.1f s", worker.launch.name, code, delay)
            await asyncio.sleep(delay)
            if self._stopping:
                return
            worker.restarts += 1
            await self._spawn(worker)
            try:
                await self._wait_ready(worker)
                log.info("worker %s is back (restart %d)", worker.launch.name, worker.restarts)
            except WorkerUnavailableError as exc:
                log.error("%s", exc)  # the loop goes on: the process exits or is killed, and is retried
                if worker.process.returncode is None:
                    _signal(worker.process, signal.SIGKILL)

    async def _until_exit_or_stuck(self, worker: WorkerState) -> int:
        """The worker's exit status; one that stops answering its probe is killed first."""
        process = worker.process
        assert process is not None
        misses = 0
        while True:
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(asyncio.shield(process.wait()), self._options.liveness_every_s)
            if self._stopping:
                return await process.wait()
            misses = 0 if await self._answers(worker.launch) else misses + 1
            if misses >= self._options.liveness_misses:
                log.error("worker %s (pid %d) has not answered %d health probes in a row; killing it",
                          worker.launch.name, process.pid, misses)
                _signal(process, signal.SIGKILL)
                return await process.wait()

    async def _answers(self, launch: WorkerLaunch) -> bool:
        try:
            await self._http.get(launch.base_url + launch.ready_path)
        except httpx.HTTPError:
            return False
        return True

    async def stop(self) -> None:
        """SIGTERM to every worker, SIGKILL to those still up after the grace period."""
        self._stopping = True
        for task in self._watchers:
            task.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        running = [w.process for w in self._workers if w.process is not None and w.process.returncode is None]
        for process in running:
            _signal(process, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in running)), self._options.stop_grace_s)
        except asyncio.TimeoutError:
            for process in running:
                if process.returncode is None:
                    log.warning("worker pid %d ignored SIGTERM; killing it", process.pid)
                    _signal(process, signal.SIGKILL)
            await asyncio.gather(*(p.wait() for p in running))
        await self._http.aclose()


def _signal(process: asyncio.subprocess.Process, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)  # the worker's own children (e.g. a compiler) go with it
    except ProcessLookupError:
        pass
