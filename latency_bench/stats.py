"""Summaries of bench turns: percentiles per caller-side metric and per server stage."""

from __future__ import annotations

from collections.abc import Iterable

from agent.ttfs_stats import percentile  # the product's one definition: interpolated, as numpy's

CALLER_METRICS = ("ttfs_ms", "ttfb_ms", "reply_seconds", "underruns", "barge_in_stop_ms")
STAGES = ("asr_final", "retrieval", "llm_first_token", "first_sentence", "tts_first_audio", "first_audio_sent")
QUANTILES = (50, 95, 99)


def distribution(values: Iterable[float | None]) -> dict:
    present = [v for v in values if v is not None]
    summary: dict = {"n": len(present)}
    for q in QUANTILES:
        value = percentile(present, q)
        summary[f"p{q}"] = None if value is None else round(value, 1)
    summary["mean"] = round(sum(present) / len(present), 1) if present else None
    summary["max"] = round(max(present), 1) if present else None
    return summary


# What the server says when a model failed the turn (pipelines/stt.py NOT_HEARD_REPLY,
# pipelines/llm.py FALLBACK_REPLY and CUT_SHORT_REPLY): a turn answered so was not answered.
APOLOGIES = ("didn't catch that", "lost my train of thought")


def is_apology(reply_text: str) -> bool:
    return any(apology in reply_text.lower() for apology in APOLOGIES)


def summarize(turns: list[dict]) -> dict:
    """`turns` as `TurnRecord.to_json()` gives them, with `server` joined where found."""
    answered = [t for t in turns if t["error"] is None]
    summary = {
        "turns": len(turns),
        "errors": len(turns) - len(answered),
        "error_kinds": _count(t["error"] for t in turns if t["error"]),
        "turns_with_underruns": sum(1 for t in turns if t["underruns"]),
        "caller": {m: distribution(t[m] for t in turns) for m in CALLER_METRICS},
        "server_stage_ms": {s: distribution(_stage(t, s) for t in turns) for s in STAGES},
        "server_ttfs_ms": distribution((t["server"] or {}).get("ttfs_ms") for t in turns),
        "final_transcript_ms": distribution(final_transcript_ms(t) for t in turns),
        "turns_joined_with_server": sum(1 for t in turns if t["server"]),
        "apologies": sum(1 for t in turns if is_apology((t["server"] or {}).get("reply_text") or "")),
    }
    return summary


def median_turn(turns: list[dict]) -> dict | None:
    """The turn whose caller-side TTFS is the median (lower middle), with server stages known."""
    timed = sorted((t for t in turns if t["ttfs_ms"] is not None and t["server"]), key=lambda t: t["ttfs_ms"])
    return timed[(len(timed) - 1) // 2] if timed else None


def final_transcript_ms(turn: dict) -> float | None:
    """From the caller's last voiced frame to the server's final transcript of the turn, on
    the one wall clock both read: the same yardstick for servers that time speech differently."""
    server = turn.get("server") or {}
    asr_final, end_of_speech_at = (server.get("stage_ms") or {}).get("asr_final"), server.get("end_of_speech_at")
    if asr_final is None or end_of_speech_at is None or turn.get("speech_end_at") is None:
        return None
    return round((end_of_speech_at + asr_final / 1000.0 - turn["speech_end_at"]) * 1000.0, 1)


def _stage(turn: dict, stage: str) -> float | None:
    return ((turn["server"] or {}).get("stage_ms") or {}).get(stage)


def _count(items: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return counts


def join_server_turns(caller_turns: list[dict], server_turns: list[dict], *, tolerance_s: float = 1.0) -> None:
    """Pairs each caller turn with the server turn whose end of speech is nearest in time.

    Caller and server read the same wall clock here; the server measures the end of
    speech on the audio it received, within tens of ms of when the caller sent it.
    Order alone is not enough: a barge-in or a lost turn shifts indexes.
    """
    free = list(server_turns)
    for turn in caller_turns:
        if turn.get("speech_end_at") is None:
            continue
        best = min(free, key=lambda s: abs(s["end_of_speech_at"] - turn["speech_end_at"]), default=None)
        if best is not None and abs(best["end_of_speech_at"] - turn["speech_end_at"]) <= tolerance_s:
            turn["server"] = {k: best[k] for k in ("index", "user_text", "reply_text", "interrupted",
                                                   "stage_ms", "ttfs_ms", "end_of_speech_at") if k in best}
            free.remove(best)
