"""Mid-sentence pauses: does the agent wait for the rest, and how soon does it answer?

Each call alternates two kinds of turn. A *paused* turn stops to think in the middle of a
sentence ("I need to change the delivery address for ... my order from last week."):
espeak-ng says the whole sentence with a break, so the words before it keep the voice of
an unfinished sentence, as a person's do. A *complete* turn is a plain question. A reply
whose first audio reaches the caller before the caller finished the sentence came inside
the pause: the agent cut the caller off.

    python -m latency_bench pauses --out DIR [--runs 3] [--pause-s 0.6] [--set turn_end.enabled=false]

Prints, per run and as the median over runs: replies inside the pauses (of how many),
TTFS of the complete questions (p50/p95, caller side), and the server's pause verdicts
and eager-reply outcomes (from /metrics) for the run.
"""

from __future__ import annotations

import re
import statistics
import subprocess
import tempfile
from pathlib import Path

import httpx
import numpy as np

from latency_bench.callers import twilio_caller
from latency_bench.callers.audio import read_wav
from latency_bench.callers.conversation import PlannedTurn
from latency_bench.callers.speech import Utterance, Voice, speak_as, trim_silence
from latency_bench.stats import percentile

# (the words before the pause, the rest); every pause falls where the sentence cannot end.
PAUSED_SENTENCES = (
    ("I need to change the delivery address for", "my order from last week."),
    ("Can you tell me about", "your opening hours on Saturday?"),
    ("I would like to", "book a table for two people tonight."),
    ("The package was supposed to arrive on", "Monday, but it never came."),
    ("My question is about the", "price of a large pizza."),
)
COMPLETE_QUESTIONS = (
    "What time do you open on Saturday?",
    "Where is my package right now?",
    "Can I book a table for two tonight?",
    "How much does a large pizza cost?",
    "Do you deliver to the city centre?",
)
VOICE = "en-us"
_SILENT_RMS = 0.01  # of full scale: a quieter 10 ms window counts as silence
_METRICS = ("cadence_turn_end_verdicts_total", "cadence_eager_replies_total")


def paused_utterance(before: str, after: str, pause_s: float, voice: str = VOICE) -> Utterance:
    """One sentence said with a break of `pause_s` after `before` (SSML, so the intonation
    before the break is that of a sentence going on)."""
    ssml = f'<speak>{before} <break time="{int(pause_s * 1000)}ms"/> {after}</speak>'
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "speech.wav"
        subprocess.run(["espeak-ng", "-m", "-v", voice, "-s", "160", "-w", str(out), ssml],
                       check=True, capture_output=True, timeout=30)
        samples, rate = read_wav(out)
    return Utterance(f"{before} ... {after}", f"espeak-ng:{voice}", trim_silence(samples, rate), rate)


def plain_utterance(text: str, voice: str = VOICE) -> Utterance:
    speaker = Voice("espeak-ng", voice)
    samples, rate = speak_as(text, speaker)  # the same voice and rate as the paused sentences
    return Utterance(text, speaker.label, samples, rate)


def longest_silence_s(samples: np.ndarray, rate: int) -> float:
    """The longest run of silent 10 ms windows inside the utterance (the pause as heard)."""
    window = rate // 100
    n = len(samples) // window
    frames = samples[: n * window].astype(np.float32).reshape(n, window) / 32768.0
    silent = np.sqrt((frames**2).mean(axis=1)) <= _SILENT_RMS
    longest = run = 0
    for quiet in silent:
        run = run + 1 if quiet else 0
        longest = max(longest, run)
    return longest / 100


def plan(pause_s: float) -> tuple[list[PlannedTurn], list[bool]]:
    """Paused and complete turns, alternating; and which of them are paused."""
    turns, paused = [], []
    for (before, after), question in zip(PAUSED_SENTENCES, COMPLETE_QUESTIONS):
        turns.append(PlannedTurn(paused_utterance(before, after, pause_s), pause_before_s=1.0))
        paused.append(True)
        turns.append(PlannedTurn(plain_utterance(question), pause_before_s=1.0))
        paused.append(False)
    return turns, paused


async def metric_counts(http: httpx.AsyncClient) -> dict[str, float]:
    text = (await http.get("/metrics")).text
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(_METRICS):
            name, value = line.rsplit(" ", 1)
            counts[name] = float(value)
    return counts


async def one_run(url: str, pause_s: float, *, agent: str | None = None) -> dict:
    turns, paused = plan(pause_s)
    ws_url = re.sub(r"^http", "ws", url.rstrip("/")) + "/ws/twilio"
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        before = await metric_counts(http)
        result = await twilio_caller.call(ws_url, turns, agent=agent)
        after = await metric_counts(http)
    records = result.turns
    in_pause = [r for r, p in zip(records, paused) if p and r.first_packet_at is not None
                and r.speech_end_at is not None and r.first_packet_at < r.speech_end_at]
    complete_ttfs = [r.ttfs_ms for r, p in zip(records, paused) if not p and r.ttfs_ms is not None]
    paused_ttfs = [r.ttfs_ms for r, p in zip(records, paused) if p and r.ttfs_ms is not None and r.ttfs_ms > 0]
    return {
        "paused_turns": sum(paused), "replies_in_pause": len(in_pause),
        "pause_s_heard": [round(longest_silence_s(t.utterance.samples, t.utterance.rate), 2)
                          for t, p in zip(turns, paused) if p],
        "complete_ttfs_ms": {"p50": percentile(complete_ttfs, 50), "p95": percentile(complete_ttfs, 95),
                             "n": len(complete_ttfs)},
        "paused_ttfs_ms_p50": percentile(paused_ttfs, 50),
        "errors": [r.error for r in records if r.error] + ([result.error] if result.error else []),
        "server": {k: after[k] - before.get(k, 0.0) for k in after if after[k] - before.get(k, 0.0)},
    }


def summary(runs: list[dict]) -> dict:
    def median(values):
        values = [v for v in values if v is not None]
        return round(statistics.median(values), 1) if values else None
    return {
        "runs": len(runs),
        "replies_in_pause": [r["replies_in_pause"] for r in runs],
        "paused_turns_per_run": runs[0]["paused_turns"] if runs else 0,
        "complete_ttfs_ms_median": {q: median([r["complete_ttfs_ms"][q] for r in runs]) for q in ("p50", "p95")},
        "paused_ttfs_ms_p50_median": median([r["paused_ttfs_ms_p50"] for r in runs]),
        "errors": sum(len(r["errors"]) for r in runs),
    }
