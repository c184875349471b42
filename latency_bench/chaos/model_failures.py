"""Chaos scenario: model workers that die or get stuck in the middle of calls (issue 13,
scenario 13), on real models, each in its own worker process (configs/deployments/cpu-workers.yaml).

Two phone callers talk to one server. One is the faulted caller: in each fault case one of
its turns meets a worker (ASR, LLM or TTS) that is killed (SIGKILL: a crash, its request
failing at once) or stopped (SIGSTOP: a hang, nothing coming back) while that turn is being
served, and its next turn checks that the call goes on. The other is the clean caller,
talking all along; its TTFS p95 during the faults is set against a first round with no
faults. A stopped worker is left stopped: the server's supervisor must find it stuck and
restart it, as it restarts one that crashed.

Per fault: whether the faulted turn was answered (an apology; for the voice, the CPU
fallback voice; for the ASR, a real reply on the in-process Whisper's transcript), how long
after the failure was known (at once for a kill; a stop is known
when the deadline passes), what the server stored, whether the next turn was a real answer,
and how long until the worker was back. The clean caller shares the worker, so its turns in
flight at a fault meet it too; they are counted. `run` returns the figures; `judge` decides:
a case passes when it is heard within ANSWER_WITHIN_S of being known, or when it was answered
for real (not an apology) no later than the clean caller's healthy TTFS p95 (the fault was
masked: the caller could not tell).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import httpx
import yaml

from agent.config import CadenceConfig
from latency_bench import servers
from latency_bench.callers import twilio_caller
from latency_bench.callers.conversation import PlannedTurn
from latency_bench.callers.listen import TurnRecord
from latency_bench.callers.speech import available_voices, speak_as
from latency_bench.chaos.admission import ws_url
from latency_bench.chaos.server_figures import metric_by_labels, poll_until
from latency_bench.chaos.verdict import Verdict
from latency_bench.stats import is_apology, percentile

CPU_WORKERS = "configs/deployments/cpu-workers.yaml"
FAULTS = (("asr", "killed"), ("asr", "stopped"), ("llm", "killed"), ("llm", "stopped"),
          ("tts", "killed"), ("tts", "stopped"))
QUESTIONS = ("What time do you open on Saturday?", "Can I book a table for two tonight?",
             "Do you have parking near the entrance?", "How much is the lunch menu?")
# Said by the server instead of a reply (pipelines/llm.py, pipelines/stt.py).
PAUSE_S = 1.5  # between a reply and the caller's next words
# Before the turn after a fault: a stuck worker is found by the supervisor's probes (~6-12 s)
# and restarted (~1-3 s to load); the turn then shows whether the call goes on.
RECOVERY_PAUSE_S = 20.0
BASELINE_TURNS = 8  # the faulted caller's turns before the first fault: the clean caller's baseline
# The clean caller's healthy turns the verdict needs (its first, on a fresh server, not among them:
# cold caches are not health); fewer, and its p95 is one or two turns' noise (3 turns: one cold
# first turn made it 8.6 s, and a fault case "passed" against it).
MIN_BASELINE_TURNS = 4
ANSWER_WITHIN_S = 2.0  # the pass figure: heard this long after the failure is known
BACK_WITHIN_S = 30.0
# A logged stall belongs to a turn when it came within this of the turn's start plus its deadline:
# the gap between the bench's fault or end of speech and the server's request, and the log write.
STALL_LOG_SLACK_S = 1.0
TURN_END_WAIT_S = 1.0  # the VAD's longest wait after speech before a turn ends (turn_end.incomplete_pause_s)
_STARTED = re.compile(r"worker (\S+) started \(pid (\d+)\) on \S+ at (\S+)")


@dataclass(frozen=True)
class Worker:
    name: str
    pid: int
    url: str


def workers_in(log_text: str) -> dict[str, Worker]:
    """Each worker's newest process, from the server's INFO log (the supervisor logs each start)."""
    found = {}
    for name, pid, url in _STARTED.findall(log_text):
        found[name] = Worker(name, int(pid), url)
    return found


def serving_replica(health: dict, role: str, workers: dict[str, Worker]) -> Worker | None:
    """Of a role's replicas (workers named <role>-<i>), the one the server has requests in flight
    at, from its /api/health; None while none or several have (which one serves the turn is then
    not known)."""
    by_url = {w.url: w for name, w in workers.items() if name.startswith(f"{role}-")}
    busy = [r["url"] for r in health.get("engines", {}).get(role, {}).get("replicas", ()) if r["in_flight"] > 0]
    return by_url.get(busy[0]) if len(busy) == 1 else None


def deadlines_of(config: CadenceConfig) -> dict[str, Callable[[float], float]]:
    """Per model, seconds of speech -> how long the server waits on it before it gives up:
    the transcript's deadline, the reply's first token (its base: the prompt adds to it, and
    the bench takes that from the server's log), the worker voice's fallback."""
    return {"asr": config.deadlines.asr_seconds_for,
            "llm": lambda seconds: config.deadlines.llm_first_token_seconds,
            "tts": lambda seconds: config.tts.fallback_after_seconds}


@contextlib.contextmanager
def server(out: Path, *, config: Path = servers.DEFAULT_CONFIG,
           llm_replicas: int = 1) -> Iterator[tuple[str, Callable[[], str]]]:
    """The default config with every model in a worker (the LLM in `llm_replicas` processes);
    its log at INFO (worker starts)."""
    log = out / "cadence.log"
    deployment = CPU_WORKERS
    if llm_replicas > 1:
        out.mkdir(parents=True, exist_ok=True)
        spec = yaml.safe_load(Path(CPU_WORKERS).read_text())
        spec["workers"]["llm"]["replicas"] = llm_replicas
        deployment = str((out / "deployment.yaml").resolve())
        Path(deployment).write_text(yaml.safe_dump(spec, sort_keys=False))
    with servers.cadence(out, max_calls=2, config=config, deployment=deployment, log_level="info") as base_url:
        yield base_url, log.read_text


def _plan(turns: int, *, voice: str, offset: int = 0, recovery_turns: frozenset[int] = frozenset()) -> list[PlannedTurn]:
    plan = []
    for i in range(turns):
        text = QUESTIONS[(i + offset) % len(QUESTIONS)]
        samples, rate = speak_as(text, voice)
        plan.append(PlannedTurn.of(samples, rate, text,
                                   pause_before_s=RECOVERY_PAUSE_S if i in recovery_turns else PAUSE_S))
    return plan


class FaultInjector:
    """Arms one fault per fault case on the faulted caller's turns, told of each turn as it
    completes (`turn_done`). A fault on the ASR lands while the turn is being spoken; on the
    LLM when the turn has ended (its reply being generated); on the TTS once the reply's first
    words are written (its first sentence being synthesised)."""

    def __init__(self, http: httpx.AsyncClient, read_log: Callable[[], str], call_sid: str,
                 faults: tuple[tuple[str, str], ...], *, baseline_turns: int) -> None:
        self._http, self._read_log, self._call_sid = http, read_log, call_sid
        self._faults = list(faults)
        self._baseline_turns = baseline_turns
        self._turn_done: asyncio.Queue[TurnRecord] = asyncio.Queue()
        self.cases: list[dict] = []

    def turn_done(self, turn: TurnRecord) -> None:
        self._turn_done.put_nowait(turn)

    async def _call(self) -> dict:
        calls = (await self._http.get("/api/calls", params={"external_id": self._call_sid})).json()["calls"]
        return (await self._http.get(f"/api/calls/{calls[0]['id']}")).json() if calls else {}

    async def _turns(self) -> list[dict]:
        return (await self._call()).get("turns", [])

    async def _until(self, condition, timeout_s: float = 60.0) -> None:
        if not await poll_until(condition, timeout_s, every_s=0.02):
            raise TimeoutError(f"the caller's turn did not reach the fault's moment within {timeout_s:.0f} s")

    async def run(self, plan: list[PlannedTurn]) -> None:
        """Turn by turn: baseline turns pass; then each fault case takes two turns (the faulted
        one and the one after it)."""
        for _ in range(self._baseline_turns - 1):
            await self._turn_done.get()
        for role, kind in self._faults:
            await self._turn_done.get()  # the turn before the faulted one is over: its pause begins
            before = len(await self._turns())
            spoken_s = plan[self._baseline_turns + 2 * len(self.cases)].utterance.seconds
            if role == "asr":
                await asyncio.sleep(PAUSE_S + spoken_s / 2)  # mid-utterance: its transcription is next
            else:
                # The LLM: once the turn's passages are found its reply's request goes out (an agent
                # without knowledge: its first token); the TTS: its first sentence is being written.
                stages = ("llm_first_token",) if role == "tts" else ("retrieval", "llm_first_token")
                await self._until(lambda: self._new_turn_at(before, stages))
            worker = await self._target(role)
            backs_before = len(self._backs(worker))
            fault_at = time.time()
            os.kill(worker.pid, signal.SIGKILL if kind == "killed" else signal.SIGSTOP)
            faulted = await self._turn_done.get()
            back_s = await self._back_after(worker, fault_at, backs_before)
            self.cases.append({"role": role, "kind": kind, "fault_at": fault_at, "worker": worker.name,
                               "pid": worker.pid, "turn": faulted, "back_after_s": back_s})
        await self._turn_done.get()  # the last case's next turn

    async def _target(self, role: str) -> Worker:
        """The role's worker; of several replicas, the one serving the faulted turn (the only one
        with requests in flight: the other caller's, if any, went to the same one)."""
        workers = workers_in(self._read_log())
        if role in workers:
            return workers[role]
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            found = serving_replica((await self._http.get("/api/health")).json(), role, workers)
            if found is not None:
                return found
            await asyncio.sleep(0.02)
        raise TimeoutError(f"no single {role} replica was serving the faulted turn within 10 s")

    async def _new_turn_at(self, before: int, stages: tuple[str, ...]) -> bool:
        turns = await self._turns()
        return len(turns) > before and any(stage in turns[-1].get("stage_ms", {}) for stage in stages)

    def _backs(self, worker: Worker) -> list[float]:
        """When the supervisor logged the worker back (ready), each time, as Unix times."""
        pattern = rf"^(\S+ \S+) INFO workers\.supervisor: worker {re.escape(worker.name)} is back"
        return [datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
                for stamp in re.findall(pattern, self._read_log(), re.MULTILINE)]

    async def _back_after(self, worker: Worker, fault_at: float, backs_before: int) -> float | None:
        """Seconds from the fault until the supervisor had the worker back."""
        deadline = time.monotonic() + 2 * BACK_WITHIN_S
        while time.monotonic() < deadline:
            backs = self._backs(worker)
            if len(backs) > backs_before:
                return round(backs[backs_before] - fault_at, 1)
            await asyncio.sleep(0.1)
        return None


# The server's line when it gives up on a reply's first token, counted from the request or from
# llama-server's last report of progress through the prompt (for a server that reports none, the
# deadline grows with the prompt: deadlines.llm_first_token_per_1k_prompt_chars); only the server
# knows when that was.
# The server's own lines when it gives up waiting on a model, with how long after the request:
# a deadline passed (pipelines/llm.py, pipelines/stt.py), or, for a worker, its probe unanswered
# (models/remote.py; the transcript is then made in-process, a real reply).
_STALL_LINES = {
    "llm": re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[.,]\d{3}) .*LLM reply: no first answer within ([0-9.]+) s",
                      re.MULTILINE),
    "asr": re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[.,]\d{3}) .*(?:no transcript within|"
                      r"asr worker at \S+ went silent: no answer) ([0-9.]+) s", re.MULTILINE),
}


