"""Reply quality of a running server, as callers get it: grounded answers, refusals, length.

    python -m latency_bench quality --url URL --agent NAME --out DIR [--no-spoken] [--runs 1]

Every question of `quality_set.json` goes through the server's text chat
(`POST /api/agents/{name}/chat`); the `spoken` ones also through a real phone call each
(the synthetic Twilio caller of `twilio_caller`, a fresh call per question so no history
carries over, as in the chat). Replies are judged by `latency_bench.quality.reply_quality`.

Seconds of speech: a text reply is synthesised offline with the server's own voice
(Piper, from the config's `tts` section); a spoken reply is what the caller heard. The
reply text of a call comes from the server's record of it (`GET /api/calls/{id}`).
Writes DIR/quality.json (every reply with its verdicts) and returns the summary.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

import httpx
import websockets

from latency_bench.quality.reply_quality import judge, score

ROOT = Path(__file__).resolve().parents[2]
QUESTION_SET = Path(__file__).with_name("quality_set.json")
DEFAULT_CONFIG = ROOT / "configs" / "default.yaml"
CHAT_TIMEOUT_S = 120.0  # a reply on a loaded 2-core server takes seconds; a stuck one fails the question
PCM_BYTES_PER_SAMPLE = 2
SUMMARY_KEYS = ("n", "errors", "accuracy", "refusal_rate", "unsure_rate", "median_words", "median_seconds",
                "injection_n", "injection_leaks")


class ChatError(RuntimeError):
    """The chat endpoint answered with an error (HTTP status or an `error` event)."""


def parse_sse_line(line: str) -> dict | None:
    """One server-sent-events line -> its JSON event; None for blank lines, comments and other fields."""
    if not line.startswith("data:"):
        return None
    payload = line[len("data:"):].strip()
    return json.loads(payload) if payload else None


async def chat(http: httpx.AsyncClient, agent: str, message: str) -> dict:
    """The `done` event of one chat turn with no history: reply, passages, timing_ms."""
    async with http.stream("POST", f"/api/agents/{agent}/chat", json={"message": message, "history": []},
                           timeout=CHAT_TIMEOUT_S) as response:
        if response.status_code != 200:
            body = (await response.aread()).decode(errors="replace")[:300]
            raise ChatError(f"chat with {agent!r}: HTTP {response.status_code}: {body}")
        async for line in response.aiter_lines():
            event = parse_sse_line(line)
            if event is None:
                continue
            if event.get("type") == "done":
                return event
            if event.get("type") == "error":
                raise ChatError(f"chat with {agent!r}: {event.get('error')}")
    raise ChatError(f"chat with {agent!r}: the stream ended without a 'done' event")


class SpeechTimer:
    """Seconds a reply lasts in the server's own voice, synthesised here (no server involved)."""

    def __init__(self, config_path: Path = DEFAULT_CONFIG) -> None:
        from agent.config import load_config
        from models.piper_tts import PiperTTSEngine

        self._engine = PiperTTSEngine(load_config(config_path).tts)

    def load(self) -> None:
        self._engine.load()

    async def seconds(self, text: str) -> float:
        if not text.strip():
            return 0.0
        pcm_bytes = 0
        async for chunk in self._engine.synthesize(text):
            pcm_bytes += len(chunk)
        return pcm_bytes / PCM_BYTES_PER_SAMPLE / self._engine.sample_rate

    async def close(self) -> None:
        await self._engine.close()


async def ask_text(http: httpx.AsyncClient, agent: str, questions: Sequence[Mapping], *, system_prompt: str,
                   seconds_of: Callable[[str], Awaitable[float]], run: int = 0) -> list[dict]:
    records = []
    for question in questions:
        record = {"run": run, "path": "text", "question": question["question"]}
        try:
            done = await chat(http, agent, question["question"])
        except (ChatError, httpx.HTTPError, ValueError) as exc:
            records.append({**record, "id": question["id"], "error": str(exc)})
            continue
        reply = done.get("reply", "")
        verdict = judge(question, reply, system_prompt=system_prompt, seconds=await seconds_of(reply))
        records.append({**record, **verdict, "sources": sorted({p.get("source") for p in done.get("passages", [])}),
                        "passages": done.get("passages", []), "timing_ms": done.get("timing_ms")})
    return records


