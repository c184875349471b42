"""Chaos scenarios: a browser caller's bad network (issue 13, scenarios 10 and 11). The caller
is a WebRTC client in a network namespace of its own (latency_bench/chaos/netns.py), in its own
process (latency_bench/callers/netns_caller.py); the server listens on the namespace's host end.

lossy: one call per link profile (1 %, 5 %, 10 % loss each way, all at 256 kbit/s), the
caller asking questions without a break for `seconds`. Figures: the share of the caller's
audio that reached the pipeline (the server's cadence_caller_audio_seconds_total over the
same window of wall time the caller's microphone sent), and the turns answered.

blackhole: the caller's network drops everything for `outage_s` mid-call, then comes back.
Figures: how long after it came back the server heard the caller again and the caller heard
the server again (no new offer: ICE consent outlives a short outage), and whether the next
turn was answered. Then a second call whose network never comes back: it must be ended and
stored as `network_lost` when ICE consent expires (~30 s), not left a zombie holding a slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from latency_bench.chaos.netns import CallerNetwork, LinkProfile
from latency_bench.chaos.server_figures import metric_value, poll_until
from latency_bench.chaos.verdict import Verdict
from latency_bench.stats import percentile

REPO = Path(__file__).resolve().parents[2]
PROFILES = (LinkProfile(0.01, 256), LinkProfile(0.05, 256), LinkProfile(0.10, 256))
MIN_AUDIO_REACHED = {0.01: 0.95, 0.05: 0.90, 0.10: 0.80}  # the pass figures, by loss
MAX_RESUME_MS = 2000.0
# ICE consent expires after 6 unanswered checks 4-6 s apart (aioice, RFC 7675): 24-36 s.
NETWORK_LOST_WITHIN_S = 40.0
CONNECT_TIMEOUT_S = 30.0
SETTLE_S = 3.0  # after connecting, before the audio window opens: the pipeline is running by then
POLL_S = 0.05
SILENCE_SLACK_S = 0.5  # the last frame before an outage came up to this long before it began


@dataclass
class CallerProcess:
    """One netns_caller process and the events it has written so far."""
    process: asyncio.subprocess.Process
    events: list[dict] = field(default_factory=list)
    connected: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    reader: asyncio.Task | None = None

    @classmethod
    async def start(cls, network: CallerNetwork, base_url: str, *, log: Path, pause_s: float = 1.5,
                    reply_timeout_s: float = 15.0) -> CallerProcess:
        argv = network.command([sys.executable, "-m", "latency_bench", "netns-caller", "--offer-url",
                                f"{base_url}/api/offer", "--pause-s", str(pause_s),
                                "--reply-timeout-s", str(reply_timeout_s)])
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as stderr:
            process = await asyncio.create_subprocess_exec(*argv, cwd=REPO, stdin=asyncio.subprocess.PIPE,
                                                           stdout=asyncio.subprocess.PIPE, stderr=stderr)
        caller = cls(process)
        caller.reader = asyncio.create_task(caller._read())
        return caller

    async def _read(self) -> None:
        assert self.process.stdout is not None
        async for line in self.process.stdout:
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                self.events.append(event)
                if event["event"] == "connected":
                    self.connected.set()
                elif event["event"] == "done":
                    self.done.set()
        self.done.set()  # exited without saying so: `result` tells

    @property
    def call_id(self) -> str | None:
        return next((e["call_id"] for e in self.events if e["event"] == "connected"), None)

    @property
    def turns(self) -> list[dict]:
        return [e for e in self.events if e["event"] == "turn"]

    @property
    def result(self) -> dict:
        return next((e for e in self.events if e["event"] == "done"),
                    {"error": f"the caller exited ({self.process.returncode}) without a result"})

    async def wait_connected(self) -> None:
        """Until the caller says it connected; ConnectionError if it ended or timed out first."""
        waits = [asyncio.create_task(self.connected.wait()), asyncio.create_task(self.done.wait())]
        await asyncio.wait(waits, timeout=CONNECT_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
        for wait in waits:
            wait.cancel()
        if not self.connected.is_set():
            raise ConnectionError(f"the caller did not connect: {self.result.get('error')}")

    async def stop(self, timeout_s: float = 30.0) -> dict:
        """Asks it to hang up after the turn in progress; kills it past `timeout_s`."""
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            assert self.process.stdin is not None
            self.process.stdin.write(b"stop\n")
            await self.process.stdin.drain()
        try:
            await asyncio.wait_for(self.done.wait(), timeout_s)
            await asyncio.wait_for(self.process.wait(), 10.0)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
        if self.reader is not None:
            await asyncio.gather(self.reader, return_exceptions=True)
        return self.result


async def caller_audio_seconds(http: httpx.AsyncClient) -> float:
    return await metric_value(http, "cadence_caller_audio_seconds_total", transport="webrtc")


async def _stored_call(http: httpx.AsyncClient, call_id: str | None, timeout_s: float = 10.0) -> dict:
    """The call as stored once it has ended (the server hears of a hang-up a moment after it)."""
    if call_id is None:
        return {}
    call: dict = {}

    async def ended() -> bool:
        nonlocal call
        call = (await http.get(f"/api/calls/{call_id}")).json()
        return call.get("live") is False

    await poll_until(ended, timeout_s, every_s=POLL_S)
    return call


def _turn_figures(turns: list[dict]) -> dict:
    ttfs = [t["ttfs_ms"] for t in turns if t["ttfs_ms"] is not None]
    return {"turns": len(turns), "answered": sum(t["answered"] for t in turns),
            "ttfs_ms": {"p50": percentile(ttfs, 50), "p95": percentile(ttfs, 95)}}


async def run_lossy(network: CallerNetwork, base_url: str, *, seconds: float, out: Path,
                    profiles: tuple[LinkProfile, ...] = PROFILES) -> dict:
    results = []
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as http:
        for profile in profiles:
            network.shape(profile)
            caller = await CallerProcess.start(network, base_url, log=out / "callers.log")
            try:
                await caller.wait_connected()
                await asyncio.sleep(SETTLE_S)
                heard_before, opened = await caller_audio_seconds(http), time.monotonic()
                await asyncio.sleep(seconds)
                heard_after, closed = await caller_audio_seconds(http), time.monotonic()
            finally:
                done = await caller.stop()
            stored = await _stored_call(http, caller.call_id)
            results.append({"loss": profile.loss, "rate_kbit": profile.rate_kbit, "window_s": round(closed - opened, 1),
                            "audio_reached": round((heard_after - heard_before) / (closed - opened), 4),
                            **_turn_figures(caller.turns), "call_error": done.get("error"),
                            "end_reason": stored.get("end_reason")})
    network.shape(LinkProfile())
    return {"seconds": seconds, "profiles": results}


def judge_lossy(f: dict) -> Verdict:
    rows, passed = [], True
    for p in f["profiles"]:
        needed = MIN_AUDIO_REACHED.get(p["loss"], 1.0 - 2 * p["loss"])
        ok = (p["audio_reached"] >= needed and p["turns"] > 0 and p["answered"] == p["turns"]
              and p["call_error"] is None)
        passed &= ok
        rows.append(f"{p['loss']:.0%}: {p['audio_reached']:.1%} of the audio reached the ASR (>= {needed:.0%}), "
                    f"{p['answered']}/{p['turns']} turns answered, TTFS p50 {p['ttfs_ms']['p50'] or 0:.0f} ms")
    return Verdict(scenario="lossy",
                   pass_figure=f"a WebRTC call held {f['seconds'] / 60:g} min at 1/5/10 % loss and 256 kbit/s: >= "
                               "95/90/80 % of the caller's audio reaches the ASR, every reply heard",
                   measured="; ".join(rows),
                   passed=passed, figures=f)


async def _turn_after(caller: CallerProcess, since: float, timeout_s: float) -> dict | None:
    """The first turn the caller began after `since`, once it is over."""
    def found() -> dict | None:
        return next((t for t in caller.turns if t["speech_end_at"] and t["speech_end_at"] > since), None)
    await poll_until(lambda: found() is not None or caller.done.is_set(), timeout_s, every_s=POLL_S)
    return found()


async def _short_outage(network: CallerNetwork, base_url: str, http: httpx.AsyncClient, *, outage_s: float,
                        out: Path) -> dict:
    caller = await CallerProcess.start(network, base_url, log=out / "callers.log")
    try:
        await caller.wait_connected()
        await poll_until(lambda: any(t["answered"] for t in caller.turns), 30.0, every_s=POLL_S)
        network.blackhole(True)
        dropped_at = time.time()
        await asyncio.sleep(outage_s)
        before = await caller_audio_seconds(http)
        back_at = time.time()  # the network is back somewhere in the next command: times are upper bounds
        network.blackhole(False)

        async def heard_again() -> bool:
            return await caller_audio_seconds(http) > before

        heard = await poll_until(heard_again, 10.0, every_s=POLL_S)
        server_heard_ms = round((time.time() - back_at) * 1000) if heard else None
        next_turn = await _turn_after(caller, back_at, 40.0)
        live = (await http.get(f"/api/calls/{caller.call_id}")).json().get("live")
    finally:
        done = await caller.stop()
    # The caller's silence that the outage made: the longest that began while it lasted.
    outage = max((s for s in done.get("silences", []) if dropped_at - SILENCE_SLACK_S <= s[0] <= back_at),
                 key=lambda s: s[1] - s[0], default=None)
    caller_heard_ms = max(0, round((outage[1] - back_at) * 1000)) if outage else None
    return {"outage_s": outage_s, "server_heard_caller_after_ms": server_heard_ms,
            "caller_heard_server_after_ms": caller_heard_ms, "call_live_after": live,
            "next_turn_answered": bool(next_turn and next_turn["answered"]),
            "next_turn_ttfs_ms": next_turn["ttfs_ms"] if next_turn else None, "call_error": done.get("error"),
            "outage_silence_s": [round(t - back_at, 3) for t in outage] if outage else None}


async def _lasting_outage(network: CallerNetwork, base_url: str, http: httpx.AsyncClient, *, out: Path,
                          give_up_s: float) -> dict:
    caller = await CallerProcess.start(network, base_url, log=out / "callers.log")
    try:
        await caller.wait_connected()
        await poll_until(lambda: any(t["answered"] for t in caller.turns), 30.0, every_s=POLL_S)  # mid-call
        network.blackhole(True)
        dropped_at = time.monotonic()
        stored = await _stored_call(http, caller.call_id, timeout_s=give_up_s)
        ended_after_s = round(time.monotonic() - dropped_at, 1) if stored.get("ended_at") else None
    finally:
        network.blackhole(False)
        await caller.stop(timeout_s=5.0)
    return {"ended_after_s": ended_after_s, "end_reason": stored.get("end_reason")}


async def run_blackhole(network: CallerNetwork, base_url: str, *, outage_s: float, out: Path,
                        lasting: bool = True) -> dict:
    network.shape(LinkProfile())
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as http:
        short = await _short_outage(network, base_url, http, outage_s=outage_s, out=out)
        lost = await _lasting_outage(network, base_url, http, out=out, give_up_s=NETWORK_LOST_WITHIN_S + 20) \
            if lasting else None
    return {"short": short, "lasting": lost}


def judge_blackhole(f: dict) -> Verdict:
    s, lost = f["short"], f["lasting"]
    resumed = [s["server_heard_caller_after_ms"], s["caller_heard_server_after_ms"]]
    passed = (all(ms is not None and ms <= MAX_RESUME_MS for ms in resumed) and s["next_turn_answered"]
              and s["call_live_after"] and lost is not None and lost["end_reason"] == "network_lost"
              and lost["ended_after_s"] is not None and lost["ended_after_s"] <= NETWORK_LOST_WITHIN_S)
    measured = (f"after {s['outage_s']:g} s without a network: the server heard the caller "
                f"{s['server_heard_caller_after_ms']} ms and the caller the server {s['caller_heard_server_after_ms']} "
                f"ms after it came back, the next turn {'answered' if s['next_turn_answered'] else 'NOT answered'}")
    if lost is not None:
        measured += (f"; a network that never came back: the call ended after {lost['ended_after_s']} s, stored as "
                     f"{lost['end_reason']}")
    return Verdict(scenario="blackhole",
                   pass_figure=f"the caller's network gone for {s['outage_s']:g} s mid-call: both ways heard again "
                               f"within {MAX_RESUME_MS / 1000:g} s of its return, no new offer; gone for good: the "
                               f"call ended within {NETWORK_LOST_WITHIN_S:g} s (ICE consent) and stored as network_lost",
                   measured=measured,
                   passed=passed, figures=f)