def stalls_logged(log_text: str, role: str) -> list[tuple[float, float]]:
    """(when, after how many seconds) of every request of `role` ("llm", "asr") the server gave
    up waiting for, as Unix times."""
    return [(datetime.strptime(stamp.replace(",", "."), "%Y-%m-%d %H:%M:%S.%f").timestamp(), float(seconds))
            for stamp, seconds in _STALL_LINES[role].findall(log_text)]


def _logged_give_up(role: str, start: float, stalls: list[tuple[float, float]]) -> float | None:
    """Of the logged stalls, when the server gave up on the turn that ended at `start`, if one
    fits. An LLM's: the one whose time best fits the turn's start plus the deadline it names. A
    transcript's deadline runs from the VAD's stop, up to TURN_END_WAIT_S after the end of speech
    (and counts the turn's trailing silence): the one whose request began (its time less its
    deadline) nearest the end of speech, within that wait."""
    if role == "llm":
        fitting = [(abs(at - (start + seconds)), at) for at, seconds in stalls]
        fitting = [pair for pair in fitting if pair[0] <= STALL_LOG_SLACK_S]
    else:
        fitting = [(abs(at - seconds - start), at) for at, seconds in stalls
                    if -STALL_LOG_SLACK_S <= at - seconds - start <= TURN_END_WAIT_S + STALL_LOG_SLACK_S]
    return min(fitting)[1] if fitting else None


