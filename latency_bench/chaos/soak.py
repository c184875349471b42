"""Chaos scenario: a long day (issue 13, scenario 6). Two phone callers talk without a break
for `minutes`, each in one call, the last of them with a clock running `skew` fast (0.1 %: its
20 ms frames come every 19.98 ms, and it plays reply audio that much faster), as a cheap
phone's crystal does. The server must hold both: memory flat once warmed up, replies as
prompt at the end as at the start (a lag that drifts is a queue growing somewhere), and no
holes in the reply audio.

Figures: the server's resident memory sampled every `sample_every_s` and its growth per 10
minutes after `warmup_minutes` (a least-squares slope, not two end points); per caller, TTFS
p50 over the first and the last fifth of the turns after warm-up, and the drift between
them; every turn answered; underruns. `run` returns the figures; `judge` decides.

The issue's soak is two callers; `callers` changes that, so a soak at what the machine holds
at the target (one caller on 2 cores) tells overload apart from a slow leak of time.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np

from latency_bench.callers import twilio_caller
from latency_bench.callers.conversation import PlannedTurn
from latency_bench.callers.listen import TurnRecord
from latency_bench.callers.speech import available_voices, speak_as
from latency_bench.chaos.admission import ws_url
from latency_bench.chaos.server_figures import LOOP_STALL_S, full_collections, loop_probes_later_than, process_figures
from latency_bench.chaos.verdict import Verdict
from latency_bench.stats import percentile

QUESTIONS = ("What time do you open on Saturday?", "Can I book an appointment for Tuesday?",
             "Where do I park when I arrive?", "Do you take walk-in patients?",
             "How long does a checkup take?", "Is the clinic open on public holidays?")
PAUSE_S = 1.5
SKEW = 0.001  # the skewed caller's clock: 0.1 % fast
MAX_GROWTH_MB_PER_10_MIN, MAX_DRIFT_MS = 1.0, 50.0


def _plan(turns: int, voice) -> list[PlannedTurn]:
    spoken = [speak_as(text, voice) for text in QUESTIONS]
    return [PlannedTurn.of(*spoken[i % len(QUESTIONS)], QUESTIONS[i % len(QUESTIONS)], pause_before_s=PAUSE_S)
            for i in range(turns)]


def growth_mb_per_10_min(samples: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, MB) samples, per 600 s; None under three samples."""
    if len(samples) < 3:
        return None
    seconds, mb = np.array(samples, dtype=float).T
    return float(np.polyfit(seconds, mb, 1)[0] * 600.0)


