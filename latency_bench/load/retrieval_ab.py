"""What retrieval costs a caller: TTFS with the agent's knowledge searched, against the same
agent with retrieval off, in one run.

    python -m latency_bench retrieval-ab --url URL [--agent default] [--rounds 3] [--turns 5] --out DIR

It defines `<agent>-no-retrieval` on the server (the agent's definition with
`knowledge.enabled: false`; removed afterwards), then alternates: a call of `--turns`
seeded questions to one, the same call to the other, `--rounds` times, so both see the same
questions, voices and machine load. It prints TTFS p50/p95 for each and the difference, and
the turn's wait for passages on the server (`retrieval` stage minus `asr_final`).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import httpx

from latency_bench.load import runner
from latency_bench.stats import distribution, summarize


def _retrieval_wait_ms(turn: dict) -> float | None:
    stages = (turn.get("server") or {}).get("stage_ms") or {}
    if "retrieval" in stages and "asr_final" in stages:
        return stages["retrieval"] - stages["asr_final"]
    return None


async def _twin(url: str, agent: str) -> str:
    """Defines the agent's twin without retrieval; returns its name."""
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        shown = (await http.get(f"/api/agents/{agent}")).raise_for_status().json()
        spec = dict(shown["spec"])
        spec.pop("knowledge_files", None)
        twin = f"{agent}-no-retrieval"
        spec.update(name=twin, knowledge={**spec.get("knowledge", {}), "enabled": False})
        await http.delete(f"/api/agents/{twin}")
        (await http.post("/api/agents", json=spec)).raise_for_status()
        return twin


async def run(scenario: runner.Scenario, rounds: int, out: Path) -> dict:
    await runner.wait_until_ready(scenario.url)
    agent = scenario.agent or "default"
    twin = await _twin(scenario.url, agent)
    turns: dict[str, list[dict]] = {agent: [], twin: []}
    try:
        for _ in range(rounds):
            for name in (agent, twin):
                level = await runner.run_level(replace(scenario, agent=name), callers=1)
                turns[name] += level["turns"]
    finally:
        async with httpx.AsyncClient(base_url=scenario.url, timeout=10) as http:
            await http.delete(f"/api/agents/{twin}")
    result = {"agent": agent, "rounds": rounds, "turns_per_call": scenario.turns}
    for name, label in ((agent, "retrieval_on"), (twin, "retrieval_off")):
        summary = summarize(turns[name])
        result[label] = {"turns": summary["turns"], "errors": summary["errors"],
                         "ttfs_ms": summary["caller"]["ttfs_ms"],
                         "server_retrieval_wait_ms": distribution(_retrieval_wait_ms(t) for t in turns[name])}
    on, off = result["retrieval_on"]["ttfs_ms"], result["retrieval_off"]["ttfs_ms"]
    result["ttfs_added_ms"] = {q: (round(on[q] - off[q], 1) if on[q] is not None and off[q] is not None else None)
                               for q in ("p50", "p95")}
    out.mkdir(parents=True, exist_ok=True)
    (out / "retrieval_ab.json").write_text(json.dumps({"summary": result, "turns": turns}, indent=1))
    return result
