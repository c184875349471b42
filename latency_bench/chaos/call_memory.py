"""Chaos scenario: what one live call costs the server in memory (issue 13's report: the
process's memory per active call, goal <= 50 MB), against a running server.

After one warm-up call (the models' and a pipeline's first use, which the process keeps for
every later call) and once no call is left, the server's resident memory is read; then `calls`
phone callers each ask a question, hear the reply, and hold the line (the phone's silence
streaming in) while the memory is read again, HELD_SAMPLES times a second apart. The cost of a
live call is the median of those, less the idle figure, over the calls. `run` returns the
figures; `judge` decides.
"""

from __future__ import annotations

import asyncio
import statistics

import httpx

from latency_bench.callers import twilio_caller
from latency_bench.callers.conversation import PlannedTurn
from latency_bench.callers.speech import available_voices, speak_as
from latency_bench.chaos.admission import calls_active, ws_url
from latency_bench.chaos.server_figures import process_figures, settle
from latency_bench.chaos.verdict import Verdict

QUESTION = "What time do you open on Saturday?"
HOLD_S = 30.0  # each caller's silence after its first reply: every call is live and past its first turn
HELD_SAMPLES = 5
MAX_MB_PER_CALL = 50.0
FIRST_REPLY_TIMEOUT_S = 120.0


async def run(base_url: str, *, calls: int, hold_s: float = HOLD_S) -> dict:
    """`hold_s`: how long each caller holds the line after its first reply (longer than the
    slowest call takes to reach it)."""
    samples, rate = speak_as(QUESTION, available_voices()[0])
    plan = [PlannedTurn.of(samples, rate, QUESTION, pause_before_s=0.6),
            PlannedTurn.of(samples, rate, QUESTION, pause_before_s=hold_s)]
    url = f"{ws_url(base_url)}/ws/twilio"
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as http:
        await twilio_caller.call(url, plan[:1], reply_timeout_s=60)  # warm-up
        await settle(base_url)
        idle = await process_figures(http)
        first_replies = [asyncio.Event() for _ in range(calls)]
        callers = [asyncio.create_task(twilio_caller.call(url, plan, caller=n, reply_timeout_s=60,
                                                          on_turn=lambda turn, heard=first_replies[n]: heard.set()))
                   for n in range(calls)]
        try:
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in first_replies)), FIRST_REPLY_TIMEOUT_S)
            live = await calls_active(base_url)
            held = []
            for _ in range(HELD_SAMPLES):
                held.append((await process_figures(http))["rss_mb"])
                await asyncio.sleep(1.0)
        finally:
            results = await asyncio.gather(*callers, return_exceptions=True)
        await settle(base_url)
        after = await process_figures(http)
    errors = [str(r) if isinstance(r, BaseException) else r.error for r in results]
    held_mb = statistics.median(held)
    return {"calls": calls, "live_when_measured": live, "idle_rss_mb": round(idle["rss_mb"], 1),
            "held_rss_mb": [round(mb, 1) for mb in held],
            "mb_per_call": round((held_mb - idle["rss_mb"]) / calls, 1),
            "after_rss_mb": round(after["rss_mb"], 1), "errors": [e for e in errors if e]}


def judge(f: dict) -> Verdict:
    passed = f["live_when_measured"] == f["calls"] and not f["errors"] and f["mb_per_call"] <= MAX_MB_PER_CALL
    return Verdict(scenario="call-memory",
                   pass_figure=f"{f['calls']} live calls, each past its first reply: the server's memory per live call "
                               f"{MAX_MB_PER_CALL:g} MB at most (over a warmed, idle server)",
                   measured=f"{f['mb_per_call']:+.1f} MB per call ({f['live_when_measured']} live: "
                            f"{f['idle_rss_mb']:.0f} MB idle -> {statistics.median(f['held_rss_mb']):.0f} MB; "
                            f"{f['after_rss_mb']:.0f} MB once they ended); {len(f['errors'])} calls with errors",
                   passed=passed, figures=f)
