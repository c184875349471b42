"""`python -m latency_bench chaos SCENARIO... --out DIR`: what the server survives, in figures.

Each scenario is a module of latency_bench/chaos/ whose `run` measures and whose `judge` returns
a Verdict (latency_bench/chaos/verdict.py): its pass figure with the measured one beside it;
DIR/chaos.json holds every figure, and the table printed last is the README's. Traffic goes only to servers
on loopback that the bench starts itself; every scenario is bounded in count and time.

    slow-clients  200 TCP connections that never send a request and 200 that trickle one a
                  byte at a time: all closed within 10 s, a real request answered meanwhile
    handshake     200 phone sockets that never send `start`: all closed (1008) at the
                  handshake timeout, a real caller admitted while they are open
    admission     the call cap + 50 callers at once: exactly the cap admitted, the rest
                  refused (1013) within 200 ms
    oversize      200 messages over the WebSocket size limit, half of them 64 MB deflate
                  bombs: all closed 1009 within 100 ms, memory +20 MB at most
    vanishing     1,000 callers who connect, start and vanish (half mid-reply, half dropping
                  TCP): memory +20 MB at most, open files and threads back to baseline,
                  every call stored as ended
    malformed     1,000 generated-malformed messages on /ws/twilio and /v1/realtime (bad JSON,
                  wrong types, unknown events, bad base64, huge numbers, binary, bad frames):
                  each answered (an error event, a drop within the bad-message budget, or a
                  close 1002/1007/1008) within 100 ms, nothing logged as an error, a clean call
                  alongside keeps its TTFS p95 (within 10 %)
    bad-audio     17 kinds of bad audio on the phone and /v1/realtime (wrong rates, odd lengths,
                  NaN/Inf floats, noise, Opus as PCM, silence): 0 crashes, each handled or closed
                  with a reason, the next good utterance answered
    endless       a caller who talks for 10 minutes without a pause: the turn cut (and each part
                  transcribed) every 30 s at most, the session holding +64 MB at most while they
                  talk (the median sample; the peaks, Whisper's workspace at each cut, and what is
                  left once the call ended beside it), and the reply still comes (the prompt fits)
    call-memory   4 live calls, each past its first reply: the server's memory per live call
                  50 MB at most over a warmed, idle server (the report's memory per call)
    sdp           20,000 mutated WebRTC offers: every answer 4xx within 200 ms (or an answered call
                  that ends when hung up), 0 5xx, no peer connection or socket left behind
    poison        40 injection documents and 160 poisoned caller turns against two agents with
                  canaries: 0 canary leaks, 0 cross-agent passages, no caller secret in the logs
    access        missing, wrong, expired, reused and alg:none credentials and a foreign Origin
                  on every route that starts a call or changes an agent (taken from the server's
                  own route list): 100 % refused, a valid key accepted; no secret in the log
    model-failures  ASR, LLM and TTS workers (real models, each its own process) killed or
                  stopped while a caller's turn is being served: the caller hears an apology
                  (or the CPU voice) within 2 s of the failure being known, the next turn is
                  answered, the worker is back within 30 s, another caller's TTFS p95 rises
                  20 % at most
    soak          2 callers (--soak-callers) talking for --minutes (60) in one call each, the last
                  caller's clock 0.1 % fast: memory +1 MB per 10 min at most after warm-up (the first sixth), reply
                  lag (TTFS p50, first fifth of turns against the last) drifting 50 ms at most,
                  no underruns, every turn answered
    lossy         a WebRTC caller in a network namespace of its own, at 1 %, 5 % and 10 % packet loss
                  each way and 256 kbit/s, a call of --lossy-minutes (5) each: >= 95/90/80 % of the
                  caller's audio reaches the ASR, every reply heard (needs root and iptables)
    blackhole     that caller's network dropped for 5 s mid-call: heard again both ways within 2 s
                  of its return, no new offer, the next turn answered; dropped for good: the call
                  ended within 40 s (ICE consent) and stored as network_lost (needs root)
    drain         SIGTERM with 10 live calls: /readyz 503 within 1 s, new calls refused, live
                  calls kept until they hang up, exit 0, every call stored as ended

tests/reliability/ runs the short versions of these on every change.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent.config import load_config
from latency_bench import servers
from latency_bench.chaos import (access, admission, bad_audio, call_memory, drain, endless, malformed, model_failures,
                                 netns, network as chaos_network, oversize, poison, sdp, slow_clients, soak, vanishing)
from latency_bench.chaos.verdict import Verdict

SLOW_CLIENTS, SILENT_SOCKETS, BURST_CAP, BURST_EXTRA, DRAIN_CALLS = 200, 200, 4, 50, 10
HEADER_TIMEOUT_S, HANDSHAKE_TIMEOUT_S, DRAIN_GRACE_S, DRAIN_HOLD_S = 5.0, 5.0, 25.0, 3.0
VANISHING_CYCLES = 1000
OVERSIZE_ATTEMPTS, BOMB_BYTES = 200, 64 * 2**20
WS_LIMIT_BYTES = 16_384  # server.max_ws_message_bytes of configs/default.yaml
IDLE_TIMEOUT_S = 10.0  # limits.idle_timeout_seconds on the shared server: the silence cases wait it out
SDP_OFFERS, SDP_CONCURRENCY = 20_000, BURST_CAP - 1  # each worker holds an answered call until it ends
ENDLESS_MINUTES = 10.0
# budget: limits.max_bad_messages. 24 clean turns: over 12 (or 6) the p95 is the slowest turn alone,
# and one slow turn, fuzzed or not, decided the figure.
MALFORMED_MESSAGES, BAD_MESSAGE_BUDGET, MALFORMED_CLEAN_TURNS = 1000, 50, 24
OUTAGE_S = 5.0


async def _on_shared_server(base_url: str, name: str, log: Path, *, sdp_offers: int = SDP_OFFERS) -> Verdict:
    if name == "slow-clients":
        return slow_clients.judge(await slow_clients.run(
            base_url, idle=SLOW_CLIENTS, trickle=SLOW_CLIENTS, deadline_s=HEADER_TIMEOUT_S))
    if name == "handshake":
        return admission.judge_handshake(await admission.run_handshake(
            base_url, silent=SILENT_SOCKETS, timeout_s=HANDSHAKE_TIMEOUT_S))
    if name == "oversize":
        return oversize.judge(await oversize.run(base_url, limit_bytes=WS_LIMIT_BYTES, attempts=OVERSIZE_ATTEMPTS,
                                                 bomb_bytes=BOMB_BYTES))
    if name == "vanishing":
        return vanishing.judge(await vanishing.run(base_url, cycles=VANISHING_CYCLES))
    if name == "bad-audio":
        return bad_audio.judge(await bad_audio.run(base_url, idle_timeout_s=IDLE_TIMEOUT_S, log=log))
    if name == "sdp":
        return sdp.judge(await sdp.run(base_url, offers=sdp_offers, concurrency=SDP_CONCURRENCY, seed=0))
    if name == "endless":
        return endless.judge(await endless.run(base_url, minutes=ENDLESS_MINUTES))
    if name == "malformed":
        return malformed.judge(await malformed.run(base_url, messages=MALFORMED_MESSAGES,
                                                   budget=BAD_MESSAGE_BUDGET, turns=MALFORMED_CLEAN_TURNS,
                                                   log=log))
    return admission.judge_admission(await admission.run_burst(base_url, cap=BURST_CAP, extra=BURST_EXTRA))


SCENARIOS = ("slow-clients", "handshake", "admission", "oversize", "vanishing", "malformed", "bad-audio", "endless",
             "call-memory", "sdp", "poison", "access", "model-failures", "soak", "lossy", "blackhole", "drain")
# Each starts a server of its own (INFO logs; a key; model workers; calls longer than the limit; a
# caller network's address; a SIGTERM; callers holding the line past the shared server's short
# idle timeout).
OWN_SERVER = ("poison", "access", "model-failures", "soak", "lossy", "blackhole", "drain", "call-memory")
CALL_MEMORY_CALLS = 4


def run(names: list[str], out: Path, *, config: Path = servers.DEFAULT_CONFIG, soak_minutes: float = 60.0,
        soak_callers: int = 2, lossy_minutes: float = 5.0, llm_replicas: int = 1,
        sdp_offers: int = SDP_OFFERS) -> list[Verdict]:
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise ValueError(f"unknown chaos scenarios {unknown}; choose from {', '.join(SCENARIOS)}")
    verdicts: list[Verdict] = []
    shared = [n for n in names if n not in OWN_SERVER]
    if shared:
        settings = [f"server.request_header_timeout_seconds={HEADER_TIMEOUT_S}",
                    f"limits.handshake_timeout_seconds={HANDSHAKE_TIMEOUT_S}",
                    f"limits.idle_timeout_seconds={IDLE_TIMEOUT_S}"]
        with servers.cadence(out / "server", max_calls=BURST_CAP, config=config, settings=settings) as base_url:
            for name in shared:
                verdicts.append(asyncio.run(_on_shared_server(base_url, name, out / "server" / "cadence.log",
                                                              sdp_offers=sdp_offers)))
    if "poison" in names:
        with poison.server(out / "poison", config=config) as (base_url, read_logs):
            verdicts.append(poison.judge(asyncio.run(poison.run(base_url, read_logs=read_logs))))
    if "access" in names:
        with access.server(out / "access", config=config) as (base_url, key, log):
            verdicts.append(access.judge(asyncio.run(access.run(base_url, key=key,
                                                                read_log=log.read_text))))
    if "model-failures" in names:
        with model_failures.server(out / "model-failures", config=config,
                                   llm_replicas=llm_replicas) as (base_url, read_log):
            verdicts.append(model_failures.judge(asyncio.run(model_failures.run(
                base_url, read_log=read_log, deadlines=model_failures.deadlines_of(load_config(config))))))
    if "call-memory" in names:
        with servers.cadence(out / "call-memory", max_calls=CALL_MEMORY_CALLS, config=config) as base_url:
            verdicts.append(call_memory.judge(asyncio.run(
                call_memory.run(base_url, calls=CALL_MEMORY_CALLS))))
    if "soak" in names:
        # One call each for the whole soak: the call limit must not end it.
        settings = [f"limits.max_call_seconds={soak_minutes * 60 + 600}"]
        with servers.cadence(out / "soak", max_calls=soak_callers, config=config, settings=settings) as base_url:
            verdicts.append(soak.judge(asyncio.run(soak.run(
                base_url, minutes=soak_minutes, warmup_minutes=soak_minutes / 6, callers=soak_callers))))
    if "lossy" in names or "blackhole" in names:
        # The server listens on the caller network's host end, without keys: that link is this
        # machine's own, made for the run, and only the bench's caller is on the other end.
        with netns.create() as network, servers.cadence(out / "network", max_calls=2, config=config,
                                                        host=network.host_ip, insecure=True) as base_url:
            if "lossy" in names:
                verdicts.append(chaos_network.judge_lossy(asyncio.run(chaos_network.run_lossy(
                    network, base_url, seconds=lossy_minutes * 60, out=out / "network"))))
            if "blackhole" in names:
                verdicts.append(chaos_network.judge_blackhole(asyncio.run(chaos_network.run_blackhole(
                    network, base_url, outage_s=OUTAGE_S, out=out / "network"))))
    if "drain" in names:
        verdicts.append(drain.judge(asyncio.run(drain.run(
            out / "drain", calls=DRAIN_CALLS, grace_s=DRAIN_GRACE_S, hold_s=DRAIN_HOLD_S, config=config))))
    return verdicts
