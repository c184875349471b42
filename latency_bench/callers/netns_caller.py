"""A WebRTC caller run inside a caller network (latency_bench/chaos/netns.py), as a process of its own:

    ip netns exec NS python -m latency_bench netns-caller --offer-url URL [--pause-s 1.5] [--turns 200]

It asks QUESTIONS in turn, a pause before each, until it has asked `--turns` or a line `stop`
arrives on stdin (asked before each turn), and writes one JSON object per line to stdout:

    {"event": "connected", "at": T, "call_id": ID}
    {"event": "turn", "index": I, "speech_end_at": T, "ttfs_ms": MS, "answered": bool, "error": ...}
    {"event": "done", "frames_sent": N, "silences": [[FROM, TO], ...], "error": ...}

`silences` are the spans (wall clock) in which no frame at all came from the server: a WebRTC
track carries silence between replies, so a span is the network's, not the agent's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time

from latency_bench.callers import webrtc_caller
from latency_bench.callers.conversation import PlannedTurn
from latency_bench.callers.listen import TurnRecord
from latency_bench.callers.speech import available_voices, speak_as

QUESTIONS = ("What time do you open on Saturday?", "Can I book an appointment for Tuesday?",
             "Where do I park when I arrive?", "Do you take walk-in patients?")
SILENCE_S = 0.2  # a gap between received frames longer than this is a silence (frames are 20 ms)


def emit(event: str, **fields) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


class SilenceLog:
    """Spans with no frame received: from the last frame before a gap to the first after it."""

    def __init__(self, min_gap_s: float = SILENCE_S) -> None:
        self._min_gap_s = min_gap_s
        self._last: float | None = None
        self.spans: list[tuple[float, float]] = []

    def heard(self, at: float) -> None:
        if self._last is not None and at - self._last > self._min_gap_s:
            self.spans.append((self._last, at))
        self._last = at


def _plan(turns: int, pause_s: float) -> list[PlannedTurn]:
    voice = available_voices()[0]
    spoken = [speak_as(text, voice) for text in QUESTIONS]
    return [PlannedTurn.of(*spoken[i % len(QUESTIONS)], QUESTIONS[i % len(QUESTIONS)], pause_before_s=pause_s)
            for i in range(turns)]


def _on_turn(turn: TurnRecord) -> None:
    emit("turn", index=turn.index, text=turn.text, speech_end_at=turn.speech_end_at, ttfs_ms=turn.ttfs_ms,
         answered=turn.first_audible_at is not None, error=turn.error)


def _watch_stdin(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    """In a daemon thread: a blocking read that nothing can cancel must not hold up the exit."""
    for line in sys.stdin:
        if line.strip() == "stop":
            break
    loop.call_soon_threadsafe(stop.set)  # `stop`, or EOF: the parent is gone


async def call(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    threading.Thread(target=_watch_stdin, args=(asyncio.get_running_loop(), stop), daemon=True).start()
    silences = SilenceLog()
    mic = webrtc_caller.MicrophoneTrack()
    error = None
    try:
        await webrtc_caller.call(args.offer_url, _plan(args.turns, args.pause_s), mic=mic,
                                 reply_timeout_s=args.reply_timeout_s, on_turn=_on_turn, stop_when=stop.is_set,
                                 on_connected=lambda call_id: emit("connected", at=time.time(), call_id=call_id),
                                 on_frame_heard=silences.heard)
    except Exception as exc:  # reported, not raised: the parent reads the figures either way
        error = f"{exc.__class__.__name__}: {exc}"
    emit("done", frames_sent=mic.frames_sent, silences=silences.spans, error=error)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m latency_bench netns-caller")
    parser.add_argument("--offer-url", required=True)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--pause-s", type=float, default=1.5)
    parser.add_argument("--reply-timeout-s", type=float, default=15.0)
    asyncio.run(call(parser.parse_args(argv)))
    return 0