def drift(turns: list[TurnRecord], since: float) -> dict:
    """TTFS p50 of the first and the last fifth of the answered turns that ended after `since`."""
    settled = [t.ttfs_ms for t in turns if t.speech_end_at and t.speech_end_at >= since and t.ttfs_ms is not None]
    fifth = max(1, len(settled) // 5)
    first, last = percentile(settled[:fifth], 50), percentile(settled[-fifth:], 50)
    return {"turns_after_warmup": len(settled), "first_p50_ms": first, "last_p50_ms": last,
            "drift_ms": round(last - first, 1) if first is not None and last is not None else None}


def clock_rates(callers: int, skew: float) -> list[float]:
    """One rate per caller: the last one's clock runs `skew` fast, the others' true."""
    if callers < 1:
        raise ValueError(f"a soak needs at least one caller, not {callers}")
    return [1.0] * (callers - 1) + [1.0 + skew]


async def run(base_url: str, *, minutes: float, warmup_minutes: float, sample_every_s: float = 30.0,
              skew: float = SKEW, callers: int = 2) -> dict:
    rates = clock_rates(callers, skew)
    voices = available_voices()
    turns = int(minutes * 60 / 5) + 10  # more than the time allows (a turn takes ~6-8 s): time ends each call
    started = time.monotonic()
    ends_at = started + minutes * 60
    warm_at_wall = time.time() + warmup_minutes * 60
    samples: list[tuple[float, float]] = []
    stop = asyncio.Event()

    async def sample(http: httpx.AsyncClient) -> None:
        while not stop.is_set():
            elapsed = time.monotonic() - started
            if elapsed >= warmup_minutes * 60:
                samples.append((elapsed, (await process_figures(http))["rss_mb"]))
            try:
                await asyncio.wait_for(stop.wait(), sample_every_s)
            except TimeoutError:
                pass

    async def caller(n: int, clock_rate: float) -> twilio_caller.CallResult:
        return await twilio_caller.call(f"{ws_url(base_url)}/ws/twilio", _plan(turns, voices[n % len(voices)]),
                                        caller=n, clock_rate=clock_rate, reply_timeout_s=30,
                                        stop_when=lambda: time.monotonic() >= ends_at)

    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        collections_before = await full_collections(http)
        stalls_before = await loop_probes_later_than(http, LOOP_STALL_S)
        sampler = asyncio.create_task(sample(http))
        try:
            results = await asyncio.gather(*(caller(n, rate) for n, rate in enumerate(rates)))
        finally:
            stop.set()
            await sampler
        collections, slow_collections = (after - before for after, before in
                                         zip(await full_collections(http), collections_before))
        loop_stalls = await loop_probes_later_than(http, LOOP_STALL_S) - stalls_before
    per_caller = []
    for result, rate in zip(results, rates):
        answered = [t for t in result.turns if t.first_audible_at is not None]
        per_caller.append({"clock_rate": rate, "turns": len(result.turns), "answered": len(answered),
                        "errors": sorted({t.error for t in result.turns if t.error}),
                        "underruns": sum(t.underruns for t in result.turns),
                        "underrun_seconds": round(sum(t.underrun_seconds for t in result.turns), 3),
                        "close_code": result.close_code, "call_error": result.error,
                        **drift(result.turns, warm_at_wall)})
    return {"minutes": minutes, "warmup_minutes": warmup_minutes, "ran_minutes": round((time.monotonic() - started) / 60, 1),
            "rss_samples": [(round(s), round(mb, 1)) for s, mb in samples],
            "rss_growth_mb_per_10_min": (round(g, 2) if (g := growth_mb_per_10_min(samples)) is not None else None),
            "callers": per_caller,
            # What held the server's event loop (and every caller's audio) meanwhile.
            "server_loop_stalls_over_100ms": int(loop_stalls),
            "server_full_gc": {"collections": int(collections), "over_50ms": int(slow_collections)}}


def judge(f: dict) -> Verdict:
    growth = f["rss_growth_mb_per_10_min"]
    callers = f["callers"]
    drifts = [c["drift_ms"] for c in callers]
    skew_pct = (max(c["clock_rate"] for c in callers) - 1) * 100
    passed = (growth is not None and growth <= MAX_GROWTH_MB_PER_10_MIN
              and all(d is not None and abs(d) <= MAX_DRIFT_MS for d in drifts)
              and all(c["underruns"] == 0 and c["answered"] == c["turns"] and not c["call_error"] for c in callers))
    per_caller = "; ".join(
        f"caller {'+%.1f %% clock' % ((c['clock_rate'] - 1) * 100) if c['clock_rate'] != 1 else 'true clock'}: "
        f"{c['answered']} of {c['turns']} turns answered, TTFS p50 {c['first_p50_ms'] or 0:.0f} -> "
        f"{c['last_p50_ms'] or 0:.0f} ms ({c['drift_ms'] if c['drift_ms'] is not None else '?'} ms), "
        f"{c['underruns']} underruns" for c in callers)
    return Verdict(scenario="soak",
                   pass_figure=f"{len(callers)} caller{'s' if len(callers) > 1 else ''} talking for {f['minutes']:g} "
                               f"min, one clock {skew_pct:.2g} % fast: memory +"
                               f"{MAX_GROWTH_MB_PER_10_MIN:g} MB per 10 min at most after {f['warmup_minutes']:g} min, "
                               f"reply lag drifting {MAX_DRIFT_MS:g} ms at most, no underruns, every turn answered",
                   measured=f"memory {growth if growth is not None else '?'} MB per 10 min after warm-up "
                            f"({len(f['rss_samples'])} samples); {per_caller}"
                            + (f"; server loop stalls over 100 ms: {f['server_loop_stalls_over_100ms']}, full garbage "
                               f"collections: {f['server_full_gc']['collections']} ({f['server_full_gc']['over_50ms']} "
                               "over 50 ms)" if "server_full_gc" in f else ""),
                   passed=passed, figures=f)
