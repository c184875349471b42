"""`python -m latency_bench chaos SCENARIO... --out DIR`: what the server survives, in figures.

Each scenario states its pass figure and prints the measured one beside it; DIR/chaos.json
holds every figure, and the table printed last is the README's. Traffic goes only to servers
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
from dataclasses import dataclass
from pathlib import Path

from agent.config import load_config
from latency_bench import servers
from latency_bench.chaos import (access, admission, bad_audio, call_memory, drain, endless, malformed, model_failures,
                                 network as chaos_network, oversize, poison, sdp, slow_clients, soak, vanishing, netns)

SLOW_CLIENTS, SILENT_SOCKETS, BURST_CAP, BURST_EXTRA, DRAIN_CALLS = 200, 200, 4, 50, 10
HEADER_TIMEOUT_S, HANDSHAKE_TIMEOUT_S, DRAIN_GRACE_S, DRAIN_HOLD_S = 5.0, 5.0, 25.0, 3.0
VANISHING_CYCLES = 1000
OVERSIZE_ATTEMPTS, BOMB_BYTES = 200, 64 * 2**20
WS_LIMIT_BYTES = 16_384  # server.max_ws_message_bytes of configs/default.yaml
IDLE_TIMEOUT_S = 10.0  # limits.idle_timeout_seconds on the shared server: the silence cases wait it out
SDP_OFFERS, SDP_CONCURRENCY = 20_000, BURST_CAP - 1  # each worker holds an answered call until it ends
ENDLESS_MINUTES, TURN_LIMIT_S = 10.0, 30.0  # limits.max_user_turn_seconds of configs/default.yaml
# budget: limits.max_bad_messages. 24 clean turns: over 12 (or 6) the p95 is the slowest turn alone,
# and one slow turn, fuzzed or not, decided the figure.
MALFORMED_MESSAGES, BAD_MESSAGE_BUDGET, MALFORMED_CLEAN_TURNS = 1000, 50, 24
OUTAGE_S = 5.0


@dataclass(frozen=True)
class Verdict:
    scenario: str
    pass_figure: str
    measured: str
    passed: bool
    figures: dict


def judge_slow_clients(f: dict) -> Verdict:
    closes = [f["idle"]["max_close_s"], f["trickle"]["max_close_s"]]
    still_open = f["idle"]["still_open"] + f["trickle"]["still_open"]
    slowest = max((round(c, 2) for c in closes if c is not None), default=None)
    passed = still_open == 0 and f["failed_to_open"] == 0 and slowest is not None and slowest <= 10 \
        and f["healthz"]["ok"]
    return Verdict("slow-clients", "400 slow connections all closed within 10 s; a real request answered",
                   f"{still_open} left open, slowest closed after {slowest} s; /healthz "
                   f"{'answered in %.2f s' % f['healthz']['latency_s'] if f['healthz']['ok'] else 'failed'}",
                   passed, f)


def judge_handshake(f: dict) -> Verdict:
    passed = f["still_open"] == 0 and f["close_codes"] == [1008] and (f["max_close_s"] or 99) <= 10 \
        and f["real_caller_admitted"] and f["real_caller_kept"]
    return Verdict("handshake", f"{f['silent_sockets']} start-less sockets closed (1008) within 10 s; "
                                "a real caller admitted meanwhile",
                   f"{f['closed']} closed ({f['close_codes']}), slowest {f['max_close_s']} s; real caller "
                   f"{'admitted' if f['real_caller_admitted'] else 'NOT admitted'}", passed, f)


def judge_admission(f: dict) -> Verdict:
    passed = f["admitted"] == f["cap"] and f["refused"] == f["callers"] - f["cap"] and f["refusal_codes"] == [1013] \
        and (f["max_refusal_ms"] or 1e9) <= 200
    return Verdict("admission", f"cap {f['cap']} + {f['callers'] - f['cap']} at once: exactly {f['cap']} admitted, "
                                "the rest refused (1013) within 200 ms",
                   f"{f['admitted']} admitted, {f['refused']} refused ({f['refusal_codes']}), slowest refusal "
                   f"{f['max_refusal_ms']} ms", passed, f)


def judge_vanishing(f: dict) -> Verdict:
    passed = (f["rss_growth_mb"] <= 20 and f["open_fds_delta"] <= 0 and f["threads_delta"] <= 0
              and f["stored_live_or_unended"] == 0 and f["stored_calls"] >= f["warmup"] + f["cycles"]
              and f["call_ended_after_vanishing_ms"]["max"] <= 5000)
    return Verdict("vanishing", f"{f['cycles']} connect/start/vanish cycles (half mid-reply, half dropping TCP): "
                                "memory +20 MB at most, open files and threads back to baseline, each call "
                                "ended within 5 s and stored as ended",
                   f"memory {f['rss_growth_mb']:+.1f} MB, open files {f['open_fds_delta']:+.0f}, threads "
                   f"{f['threads_delta']:+.0f}, calls ended {f['call_ended_after_vanishing_ms']['p50']} ms after "
                   f"(max {f['call_ended_after_vanishing_ms']['max']}), "
                   f"{f['stored_live_or_unended']} of {f['stored_calls']} unended; "
                   f"{f['mid_reply_cycles_that_heard_audio']} left mid-reply", passed, f)


def judge_oversize(f: dict) -> Verdict:
    # Memory: a bomb is inflated up to the limit at most, so the process holds a few limits.
    passed = f["closed_1009"] == f["attempts"] and f["close_ms"]["max"] <= 100 and f["rss_growth_mb"] <= 20
    return Verdict("oversize", f"{f['attempts']} messages over the {f['limit_bytes']} B limit, half of them "
                               f"{f['bomb_bytes'] // 2**20} MB deflate bombs: all closed 1009 within 100 ms, "
                               "memory +20 MB at most",
                   f"{f['closed_1009']} closed 1009 ({f['close_codes']}), p50 {f['close_ms']['p50']} ms, max "
                   f"{f['close_ms']['max']} ms; memory {f['rss_growth_mb']:+.1f} MB", passed, f)


def judge_malformed(f: dict) -> Verdict:
    sides = (f["realtime"], f["twilio"])
    wrong = sum(len(side["wrong_answers"]) for side in sides)
    slowest = max((side["answer_ms"]["max"] or 0) for side in sides)
    answers: dict[str, int] = {}
    for side in sides:
        for key, count in side["by_answer"].items():
            answer = key.rsplit("/", 1)[1]
            answers[answer] = answers.get(answer, 0) + count
    base, along = f["clean_call"]["baseline_p95"], f["clean_call"]["alongside_p95"]
    ttfs_change = (along / base - 1) * 100 if base and along else None
    passed = (f["server_healthy_after"] and not f["errors_logged"] and wrong == 0 and slowest <= 100
              and ttfs_change is not None and ttfs_change <= 10)
    codes = sorted({*f["realtime"]["codes_seen"], *f["twilio"]["codes_seen"]})
    return Verdict("malformed", f"{f['messages']} malformed messages on /ws/twilio and /v1/realtime: 0 crashes, "
                                "each answered (error event, or close 1002/1007/1008) within 100 ms; a clean call "
                                "alongside keeps its TTFS p95 within 10 %",
                   f"{sum(answers.values())} faults: {answers.get('error_event', 0)} error events, "
                   f"{answers.get('closed', 0)} closes {codes}, {answers.get('dropped', 0)} dropped within the "
                   f"budget, {answers.get('accepted', 0)} read as valid (lenient types); {wrong} unanswered or "
                   f"wrong; slowest answer {slowest} ms (server loop stalls over 100 ms meanwhile: "
                   f"{f.get('server_loop_stalls_over_100ms', '?')}); {len(f['errors_logged'])} errors logged; clean call TTFS "
                   f"p95 {base or 0:.0f} -> {along or 0:.0f} ms"
                   + (f" ({ttfs_change:+.0f} %)" if ttfs_change is not None else ""), passed, f)


def judge_endless(f: dict) -> Verdict:
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


def judge_drain(f: dict) -> Verdict:
    passed = (f["readyz_503_after_s"] is not None and f["readyz_503_after_s"] <= 1.0
              and f["new_call_close_code"] == 1013 and f["live_calls_kept_through_hold"]
              and f["exit_status"] == 0 and f["stored_calls"] == f["calls"] and f["stored_without_end"] == 0)
    return Verdict("drain", f"SIGTERM, {f['calls']} live calls: /readyz 503 within 1 s, new calls refused, live "
                            "calls kept, exit 0, every call stored as ended",
                   f"503 after {f['readyz_503_after_s']} s, new call closed {f['new_call_close_code']}, live calls "
                   f"{'kept' if f['live_calls_kept_through_hold'] else 'CUT'}, exit {f['exit_status']} after "
                   f"{f['stopped_after_s']} s, {f['stored_without_end']} of {f['stored_calls']} stored unended "
                   f"({', '.join(f['end_reasons'])})", passed, f)


async def _on_shared_server(base_url: str, name: str, log: Path, *, sdp_offers: int = SDP_OFFERS) -> Verdict:
    if name == "slow-clients":
        return judge_slow_clients(await slow_clients.run(
            base_url, idle=SLOW_CLIENTS, trickle=SLOW_CLIENTS, deadline_s=HEADER_TIMEOUT_S))
    if name == "handshake":
        return judge_handshake(await admission.run_handshake(
            base_url, silent=SILENT_SOCKETS, timeout_s=HANDSHAKE_TIMEOUT_S))
    if name == "oversize":
        return judge_oversize(await oversize.run(base_url, limit_bytes=WS_LIMIT_BYTES, attempts=OVERSIZE_ATTEMPTS,
                                                 bomb_bytes=BOMB_BYTES))
    if name == "vanishing":
        return judge_vanishing(await vanishing.run(base_url, cycles=VANISHING_CYCLES))
    if name == "bad-audio":
        return bad_audio.judge(await bad_audio.run(base_url, idle_timeout_s=IDLE_TIMEOUT_S, log=log))
    if name == "sdp":
        return Verdict(**sdp.judge(await sdp.run(base_url, offers=sdp_offers, concurrency=SDP_CONCURRENCY,
                                                 seed=0)))
    if name == "endless":
        return judge_endless(await endless.run(base_url, minutes=ENDLESS_MINUTES))
    if name == "malformed":
        return judge_malformed(await malformed.run(base_url, messages=MALFORMED_MESSAGES,
                                                   budget=BAD_MESSAGE_BUDGET, turns=MALFORMED_CLEAN_TURNS,
                                                   log=log))
    return judge_admission(await admission.run_burst(base_url, cap=BURST_CAP, extra=BURST_EXTRA))


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
            verdicts.append(Verdict(**model_failures.judge(asyncio.run(model_failures.run(
                base_url, read_log=read_log, deadlines=model_failures.deadlines_of(load_config(config)))))))
    if "call-memory" in names:
        with servers.cadence(out / "call-memory", max_calls=CALL_MEMORY_CALLS, config=config) as base_url:
            verdicts.append(Verdict(**call_memory.judge(asyncio.run(
                call_memory.run(base_url, calls=CALL_MEMORY_CALLS)))))
    if "soak" in names:
        # One call each for the whole soak: the call limit must not end it.
        settings = [f"limits.max_call_seconds={soak_minutes * 60 + 600}"]
        with servers.cadence(out / "soak", max_calls=soak_callers, config=config, settings=settings) as base_url:
            verdicts.append(Verdict(**soak.judge(asyncio.run(soak.run(
                base_url, minutes=soak_minutes, warmup_minutes=soak_minutes / 6, callers=soak_callers)))))
    if "lossy" in names or "blackhole" in names:
        # The server listens on the caller network's host end, without keys: that link is this
        # machine's own, made for the run, and only the bench's caller is on the other end.
        with netns.create() as network, servers.cadence(out / "network", max_calls=2, config=config,
                                                        host=network.host_ip, insecure=True) as base_url:
            if "lossy" in names:
                verdicts.append(Verdict(**chaos_network.judge_lossy(asyncio.run(chaos_network.run_lossy(
                    network, base_url, seconds=lossy_minutes * 60, out=out / "network")))))
            if "blackhole" in names:
                verdicts.append(Verdict(**chaos_network.judge_blackhole(asyncio.run(chaos_network.run_blackhole(
                    network, base_url, outage_s=OUTAGE_S, out=out / "network")))))
    if "drain" in names:
        verdicts.append(judge_drain(asyncio.run(drain.run(
            out / "drain", calls=DRAIN_CALLS, grace_s=DRAIN_GRACE_S, hold_s=DRAIN_HOLD_S, config=config))))
    return verdicts


def table(verdicts: list[Verdict]) -> str:
    rows = ["| scenario | pass figure | measured | result |", "|---|---|---|---|"]
    rows += [f"| {v.scenario} | {v.pass_figure} | {v.measured} | {'pass' if v.passed else 'FAIL'} |" for v in verdicts]
    return "\n".join(rows)
