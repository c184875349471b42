"""Runs synthetic callers against a server, level by level, and joins the server's own stage times."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import httpx

from latency_bench.callers import realtime_caller, twilio_caller, webrtc_caller
from latency_bench.callers.conversation import gather_calls, plan_caller
from latency_bench.callers.listen import TurnRecord
from latency_bench.stats import join_server_turns, summarize

READY_TIMEOUT_S = 300.0
PERSIST_WAIT_S = 1.0  # the server stores a call's turns as the call ends


@dataclass(frozen=True)
class Scenario:
    url: str  # the server's base URL, http://host:port
    transport: str = "twilio"  # "twilio" | "webrtc" | "realtime" (OpenAI's Realtime protocol, /v1/realtime)
    turns: int = 5  # per caller
    seed: int = 0
    barge_in_every: int = 0  # every k-th turn talks over the previous reply; 0: never
    stagger_s: float = 0.7  # callers of a level start this far apart, not in lockstep
    reply_timeout_s: float = 20.0
    agent: str | None = None  # the agent the callers ask for; None: the server's default


def ramp_levels(max_callers: int) -> list[int]:
    """1, 2, 4, ... up to `max_callers`, which is always the last level."""
    levels, n = [], 1
    while n < max_callers:
        levels.append(n)
        n *= 2
    return levels + [max_callers]


async def run_level(scenario: Scenario, callers: int, on_turn: Callable[[TurnRecord], None] | None = None) -> dict:
    """`callers` concurrent calls of `scenario.turns` turns each; every turn, answered or not."""
    plans = [plan_caller(c, scenario.turns, seed=scenario.seed, barge_in_every=scenario.barge_in_every)
             for c in range(callers)]
    started = time.time()
    outcomes = await gather_calls([_one_call(scenario, c, plan, on_turn) for c, plan in enumerate(plans)],
                                  stagger_s=scenario.stagger_s)
    turns: list[dict] = []
    calls: list[dict] = []
    async with httpx.AsyncClient(base_url=scenario.url, timeout=10) as http:
        await asyncio.sleep(PERSIST_WAIT_S)
        for caller, (plan, outcome) in enumerate(zip(plans, outcomes)):
            if isinstance(outcome, BaseException):
                error = f"{outcome.__class__.__name__}: {outcome}"
                calls.append({"caller": caller, "error": error})
                turns += [_failed_turn(caller, i, p, scenario.transport, error) for i, p in enumerate(plan)]
                continue
            caller_turns = [t.to_json() for t in outcome.turns]
            for missing in range(len(outcome.turns), len(plan)):  # the call ended early
                caller_turns.append(_failed_turn(caller, missing, plan[missing], scenario.transport,
                                                 outcome.error or "call ended before this turn"))
            server_call = await _server_call(http, scenario.transport, outcome)
            if server_call is not None:
                join_server_turns(caller_turns, server_call.get("turns", []))
            calls.append({"caller": caller, "call_id": server_call and server_call.get("id"),
                          "error": outcome.error, "end_reason": server_call and server_call.get("end_reason")})
            turns += caller_turns
    return {"callers": callers, "started_at": started, "seconds": round(time.time() - started, 1),
            "summary": summarize(turns), "calls": calls, "turns": turns}


async def run(scenario: Scenario, levels: list[int], *, progress: bool = True) -> dict:
    await wait_until_ready(scenario.url)
    bar = _progress_bar(sum(levels) * scenario.turns, progress)
    results = []
    try:
        for callers in levels:
            bar.set_description(f"{callers} caller{'s' if callers > 1 else ''}")
            results.append(await run_level(scenario, callers, on_turn=lambda _t: bar.update(1)))
    finally:
        bar.close()
    all_turns = [t for level in results for t in level["turns"]]
    return {"scenario": asdict(scenario), "levels": results, "summary": summarize(all_turns)}


async def wait_until_ready(url: str, timeout_s: float = READY_TIMEOUT_S) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=5) as http:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if (await http.get("/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.5)
    raise TimeoutError(f"{url} did not become ready within {timeout_s:.0f} s")


async def _one_call(scenario: Scenario, caller: int, plan, on_turn):
    kwargs = dict(caller=caller, reply_timeout_s=scenario.reply_timeout_s, on_turn=on_turn, agent=scenario.agent)
    if scenario.transport == "twilio":
        ws_url = scenario.url.replace("http://", "ws://").replace("https://", "wss://").rstrip("/") + "/ws/twilio"
        return await twilio_caller.call(ws_url, plan, **kwargs)
    if scenario.transport == "webrtc":
        return await webrtc_caller.call(scenario.url.rstrip("/") + "/api/offer", plan, **kwargs)
    if scenario.transport == "realtime":
        ws_url = scenario.url.replace("http://", "ws://").replace("https://", "wss://").rstrip("/") + "/v1/realtime"
        return await realtime_caller.call(ws_url, plan, **kwargs)
    raise ValueError(f"unknown transport {scenario.transport!r}; expected twilio, webrtc or realtime")


async def _server_call(http: httpx.AsyncClient, transport: str, outcome) -> dict | None:
    """The server's record of this call (its /api/calls), or None where it keeps none."""
    try:
        if transport == "twilio":
            response = await http.get("/api/calls", params={"external_id": outcome.call_sid})
            found = response.json().get("calls", []) if response.status_code == 200 else []
            call_id = found[0]["id"] if found else None
        else:
            call_id = outcome.call_id
        if call_id is None:
            return None
        response = await http.get(f"/api/calls/{call_id}")
        return response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None  # a baseline server without our API: caller-side figures only


def _failed_turn(caller: int, index: int, planned, transport: str, error: str) -> dict:
    u = planned.utterance
    record = TurnRecord(caller, index, u.text, u.voice, u.seconds, transport=transport, error=error)
    return record.to_json()


def _progress_bar(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="turn", disable=not enabled, leave=False)
