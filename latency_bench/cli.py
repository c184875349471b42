"""latency_bench: time to first sentence as callers hear it, under load; and the rest of the bench.

One way in, `python -m latency_bench SUBCOMMAND` (`cadence bench SUBCOMMAND` forwards here):

    python -m latency_bench run [--url URL] --transport twilio|webrtc|realtime --callers N --turns K [--ramp] --out DIR
    python -m latency_bench capacity [--url URL] --transport twilio [--min-turns 20] [--slo-ms 1500] --out DIR
        without --url, `run` and `capacity` start the server themselves: [--config FILE]
        [--deployment FILE|none] [--schedule wanted-by|arrival] [--set KEY=VALUE ...]
        [--agent-file AGENT.yaml --agent NAME]
    python -m latency_bench compare --callers N --turns K --out DIR
    python -m latency_bench retrieval-ab --url URL [--agent NAME] [--rounds 3] --turns K --out DIR
    python -m latency_bench quality --url URL --agent NAME --out DIR [--no-spoken] [--runs 1]
    python -m latency_bench pauses [--url URL] --out DIR [--runs 3] [--pause-s 0.6] [--set KEY=VALUE ...]
        [--agent-file AGENT.yaml --agent NAME]
    python -m latency_bench transports [--url URL] --out DIR [--runs 3] [--turns 5] [--ways twilio,webrtc,...]
        [--set KEY=VALUE ...] [--agent-file AGENT.yaml --agent NAME]
    python -m latency_bench chaos SCENARIO... --out DIR [--config FILE]

`run` measures N synthetic callers (with --ramp: 1, 2, 4, ... N in turn); `capacity`
raises the number of callers until TTFS p95 breaks the SLO or replies underrun;
`compare` runs one scenario against Cadence and against a stock pipecat pipeline on
the same models, both started by the bench, and prints ours / stock.
Each writes DIR/results.json and PNG plots, and prints a JSON summary. `quality` asks
the question set (latency_bench/quality/quality_set.json) by text chat and, for its spoken
subset, by phone call; it writes DIR/quality.json and prints grounded-answer accuracy,
refusal rate and reply length for each path. `pauses` has one caller stop mid-sentence
and ask complete questions in turn (latency_bench/quality/pauses.py): it counts replies that
came inside the pauses, and the complete questions' TTFS. `transports` measures one agent
through the phone socket, WebRTC, /v1/realtime and a speech-to-speech relay agent (a cascade
behind a cascade), one caller at a time, alternating (latency_bench/load/transports.py).
`chaos` runs reliability scenarios against servers it starts and prints a pass/fail table
(latency_bench/chaos/suite.py).

The component benches measure one model or one path alone, and parse their own flags (each
its module's `main`; `SUBCOMMAND --help` lists them):

    python -m latency_bench embedding-bench | retrieval-bench | transcribe-bench | hop-bench
    python -m latency_bench tts-memory | asr-workspace | gc-pause | webrtc-path | tts-codec
    python -m latency_bench prompt-sweep --out DIR

and four are the child processes the others start (stock-pipecat, malformed-fuzzer,
netns-caller) or that tests start (orpheus-dev-server).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import sys
from dataclasses import replace
from pathlib import Path

# The bench's modules are imported by the subcommand that needs them: a component bench that
# measures its own process's memory (tts-memory, gc-pause, asr-workspace) must find it as it
# would alone.


def headline(results: dict) -> dict:
    """The figures a person reads: per level, caller-side TTFS and the failure counts."""
    def brief(summary: dict) -> dict:
        caller = summary["caller"]
        return {"turns": summary["turns"], "errors": summary["errors"], "apologies": summary["apologies"],
                "turns_with_underruns": summary["turns_with_underruns"],
                "ttfs_ms": {q: caller["ttfs_ms"][q] for q in ("p50", "p95", "p99")},
                "ttfb_ms_p50": caller["ttfb_ms"]["p50"],
                "barge_in_stop_ms_p50": caller["barge_in_stop_ms"]["p50"],
                "server_ttfs_ms_p50": summary["server_ttfs_ms"]["p50"],
                "final_transcript_ms": {q: summary["final_transcript_ms"][q] for q in ("p50", "p95")},
                "server_stage_ms_p50": {s: d["p50"] for s, d in summary["server_stage_ms"].items()}}
    return {"levels": [{"callers": lv["callers"], **brief(lv["summary"])} for lv in results["levels"]],
            "all": brief(results["summary"])}


def _scenario(args):
    from latency_bench.load.runner import Scenario

    return Scenario(url=getattr(args, "url", None) or "", transport=args.transport, turns=args.turns,
                    seed=args.seed, barge_in_every=args.barge_in_every, agent=args.agent)


def _started_server(stack: contextlib.ExitStack, args, max_calls: int) -> str:
    """The server under test: --url, or one the bench starts (and stops) itself."""
    from latency_bench import servers

    return args.url or stack.enter_context(servers.cadence(
        args.out, max_calls=max_calls, config=args.config or servers.DEFAULT_CONFIG,
        deployment=args.deployment, schedule=args.schedule, settings=tuple(args.set),
        agent_files=tuple(args.agent_file)))


def cmd_run(args) -> dict:
    from latency_bench import report
    from latency_bench.load import runner

    levels = runner.ramp_levels(args.callers) if args.ramp else [args.callers]
    with contextlib.ExitStack() as stack:
        scenario = replace(_scenario(args), url=_started_server(stack, args, max(levels)))
        results = asyncio.run(runner.run(scenario, levels, progress=not args.quiet))
    report.write(args.out, results)
    return headline(results)


def cmd_capacity(args) -> dict:
    from latency_bench import report
    from latency_bench.load import runner
    from latency_bench.load.capacity import SLO, find_capacity
    from latency_bench.stats import summarize

    slo = SLO(ttfs_p95_ms=args.slo_ms)
    with contextlib.ExitStack() as stack:
        url = _started_server(stack, args, args.max_callers)
        scenario = replace(_scenario(args), url=url)

        async def level(callers: int) -> dict:
            await runner.wait_until_ready(url)
            # A p95 needs samples: every level measures at least --min-turns turns in all.
            turns = max(args.turns, -(-args.min_turns // callers))
            return (await runner.run(replace(scenario, turns=turns), [callers], progress=not args.quiet))["levels"][0]

        found = asyncio.run(find_capacity(level, slo, start=args.start, step=args.step, max_callers=args.max_callers))
    results = {"scenario": {**vars(args), "out": str(args.out)}, "capacity": {k: v for k, v in found.items()
                                                                                if k != "levels"},
               "levels": found["levels"],
               "summary": summarize([t for lv in found["levels"] for t in lv["turns"]])}
    report.write(args.out, results)
    return {"sustained_callers": found["sustained_callers"], "slo": found["slo"], "stopped_by": found["stopped_by"],
            **headline(results)}


def cmd_compare(args) -> dict:
    from latency_bench import report, servers
    from latency_bench.load import runner

    scenario = _scenario(args)
    levels = [args.callers]
    outcomes = {}
    ours_out, stock_out = args.out / "cadence", args.out / "stock-pipecat"
    with contextlib.ExitStack() as stack:
        url = args.ours_url or stack.enter_context(servers.cadence(ours_out, max_calls=max(4, args.callers)))
        outcomes["cadence"] = asyncio.run(runner.run(replace(scenario, url=url), levels, progress=not args.quiet))
    report.write(ours_out, outcomes["cadence"])
    with servers.stock_pipecat(stock_out, turn_stop=args.stock_turn_stop, stop_secs=args.stock_stop_secs) as url:
        outcomes["stock"] = asyncio.run(runner.run(replace(scenario, url=url), levels, progress=not args.quiet))
    report.write(stock_out, outcomes["stock"])
    ours, stock = (outcomes[k]["summary"]["caller"]["ttfs_ms"] for k in ("cadence", "stock"))
    ratio = {q: (round(ours[q] / stock[q], 3) if ours[q] and stock[q] else None) for q in ("p50", "p95")}
    comparison = {"callers": args.callers, "turns_per_caller": args.turns, "transport": args.transport,
                  "stock_turn_stop": args.stock_turn_stop,
                  "cadence_ttfs_ms": {q: ours[q] for q in ("p50", "p95", "p99")},
                  "stock_ttfs_ms": {q: stock[q] for q in ("p50", "p95", "p99")},
                  "ratio_ours_over_stock": ratio,
                  "errors": {k: v["summary"]["errors"] for k, v in outcomes.items()},
                  "cadence": headline(outcomes["cadence"])["all"], "stock": headline(outcomes["stock"])["all"]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "comparison.json").write_text(json.dumps(comparison, indent=2))
    return comparison


def cmd_retrieval_ab(args) -> dict:
    from latency_bench.load import retrieval_ab

    return asyncio.run(retrieval_ab.run(_scenario(args), args.rounds, args.out))


def cmd_quality(args) -> dict:
    from latency_bench.quality import quality

    results = asyncio.run(quality.measure(args.url, args.agent, spoken=args.spoken, runs=args.runs,
                                          config=args.config or quality.DEFAULT_CONFIG))
    quality.write(args.out, results)
    return results["summary"]


def cmd_pauses(args) -> dict:
    from latency_bench.load import runner
    from latency_bench.quality import pauses

    with contextlib.ExitStack() as stack:
        url = _started_server(stack, args, 1)
        asyncio.run(runner.wait_until_ready(url))
        runs = [asyncio.run(pauses.one_run(url, args.pause_s, agent=args.agent)) for _ in range(args.runs)]
    results = {"pause_s": args.pause_s, "runs": runs, "summary": pauses.summary(runs)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "pauses.json").write_text(json.dumps(results, indent=2))
    return results["summary"] | {"server_per_run": [r["server"] for r in runs]}


def cmd_transports(args) -> dict:
    from latency_bench.load import transports

    ways = tuple(w for w in args.ways.split(",") if w)
    unknown = set(ways) - set(transports.WAYS)
    if unknown:
        raise RuntimeError(f"unknown ways {sorted(unknown)}; known: {', '.join(transports.WAYS)}")
    with contextlib.ExitStack() as stack:
        url = _started_server(stack, args, 2)  # the relay's call and the one it makes
        results = transports.run(replace(_scenario(args), url=url), args.runs, ways)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "transports.json").write_text(json.dumps(results, indent=2))
    return results["summary"]


def cmd_chaos(args) -> dict:
    from latency_bench import servers
    from latency_bench.chaos import suite
    from latency_bench.chaos.verdict import table

    verdicts = suite.run(args.scenarios, args.out, config=args.config or servers.DEFAULT_CONFIG,
                         soak_minutes=args.minutes, soak_callers=args.soak_callers,
                         lossy_minutes=args.lossy_minutes, llm_replicas=args.llm_replicas,
                         sdp_offers=args.sdp_offers)
    results = {"scenarios": [v.to_json() for v in verdicts]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "chaos.json").write_text(json.dumps(results, indent=2))
    print(table(verdicts), file=sys.stderr)
    return {"passed": sum(v.passed for v in verdicts), "failed": sum(not v.passed for v in verdicts),
            "results": str(args.out / "chaos.json")}


# Subcommands whose module parses its own flags: name -> (the module whose main(argv) runs it, what it does).
OWN_FLAGS = {
    "embedding-bench": ("latency_bench.components.embedding_bench",
                        "the knowledge embedder on both runtimes: query latency, ingestion, recall"),
    "retrieval-bench": ("latency_bench.components.retrieval_bench",
                        "knowledge retrieval at scale: latency, ingestion, store size, recall"),
    "transcribe-bench": ("latency_bench.components.transcribe_bench",
                         "long-file transcription: RTF with 1..N worker processes, WER and DER"),
    "hop-bench": ("latency_bench.components.hop_bench", "what a model worker's process hop costs one request"),
    "tts-memory": ("latency_bench.components.tts_memory",
                   "what the CPU voice keeps in memory after a long sentence, arena on and off"),
    "asr-workspace": ("latency_bench.components.asr_workspace",
                      "what one transcription costs in memory, by the window Whisper encodes"),
    "gc-pause": ("latency_bench.components.gc_pause", "how long a full GC collection stalls a loaded server"),
    "webrtc-path": ("latency_bench.components.webrtc_path",
                    "where a reply's first audio waits on the WebRTC and phone paths, offline"),
    "tts-codec": ("latency_bench.components.codec_bench",
                  "streaming SNAC decode against the public sliding-window decoder"),
    "prompt-sweep": ("latency_bench.quality.prompt_sweep",
                     "choose the default agent's system prompt and sampling by measurement"),
    "stock-pipecat": ("latency_bench.load.stock_pipecat",
                      "the stock pipecat phone agent that `compare` measures (a server; compare starts it)"),
    "malformed-fuzzer": ("latency_bench.chaos.inputs.malformed_fuzzer",
                         "the process that sends chaos malformed's faults (chaos starts it)"),
    "netns-caller": ("latency_bench.callers.netns_caller",
                     "a WebRTC caller inside a caller network (chaos lossy/blackhole start it)"),
    "orpheus-dev-server": ("latency_bench.components.orpheus_standins.dev_server",
                           "an Orpheus token server on the tiny random-weight Llama (CPU tests)"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in OWN_FLAGS:
        return importlib.import_module(OWN_FLAGS[argv[0]][0]).main(argv[1:]) or 0
    parser = argparse.ArgumentParser(prog="python -m latency_bench", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")

    def common(p, *, url_required: bool) -> None:
        p.add_argument("--url", required=url_required, help="server base URL, e.g. http://127.0.0.1:8000")
        p.add_argument("--transport", default="twilio", choices=["twilio", "webrtc", "realtime"])
        p.add_argument("--turns", type=int, default=5, help="turns per caller")
        p.add_argument("--seed", type=int, default=0, help="voices, questions and pauses are fixed by it")
        p.add_argument("--barge-in-every", type=int, default=0, metavar="K",
                       help="every K-th turn talks over the previous reply (0: never)")
        p.add_argument("--out", type=Path, required=True, help="folder for results.json and plots")
        p.add_argument("--quiet", action="store_true", help="no progress bar")
        p.add_argument("--agent", help="the agent the callers ask for (default: the server's default agent)")

    run_p = sub.add_parser("run", help="N callers (or a ramp up to N) against a server (--url, or one it starts)")
    common(run_p, url_required=False)
    run_p.add_argument("--callers", type=int, default=1)
    run_p.add_argument("--ramp", action="store_true", help="levels 1, 2, 4, ... up to --callers")
    cap_p = sub.add_parser("capacity", help="largest sustained concurrency within the SLO")
    common(cap_p, url_required=False)
    cap_p.add_argument("--slo-ms", type=float, default=1500.0, help="TTFS p95 SLO (default 1500 ms, for CPU)")
    pau_p = sub.add_parser("pauses", help="mid-sentence pauses: replies inside them, and TTFS of complete questions")
    pau_p.add_argument("--url", help="server base URL (default: the bench starts one)")
    pau_p.add_argument("--out", type=Path, required=True, help="folder for pauses.json")
    pau_p.add_argument("--runs", type=int, default=3, help="calls of ten turns each (five paused, five complete)")
    pau_p.add_argument("--pause-s", type=float, default=0.6, help="the pause in the middle of each paused sentence")
    pau_p.add_argument("--agent", help="the agent the caller asks for (default: the server's default agent)")
    tr_p = sub.add_parser("transports", help="one agent's TTFS by phone, WebRTC, /v1/realtime and a relay agent")
    common(tr_p, url_required=False)
    tr_p.add_argument("--runs", type=int, default=3, help="rounds; each makes one call through every way in")
    tr_p.add_argument("--ways", default=",".join(("twilio", "webrtc", "realtime", "twilio-relay")),
                      help="comma-separated, of: twilio, webrtc, realtime, twilio-relay")
    for p in (run_p, cap_p, pau_p, tr_p):  # without --url the bench starts (and stops) the server itself
        p.add_argument("--config", type=Path, help="config of the server the bench starts (default: configs/default.yaml)")
        p.add_argument("--deployment", help="where the started server runs each model: a deployment file, "
                                            "or none (all in-process); default: the config's")
        p.add_argument("--schedule", choices=["wanted-by", "arrival"],
                       help="server.schedule of the started server: how shared engines order waiting requests "
                            "(arrival: the A/B baseline); default: the config's")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="a setting of the started server's config, dotted key and YAML value "
                            "(repeatable), e.g. --set asr.partial_every_s=0.5")
        p.add_argument("--agent-file", action="append", default=[], type=Path,
                       help="an agent YAML to create on the started server (repeatable); ask for it with --agent")
    cap_p.add_argument("--min-turns", type=int, default=20,
                       help="turns measured per level at least (a p95 of a handful of turns is its maximum)")
    cap_p.add_argument("--start", type=int, default=1)
    cap_p.add_argument("--step", type=int, default=1)
    cap_p.add_argument("--max-callers", type=int, default=16)
    cmp_p = sub.add_parser("compare", help="Cadence against a stock pipecat pipeline on the same models")
    common(cmp_p, url_required=False)
    cmp_p.set_defaults(transport="twilio")
    cmp_p.add_argument("--callers", type=int, default=1)
    cmp_p.add_argument("--ours-url", help="a running Cadence server (default: the bench starts one)")
    cmp_p.add_argument("--stock-turn-stop", choices=["smart-turn", "vad"], default="smart-turn",
                       help="pipecat's default end-of-turn (smart-turn v3) or a plain VAD timeout")
    cmp_p.add_argument("--stock-stop-secs", type=float, default=0.4)
    ab_p = sub.add_parser("retrieval-ab", help="TTFS with the agent's retrieval on against off, alternating calls")
    common(ab_p, url_required=True)
    ab_p.add_argument("--rounds", type=int, default=3, help="calls to each agent, alternating")
    ch_p = sub.add_parser("chaos", help="what the server survives: slow clients, admission, drain (a table)")
    ch_p.add_argument("scenarios", nargs="+", metavar="SCENARIO",
                      help="slow-clients, handshake, admission, oversize, vanishing, malformed, bad-audio, endless, sdp, "
                           "poison, access, model-failures, soak, lossy, blackhole, drain (see latency_bench/chaos/suite.py)")
    ch_p.add_argument("--out", type=Path, required=True, help="folder for chaos.json and the servers' logs")
    ch_p.add_argument("--config", type=Path, help="config of the servers the bench starts "
                                                "(default: configs/default.yaml)")
    ch_p.add_argument("--minutes", type=float, default=60.0, help="how long the soak runs (default 60; "
                                                                   "its first sixth is warm-up)")
    ch_p.add_argument("--soak-callers", type=int, default=2,
                      help="callers in the soak (default 2, the issue's; 1 is what 2 cores hold at the target)")
    ch_p.add_argument("--lossy-minutes", type=float, default=5.0, help="how long each lossy call is held (default 5)")
    ch_p.add_argument("--llm-replicas", type=int, default=1,
                      help="model-failures: LLM worker replicas (default 1); a fault stops the one serving the turn")
    ch_p.add_argument("--sdp-offers", type=int, default=20_000,
                      help="sdp: mutated offers sent (default 20,000, the issue's; about a third start a real call)")
    q_p = sub.add_parser("quality", help="grounded answers, refusals and reply length of a running server")
    q_p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    q_p.add_argument("--agent", default="default", help="the agent to ask, by its name on the server")
    q_p.add_argument("--out", type=Path, required=True, help="folder for quality.json")
    q_p.add_argument("--spoken", action=argparse.BooleanOptionalAction, default=True,
                     help="also ask the spoken subset, one phone call per question (default: yes)")
    q_p.add_argument("--runs", type=int, default=1, help="times the whole set is asked")
    q_p.add_argument("--config", type=Path, help="the server's config, whose tts voice times the text replies "
                                               "(default: configs/default.yaml)")
    for name, (_module, what) in OWN_FLAGS.items():
        sub.add_parser(name, help=what, add_help=False)  # listed here; main() hands them their arguments
    args = parser.parse_args(argv)
    if getattr(args, "callers", 1) < 1 or getattr(args, "turns", 1) < 1 or getattr(args, "runs", 1) < 1:
        parser.error("--callers, --turns and --runs must be at least 1")
    if args.command == "chaos" and args.sdp_offers < 1:
        parser.error("--sdp-offers must be at least 1")
    if args.command == "compare" and args.transport != "twilio":
        parser.error("compare runs over the phone transport (the baseline serves /ws/twilio only)")
    command = {"run": cmd_run, "capacity": cmd_capacity, "compare": cmd_compare,
               "retrieval-ab": cmd_retrieval_ab, "quality": cmd_quality, "pauses": cmd_pauses,
               "transports": cmd_transports, "chaos": cmd_chaos}[args.command]
    try:
        print(json.dumps(command(args), indent=2, default=str))
    except (TimeoutError, RuntimeError, ConnectionError) as exc:
        print(f"latency_bench: {exc}", file=sys.stderr)
        return 1
    return 0