def _known_at(case: dict, turn: TurnRecord, deadlines: dict[str, Callable[[float], float]],
              stalls: dict[str, list[tuple[float, float]]] | None = None) -> float:
    """When the server could know the turn had failed: a killed worker's request fails at once
    (or the next one is refused); a stopped one's at the deadline, counted from the fault or
    from the end of speech, whichever is later (the request starts no earlier). A stopped LLM's
    or ASR's is when the server logged giving up on this turn (`_logged_give_up`); the
    configured deadline from that start where none fits."""
    start = max(case["fault_at"], turn.speech_end_at or case["fault_at"])
    if case["kind"] == "killed":
        return start
    logged = _logged_give_up(case["role"], start, (stalls or {}).get(case["role"], []))
    if logged is not None:
        return logged  # when the server gave up: the failure known
    return start + deadlines[case["role"]](turn.utterance_seconds)


def _ttfs(turns: list[TurnRecord]) -> list[float]:
    return [t.ttfs_ms for t in turns if t.ttfs_ms is not None]


async def run(base_url: str, *, read_log: Callable[[], str], faults: tuple[tuple[str, str], ...] = FAULTS,
              deadlines: dict[str, Callable[[float], float]], baseline_turns: int = BASELINE_TURNS) -> dict:
    """`deadlines`: role -> seconds of speech -> the server's deadline for that model.
    `baseline_turns`: the faulted caller's turns before the first fault."""
    voices = available_voices()
    turns = baseline_turns + 2 * len(faults)
    faulted_plan = _plan(turns, voice=voices[0],
                         recovery_turns=frozenset(baseline_turns + 2 * i + 1 for i in range(len(faults))))
    faulted_sid = "CA" + uuid.uuid4().hex
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as http:
        injector = FaultInjector(http, read_log, faulted_sid, faults, baseline_turns=baseline_turns)
        clean_done = asyncio.Event()

        async def clean_caller() -> list[TurnRecord]:
            records: list[TurnRecord] = []
            clean_plan = _plan(4, voice=voices[-1], offset=2)
            while not clean_done.is_set():
                result = await twilio_caller.call(f"{ws_url(base_url)}/ws/twilio", clean_plan, caller=1,
                                                  reply_timeout_s=30)
                records.extend(result.turns)
            return records

        clean = asyncio.create_task(clean_caller())
        inject = asyncio.create_task(injector.run(faulted_plan))
        result = await twilio_caller.call(f"{ws_url(base_url)}/ws/twilio", faulted_plan, call_sid=faulted_sid,
                                          on_turn=injector.turn_done, reply_timeout_s=30)
        clean_done.set()
        clean_turns = await clean
        await asyncio.wait_for(inject, 120)
        stored = (await injector._call()).get("turns", [])
        failures_counted = await metric_by_labels(http, "cadence_model_failures_total")
    log_text = read_log()
    stalls = {role: stalls_logged(log_text, role) for role in _STALL_LINES}
    first_fault = min((c["fault_at"] for c in injector.cases), default=time.time())
    baseline = [t for t in clean_turns[1:] if t.speech_end_at and t.speech_end_at < first_fault]
    during = [t for t in clean_turns if t.speech_end_at and t.speech_end_at >= first_fault]
    stored_by_end = {round(t.get("end_of_speech_at") or 0, 1): t for t in stored}
    cases = []
    for case in injector.cases:
        turn: TurnRecord = case["turn"]
        nxt = result.turns[turn.index + 1] if turn.index + 1 < len(result.turns) else None
        reply = _stored_reply(stored, turn)
        heard_at = turn.first_audible_at
        known = _known_at(case, turn, deadlines, stalls)
        cases.append({
            "fault": f"{case['role']} {case['kind']}", "answered": heard_at is not None,
            "answer_after_known_ms": round((heard_at - known) * 1000) if heard_at else None,
            "ttfs_ms": turn.ttfs_ms, "reply": reply[:160], "apology": is_apology(reply),
            "next_turn_answered": bool(nxt and nxt.first_audible_at and not is_apology(_stored_reply(stored, nxt))),
            "back_after_s": case["back_after_s"], "error": turn.error})
    return {"faults": cases, "faulted_turns": len(result.turns), "close_code": result.close_code,
            "error": result.error, "stored_turns": len(stored_by_end),
            "clean_caller": {"baseline_turns": len(baseline), "during_turns": len(during),
                             "baseline_p95_ms": percentile(_ttfs(baseline), 95) if baseline else None,
                             "during_p95_ms": percentile(_ttfs(during), 95) if during else None,
                             "during_unanswered": sum(1 for t in during if t.first_audible_at is None)},
            "model_failures_metric": failures_counted}  # "kind/model" -> count


