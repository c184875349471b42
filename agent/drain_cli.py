"""`cadence drain`: take a server out of service without cutting a call.

Kubernetes runs it as the agent server's preStop hook: /readyz turns 503 so the Service
sends no new calls, and the hook returns once the last call has ended (or at the timeout,
which the pod's termination grace period outlasts). Then SIGTERM stops the server.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import httpx

POLL_S = 2.0  # how often the remaining calls are counted


def drain(url: str, *, timeout_s: float, clock: Callable[[], float] = time.monotonic,
          sleep: Callable[[float], None] = time.sleep) -> int:
    answer = httpx.post(f"{url}/api/drain", timeout=10)
    if answer.status_code != 200:
        print(f"cadence: drain refused ({answer.status_code}): {answer.text[:200]}", file=sys.stderr)
        return 2
    deadline = clock() + timeout_s
    active = answer.json()["calls_active"]
    while active > 0:
        if clock() >= deadline:
            print(f"cadence: {active} calls still active after {timeout_s:.0f} s; stopping anyway", file=sys.stderr)
            return 1
        print(f"draining: {active} calls active", flush=True)
        sleep(POLL_S)
        active = httpx.get(f"{url}/api/drain", timeout=10).json()["calls_active"]
    print("drained: no calls active")
    return 0