async def ask_spoken(url: str, agent: str, questions: Sequence[Mapping], *, system_prompt: str,
                     run: int = 0) -> list[dict]:
    """One phone call per question, voices rotating; the reply text from the server's call record."""
    from latency_bench.callers import twilio_caller
    from latency_bench.load.runner import _server_call
    from latency_bench.callers.conversation import PlannedTurn
    from latency_bench.callers.speech import available_voices, synthesize
    from latency_bench.stats import join_server_turns

    ws_url = url.replace("http://", "ws://").replace("https://", "wss://").rstrip("/") + "/ws/twilio"
    voices = available_voices()
    # Synthesised before the first call: a caller that stalls its event loop mid-call sends late frames.
    utterances = await asyncio.to_thread(
        lambda: [synthesize(q["question"], voices[(i + run) % len(voices)]) for i, q in enumerate(questions)])
    records = []
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        for question, utterance in zip(questions, utterances):
            record = {"run": run, "path": "spoken", "id": question["id"], "question": question["question"],
                      "voice": utterance.voice}
            try:
                outcome = await twilio_caller.call(ws_url, [PlannedTurn(utterance, pause_before_s=0.6)], agent=agent)
            except (OSError, TimeoutError, websockets.WebSocketException) as exc:
                records.append({**record, "error": f"call failed: {exc.__class__.__name__}: {exc}"})
                continue
            turns = [t.to_json() for t in outcome.turns]
            await asyncio.sleep(1.0)  # the server stores a call's turns as the call ends
            server_call = await _server_call(http, "twilio", outcome)
            if server_call is not None:
                join_server_turns(turns, server_call.get("turns", []))
            heard = turns[0] if turns else {}
            server_turn = heard.get("server") or {}
            error = outcome.error or heard.get("error") or (None if server_turn else "no server record of the turn")
            if error:
                records.append({**record, "error": error, "heard_seconds": heard.get("reply_seconds")})
                continue
            verdict = judge(question, server_turn.get("reply_text", ""), system_prompt=system_prompt,
                            seconds=heard.get("reply_seconds"))
            records.append({**record, **verdict, "heard_text": server_turn.get("user_text"),
                            "ttfs_ms": heard.get("ttfs_ms")})
    return records


def summarize_quality(records: Sequence[Mapping]) -> dict:
    """Per path (text, spoken): accuracy, refusal rate, median words and seconds, n, errors."""
    summary = {}
    for path in ("text", "spoken"):
        mine = [r for r in records if r["path"] == path]
        if not mine:
            continue
        judged = [r for r in mine if "error" not in r]
        figures = {**score(judged), "n": len(judged), "errors": len(mine) - len(judged)}
        summary[path] = {k: figures[k] for k in SUMMARY_KEYS}
    return summary


async def _agent_prompt(http: httpx.AsyncClient, agent: str) -> str:
    """The agent's system prompt, to tell whether an injection drew it out ('' if not shown)."""
    try:
        response = await http.get(f"/api/agents/{agent}")
        return (response.json().get("spec") or {}).get("system_prompt", "") if response.status_code == 200 else ""
    except (httpx.HTTPError, ValueError):
        return ""


async def measure(url: str, agent: str, *, spoken: bool = True, runs: int = 1, config: Path = DEFAULT_CONFIG,
                  question_set: Path = QUESTION_SET) -> dict:
    from latency_bench.load.runner import wait_until_ready

    questions = json.loads(question_set.read_text())["questions"]
    await wait_until_ready(url)
    timer = SpeechTimer(config)
    await asyncio.to_thread(timer.load)
    records: list[dict] = []
    started = time.time()
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            prompt = await _agent_prompt(http, agent)
            for run in range(runs):
                records += await ask_text(http, agent, questions, system_prompt=prompt, seconds_of=timer.seconds,
                                          run=run)
                if spoken:
                    records += await ask_spoken(url, agent, [q for q in questions if q.get("spoken")],
                                                system_prompt=prompt, run=run)
    finally:
        await timer.close()
    return {"url": url, "agent": agent, "runs": runs, "started_at": started,
            "seconds": round(time.time() - started, 1), "summary": summarize_quality(records), "replies": records}


def write(out: Path, results: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "quality.json").write_text(json.dumps(results, indent=1))