def _stored_reply(stored: list[dict], turn: TurnRecord) -> str:
    """The server's reply text for the caller's turn: the stored turn whose end of speech is nearest."""
    if not stored or turn.speech_end_at is None:
        return ""
    nearest = min(stored, key=lambda t: abs((t.get("end_of_speech_at") or 0) - turn.speech_end_at))
    return nearest.get("reply_text") or ""


def judge(f: dict) -> Verdict:
    cases = f["faults"]
    clean = f["clean_caller"]
    base, during = clean["baseline_p95_ms"], clean["during_p95_ms"]

    def heard_in_time(c: dict) -> bool:
        if c["answer_after_known_ms"] is None:
            return False
        masked = not c["apology"] and base is not None and c["ttfs_ms"] is not None and c["ttfs_ms"] <= base
        return c["answer_after_known_ms"] <= ANSWER_WITHIN_S * 1000 or masked

    short_baseline = clean["baseline_turns"] < MIN_BASELINE_TURNS
    slow = [c for c in cases if not heard_in_time(c)]
    not_back = [c for c in cases if c["back_after_s"] is None or c["back_after_s"] > BACK_WITHIN_S]
    broken = [c for c in cases if not c["next_turn_answered"]]
    change = (during / base - 1) * 100 if base and during else None
    passed = not short_baseline and not slow and not not_back and not broken and change is not None and change <= 20
    per_case = "; ".join(f"{c['fault']}: {'heard %+d ms' % c['answer_after_known_ms'] if c['answered'] else 'NOT heard'}"
                         f" ({'apology' if c['apology'] else 'reply, TTFS %.0f ms' % (c['ttfs_ms'] or 0)}), "
                         f"back {c['back_after_s']} s" for c in cases)
    return Verdict(scenario="model-failures",
                   pass_figure=f"ASR, LLM and TTS workers killed or stopped mid-turn: the caller hears an apology "
                               f"(or the CPU voice) within {ANSWER_WITHIN_S:g} s of the failure being known, or a real "
                               "reply no later than the other caller's healthy TTFS p95, the next turn "
                               f"is answered, the worker is back within {BACK_WITHIN_S:g} s, the other caller's TTFS "
                               "p95 rises 20 % at most",
                   measured=f"{per_case}; next turn answered {len(cases) - len(broken)} of {len(cases)}; other caller "
                            f"p95 {base or 0:.0f} -> {during or 0:.0f} ms"
                            + (f" ({change:+.0f} %)" if change is not None else "")
                            + f", {clean['during_unanswered']} of its turns unanswered during faults"
                            + (f"; its healthy baseline only {clean['baseline_turns']} turns (at least "
                               f"{MIN_BASELINE_TURNS} to judge)" if short_baseline else ""),
                   passed=passed, figures=f)
