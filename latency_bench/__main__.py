"""`python -m latency_bench run --url URL [--callers N] [--turns K] [--out DIR]`

Synthetic phone callers over the Twilio protocol; prints TTFS as callers hear it
(p50/p95) next to the server's own per-stage times for the same turns.
This is the foundation's measuring stick; the full bench (WebRTC, ramps, plots,
capacity, stock-pipecat comparison) is tracked separately.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path

import httpx

from latency_bench import twilio_caller
from latency_bench.audio import resample, speak

QUESTIONS = (
    "What is the capital of France?",
    "Can you tell me a fun fact about the ocean?",
    "How far away is the moon?",
    "What should I cook for dinner tonight?",
    "Why is the sky blue?",
    "What time does the sun usually set in summer?",
    "Recommend a good book for a long flight.",
    "How do I make a cup of green tea?",
)
VOICES = ("en-us", "en-gb", "en-us+f3")


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def prepare_utterances(turns: int, offset: int) -> list:
    utterances = []
    for i in range(turns):
        samples, rate = speak(QUESTIONS[(offset + i) % len(QUESTIONS)], voice=VOICES[(offset + i) % len(VOICES)])
        utterances.append(resample(samples, rate, twilio_caller.PHONE_RATE))
    return utterances


async def run(url: str, callers: int, turns: int, out: Path | None) -> dict:
    ws_url = url.replace("http://", "ws://").replace("https://", "wss://").rstrip("/") + "/ws/twilio"
    await wait_until_ready(url)
    plans = [prepare_utterances(turns, offset=c * turns) for c in range(callers)]
    results = await asyncio.gather(*(twilio_caller.call(ws_url, plan) for plan in plans))
    await asyncio.sleep(1.0)  # let the server persist the last turns
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        details = []
        for result in results:
            found = (await http.get("/api/calls", params={"external_id": result.call_sid})).json()["calls"]
            if found:
                details.append((await http.get(f"/api/calls/{found[0]['id']}")).json())
    client_ttfs = [t.ttfs_seconds * 1000 for r in results for t in r.turns if t.ttfs_seconds is not None]
    server_turns = [t for d in details for t in d.get("turns", [])]
    stage_medians = {}
    for stage in ("asr_final", "llm_first_token", "first_sentence", "tts_first_audio", "first_audio_sent"):
        values = [t["stage_ms"][stage] for t in server_turns if stage in t["stage_ms"]]
        stage_medians[stage] = statistics.median(values) if values else None
    summary = {
        "callers": callers,
        "turns_per_caller": turns,
        "turns_measured": len(client_ttfs),
        "turns_without_reply": sum(1 for r in results for t in r.turns if t.ttfs_seconds is None),
        "calls_closed_early": [r.close_code for r in results if len(r.turns) < turns],
        "client_ttfs_ms": {"p50": percentile(client_ttfs, 50), "p95": percentile(client_ttfs, 95),
                           "min": min(client_ttfs, default=None), "max": max(client_ttfs, default=None)},
        "server_ttfs_ms": {"p50": percentile([t["ttfs_ms"] for t in server_turns if t["ttfs_ms"]], 50),
                           "p95": percentile([t["ttfs_ms"] for t in server_turns if t["ttfs_ms"]], 95)},
        "server_stage_median_ms": stage_medians,
    }
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        turns_out = [{"caller": i, "ttfs_ms": None if t.ttfs_seconds is None else t.ttfs_seconds * 1000,
                      "reply_seconds": t.reply_seconds} for i, r in enumerate(results) for t in r.turns]
        (out / "results.json").write_text(json.dumps({"summary": summary, "turns": turns_out,
                                                      "server_calls": details}, indent=2))
    return summary


async def wait_until_ready(url: str, timeout_s: float = 120.0) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=5) as http:
        for _ in range(int(timeout_s / 0.5)):
            try:
                if (await http.get("/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.5)
    raise SystemExit(f"{url} did not become ready within {timeout_s:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="latency_bench")
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="measure TTFS with synthetic phone callers")
    run_p.add_argument("--url", default="http://127.0.0.1:8000")
    run_p.add_argument("--transport", default="twilio", choices=["twilio"])
    run_p.add_argument("--callers", type=int, default=1)
    run_p.add_argument("--turns", type=int, default=10)
    run_p.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    summary = asyncio.run(run(args.url, args.callers, args.turns, args.out))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
