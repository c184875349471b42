"""TTFS of one agent through each way in, on one server: the phone socket, WebRTC, /v1/realtime,
and the phone socket to a relay agent whose speech-to-speech adapter is a Realtime client of
the same server (a cascade behind a cascade: the cost of the hop).

One caller at a time, the same questions (the seed fixes them) in every run; the ways in
alternate within each run so that drift on the machine falls on all of them alike. Reported:
each way's caller-side TTFS p50 and p95 per run, and their medians over the runs.
"""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import replace

import httpx

from latency_bench.load import runner

RELAY = "relay"
WAYS = ("twilio", "webrtc", "realtime", "twilio-relay")


def relay_agent(ws_url: str, agent: str) -> dict:
    """A speech-to-speech agent whose remote is this server's `agent` over /v1/realtime."""
    return {"name": RELAY, "system_prompt": "You relay the caller to another agent.", "pipeline": "openai-realtime",
            "speech_to_speech": {"base_url": f"{ws_url}/v1/realtime", "model": agent}}


async def create_relay(url: str, agent: str) -> None:
    spec = relay_agent(url.replace("http://", "ws://").replace("https://", "wss://").rstrip("/"), agent)
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        answer = await http.post("/api/agents", json=spec)
        if answer.status_code == 409:
            answer = await http.put(f"/api/agents/{RELAY}", json=spec)
        if answer.status_code not in (200, 201):
            raise RuntimeError(f"the relay agent was refused: {answer.status_code} {answer.text[:300]}")


def _scenario(base: runner.Scenario, way: str) -> runner.Scenario:
    if way == "twilio-relay":
        return replace(base, transport="twilio", agent=RELAY)
    return replace(base, transport=way)


async def measure(base: runner.Scenario, runs: int, ways: tuple[str, ...] = WAYS) -> dict:
    """`runs` rounds; in each, one call of `base.turns` turns through every way in turn."""
    await runner.wait_until_ready(base.url)
    if "twilio-relay" in ways:
        await create_relay(base.url, base.agent or "default")
    per_run: dict[str, list[dict]] = {way: [] for way in ways}
    for _ in range(runs):
        for way in ways:
            level = await runner.run_level(_scenario(base, way), 1)
            summary = level["summary"]
            per_run[way].append({"ttfs_ms": {q: summary["caller"]["ttfs_ms"][q] for q in ("p50", "p95")},
                                 "server_ttfs_ms_p50": summary["server_ttfs_ms"]["p50"],
                                 "errors": summary["errors"], "turns": summary["turns"]})
    return {"runs": per_run, "summary": summarize(per_run)}


def summarize(per_run: dict[str, list[dict]]) -> dict:
    def median(values: list) -> float | None:
        values = [v for v in values if v is not None]
        return round(statistics.median(values), 1) if values else None

    summary = {}
    for way, runs in per_run.items():
        summary[way] = {"ttfs_ms_p50": median([r["ttfs_ms"]["p50"] for r in runs]),
                        "ttfs_ms_p95": median([r["ttfs_ms"]["p95"] for r in runs]),
                        "server_ttfs_ms_p50": median([r["server_ttfs_ms_p50"] for r in runs]),
                        "errors": sum(r["errors"] for r in runs)}
    phone = summary.get("twilio", {}).get("ttfs_ms_p50")
    for way, figures in summary.items():
        if phone is not None and figures["ttfs_ms_p50"] is not None:
            figures["p50_minus_phone_ms"] = round(figures["ttfs_ms_p50"] - phone, 1)
    return summary


def run(base: runner.Scenario, runs: int, ways: tuple[str, ...] = WAYS) -> dict:
    return asyncio.run(measure(base, runs, ways))
