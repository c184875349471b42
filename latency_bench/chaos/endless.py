"""Chaos scenario: a caller who talks for minutes without a pause, against a running server.

One phone call speaks a long text, synthesized and looped to `minutes`, at the phone's real-time
pace, with no pause long enough to end a turn. The server must cut the turn into windows
Whisper can take (limits.max_user_turn_seconds, 30 s) and transcribe each, so the stored turn
holds the caller's words from the whole monologue, not only its last 30 s; its memory must stay
bounded (sampled from /metrics while the caller talks), and the reply must still come: the
LLM's prompt fits its context however long the turn. `run` returns the figures; `judge` judges them.

The session's memory is measured on a server that has already served one long turn (a
`warmup_s` monologue, cut once): what a fresh server takes for its first long turn it keeps for
every later call, so that growth is the process's, not this session's. The resident memory is
sampled every SAMPLE_EVERY_S through the call. What the session holds is the median of those
samples over the figure before the call (`rss_held_mb`), and what is left once it ended; the
highest sample (`rss_growth_mb`) is reported beside them. The peaks are Whisper's workspace
while it encodes a full 30 s window at a cut (+117 MB for a 30 s window in a fresh process:
`python -m latency_bench asr-workspace`): the engine's, one window at a time whichever call it
serves, and on a deployment with an ASR worker, in that worker's process, not the server's.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np

from latency_bench.callers import twilio_caller
from latency_bench.callers.conversation import PlannedTurn
from latency_bench.callers.speech import available_voices, speak_as
from latency_bench.chaos.admission import ws_url
from latency_bench.chaos.server_figures import metric_samples, process_figures, settle
from latency_bench.chaos.verdict import Verdict

# No sentence ends: a full stop is a pause in espeak-ng, and a pause could end the turn.
MONOLOGUE = (
    "so I was telling my neighbour about the garden and how the tomatoes came up early this year "
    "because of the warm spring and then the beans climbed all the way up the fence and the "
    "squirrels kept digging in the pots every morning while the cat just watched them from the "
    "window and my brother said I should put a net over everything but I think the birds would "
    "get caught in it so instead I planted some marigolds around the edges and watered them "
    "twice a day and now the whole corner smells like summer and the kids from next door come "
    "over to pick strawberries after school"
)
WORD_GAP_S = 0.06  # between the looped passes: a breath, far shorter than any turn-ending pause
SAMPLE_EVERY_S = 10.0
TURN_LIMIT_S = 30.0  # limits.max_user_turn_seconds of configs/default.yaml: a turn is cut this long


def monologue(seconds: float) -> tuple[np.ndarray, int, int]:
    """(int16 samples, rate, words spoken): MONOLOGUE looped to `seconds`."""
    samples, rate = speak_as(MONOLOGUE, available_voices()[0])
    gap = np.zeros(int(WORD_GAP_S * rate), dtype=np.int16)
    passes = max(1, int(np.ceil(seconds / (len(samples) / rate + WORD_GAP_S))))
    audio = np.concatenate([np.concatenate([samples, gap]) for _ in range(passes)])[: int(seconds * rate)]
    words = round(len(MONOLOGUE.split()) * len(audio) / (len(samples) + len(gap)))
    return audio, rate, words


async def _cut_figures(http: httpx.AsyncClient) -> tuple[float, float]:
    samples = metric_samples((await http.get("/metrics")).text).items()
    count = sum(v for (name, _), v in samples if name == "cadence_long_turn_cut_seconds_count")
    within = sum(v for (name, labels), v in samples
                 if name == "cadence_long_turn_cut_seconds_bucket" and dict(labels).get("le") == "30.0")
    return count, within


async def _sample_memory(http: httpx.AsyncClient, samples: list[tuple[float, float]], stop: asyncio.Event) -> None:
    """(seconds into the call, resident MB) every SAMPLE_EVERY_S until `stop`."""
    started = time.monotonic()
    while not stop.is_set():
        samples.append((round(time.monotonic() - started, 1), round((await process_figures(http))["rss_mb"], 1)))
        try:
            await asyncio.wait_for(stop.wait(), SAMPLE_EVERY_S)
        except TimeoutError:
            pass


async def run(base_url: str, *, minutes: float, warmup_s: float = 40.0) -> dict:
    """`warmup_s`: the monologue a first call speaks before the measured one (0: none)."""
    audio, rate, words_spoken = monologue(minutes * 60)
    plan = [PlannedTurn.of(audio, rate, MONOLOGUE)]
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        await settle(base_url)
        fresh = await process_figures(http)
        if warmup_s > 0:
            warmup, rate = monologue(warmup_s)[:2]
            await twilio_caller.call(f"{ws_url(base_url)}/ws/twilio", [PlannedTurn.of(warmup, rate, MONOLOGUE)],
                                     reply_timeout_s=120)
            await settle(base_url)
        before = await process_figures(http)
        cuts_before, within_before = await _cut_figures(http)
        samples: list[tuple[float, float]] = []
        stop = asyncio.Event()
        sampler = asyncio.create_task(_sample_memory(http, samples, stop))
        started = time.monotonic()
        try:
            result = await twilio_caller.call(f"{ws_url(base_url)}/ws/twilio", plan, reply_timeout_s=120)
        finally:
            stop.set()
            await sampler
        call_s = time.monotonic() - started
        cuts_after, within_after = await _cut_figures(http)
        await settle(base_url)
        after = await process_figures(http)
        stored = (await http.get("/api/calls", params={"external_id": result.call_sid})).json()["calls"]
        detail = (await http.get(f"/api/calls/{stored[0]['id']}")).json() if stored else {}
    turns = detail.get("turns", [])
    peak = max((rss for _, rss in samples), default=before["rss_mb"])
    held = float(np.median([rss for _, rss in samples])) if samples else before["rss_mb"]
    heard_words = sum(len((t.get("user_text") or "").split()) for t in turns)
    caller_turn = result.turns[0] if result.turns else None
    return {"minutes": minutes, "speech_seconds": round(len(audio) / rate, 1), "words_spoken": words_spoken,
            "call_seconds": round(call_s, 1), "cuts": cuts_after - cuts_before,
            "cuts_within_30s": within_after - within_before,
            "stored_turns": len(turns), "words_transcribed": heard_words,
            "reply_heard": bool(caller_turn and caller_turn.first_audible_at),
            "ttfs_ms": caller_turn.ttfs_ms if caller_turn else None,
            "reply_text": (turns[-1].get("reply_text") or "")[:200] if turns else "",
            "rss_fresh_mb": round(fresh["rss_mb"], 1), "warmup_s": warmup_s,
            "rss_before_mb": round(before["rss_mb"], 1), "rss_peak_mb": round(peak, 1),
            "rss_growth_mb": round(peak - before["rss_mb"], 1), "rss_held_mb": round(held - before["rss_mb"], 1),
            "rss_after_call_mb": round(after["rss_mb"], 1),
            "rss_mb_series": samples,
            "close_code": result.close_code, "error": result.error}


def judge(f: dict) -> Verdict:
    expected_cuts = int(f["speech_seconds"] // TURN_LIMIT_S)
    coverage = f["words_transcribed"] / f["words_spoken"] if f["words_spoken"] else 0.0
    kept = f["rss_after_call_mb"] - f["rss_before_mb"]
    passed = (f["cuts"] >= expected_cuts and f["cuts_within_30s"] == f["cuts"] and coverage >= 0.8
              and f["rss_held_mb"] <= 64 and f["reply_heard"] and f["error"] is None)
    return Verdict("endless", f"{f['minutes']:g} minutes of talk without a pause: cut and transcribed every "
                              f"{TURN_LIMIT_S:g} s at most (>= 80 % of the words in the stored turn), the session "
                              "holding +64 MB at most (the median sample through the call), the reply still heard",
                   f"{f['cuts']:.0f} cuts ({f['cuts_within_30s']:.0f} within {TURN_LIMIT_S:g} s) in "
                   f"{f['speech_seconds']:g} s; {f['words_transcribed']} of {f['words_spoken']} words in the stored "
                   f"turn ({coverage:.0%}); memory {f['rss_held_mb']:+.1f} MB held through the call, {kept:+.1f} MB "
                   f"once it ended, {f['rss_growth_mb']:+.1f} MB at the highest sample (Whisper's workspace at a "
                   f"30 s cut: latency_bench.components.asr_workspace); the server {f['rss_before_mb'] - f['rss_fresh_mb']:+.1f}"
                   f" MB since fresh, after a {f['warmup_s']:g} s warm-up turn; reply "
                   f"{'heard, TTFS %.0f ms' % f['ttfs_ms'] if f['reply_heard'] and f['ttfs_ms'] else 'NOT heard'}",
                   passed, f)
