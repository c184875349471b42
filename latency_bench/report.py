"""Writes a bench run to disk: results.json and PNG plots."""

from __future__ import annotations

import json
from pathlib import Path

from latency_bench.stats import STAGES, median_turn

STAGE_LABELS = {
    "asr_final": "speech end -> transcript",
    "retrieval": "-> passages retrieved",
    "llm_first_token": "-> LLM first token",
    "first_sentence": "-> first sentence to TTS",
    "tts_first_audio": "-> TTS first audio",
    "first_audio_sent": "-> audio sent",
    "caller_heard": "-> caller hears it",
}


def write(out: Path, results: dict) -> list[Path]:
    """results.json plus plots; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "results.json"]
    written[0].write_text(json.dumps(results, indent=2, default=str))  # Paths among the arguments
    import matplotlib

    matplotlib.use("Agg")  # files only: no display here or on servers
    turns = [t for level in results["levels"] for t in level["turns"]]
    written.append(plot_ttfs_distribution(out / "ttfs_distribution.png", turns, results["summary"]))
    median = median_turn(turns)
    if median is not None:
        written.append(plot_waterfall(out / "median_turn_waterfall.png", median))
    written.append(plot_ttfs_vs_callers(out / "ttfs_vs_callers.png", results["levels"]))
    return written


def plot_ttfs_distribution(path: Path, turns: list[dict], summary: dict) -> Path:
    import matplotlib.pyplot as plt

    values = [t["ttfs_ms"] for t in turns if t["ttfs_ms"] is not None]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.hist(values, bins=max(5, min(40, len(values) // 2 or 1)), color="#4c78a8", edgecolor="white")
    for q, style in (("p50", "-"), ("p95", "--"), ("p99", ":")):
        value = summary["caller"]["ttfs_ms"][q]
        if value is not None:
            ax.axvline(value, color="#e45756", linestyle=style, label=f"{q} {value:.0f} ms")
    ax.set_xlabel("TTFS as the caller hears it (ms)")
    ax.set_ylabel("turns")
    ax.set_title(f"Time to first sentence, {len(values)} turns")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_waterfall(path: Path, turn: dict) -> Path:
    """Each stage as a bar from the previous stage's time to its own, from the caller's end of speech."""
    import matplotlib.pyplot as plt

    stage_ms = turn["server"]["stage_ms"]
    marks = [(s, stage_ms[s]) for s in STAGES if stage_ms.get(s) is not None]
    marks.append(("caller_heard", turn["ttfs_ms"]))
    fig, ax = plt.subplots(figsize=(8, 3.6))
    start = 0.0
    for row, (stage, at) in enumerate(marks):
        width = max(at - start, 1.0)
        ax.barh(row, width, left=start, color="#72b7b2" if stage != "caller_heard" else "#f58518")
        ax.text(start + width + 8, row, f"+{at - start:.0f} ms", va="center", fontsize=8)
        start = max(start, at)
    ax.set_yticks(range(len(marks)), [STAGE_LABELS[s] for s, _ in marks])
    ax.invert_yaxis()
    ax.set_xlabel("ms after the caller stopped speaking")
    ax.set_title(f"Median turn: TTFS {turn['ttfs_ms']:.0f} ms ({turn['transport']}, caller {turn['caller']})")
    ax.set_xlim(0, start * 1.15 + 50)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_ttfs_vs_callers(path: Path, levels: list[dict]) -> Path:
    import matplotlib.pyplot as plt

    points = [(lv["callers"], lv["summary"]["caller"]["ttfs_ms"]) for lv in levels]
    fig, ax = plt.subplots(figsize=(6, 4))
    for q, marker in (("p50", "o"), ("p95", "s"), ("p99", "^")):
        xs = [c for c, d in points if d[q] is not None]
        ax.plot(xs, [d[q] for c, d in points if d[q] is not None], marker=marker, label=q)
    ax.set_xlabel("concurrent callers")
    ax.set_ylabel("TTFS (ms)")
    ax.set_title("TTFS against concurrent callers")
    ax.set_xticks(sorted({c for c, _ in points}))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
