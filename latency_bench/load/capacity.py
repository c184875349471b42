"""How many concurrent callers a server sustains within its latency SLO.

A level is sustained when its callers' TTFS p95 is within the SLO, no reply had an
audible underrun and no turn failed. Levels rise until one is not sustained; the
largest sustained level is the deployment's sizing figure (admitted sessions, batch
sizes).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class SLO:
    ttfs_p95_ms: float = 1500.0  # CPU default; a GPU deployment would set ~500-800 ms
    max_underrun_turns: int = 0
    max_failed_turns: int = 0


def verdict(summary: dict, slo: SLO) -> list[str]:
    """Why a level is not sustained; empty when it is."""
    reasons = []
    p95 = summary["caller"]["ttfs_ms"]["p95"]
    if p95 is None:
        reasons.append("no turn was answered")
    elif p95 > slo.ttfs_p95_ms:
        reasons.append(f"TTFS p95 {p95:.0f} ms > SLO {slo.ttfs_p95_ms:.0f} ms")
    if summary["turns_with_underruns"] > slo.max_underrun_turns:
        reasons.append(f"{summary['turns_with_underruns']} turns with audio underruns")
    if summary["errors"] > slo.max_failed_turns:
        reasons.append(f"{summary['errors']} failed turns: {summary['error_kinds']}")
    return reasons


async def find_capacity(run_level: Callable[[int], Awaitable[dict]], slo: SLO, *, start: int = 1, step: int = 1,
                        max_callers: int = 32) -> dict:
    """Runs levels start, start+step, ... until one is not sustained (or `max_callers`)."""
    levels, sustained, stopped_by = [], 0, None
    callers = start
    while callers <= max_callers:
        level = await run_level(callers)
        reasons = verdict(level["summary"], slo)
        level["sustained"], level["not_sustained_because"] = not reasons, reasons
        levels.append(level)
        if reasons:
            stopped_by = {"callers": callers, "reasons": reasons}
            break
        sustained = callers
        callers += step
    return {"slo": asdict(slo), "sustained_callers": sustained, "stopped_by": stopped_by,
            "reached_max": stopped_by is None, "levels": levels}
