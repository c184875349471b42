"""Memory per turn inside one long phone call, measured cheaply (not a test: a tool).

    python -m tests.reliability.mem_per_turn --no-trace              # RSS, glibc, objects per turn
    python -m tests.reliability.mem_per_turn                         # + tracemalloc top entries
    python -m tests.reliability.mem_per_turn --no-trace --engines real --llm chat-server --callers 2
    python -m tests.reliability.mem_per_turn --no-trace --endless 240 --warmup 3 --turns 6

The real server (real Silero VAD, real Twilio transport and pipeline) runs in this process,
on fake engines unless `--engines real` (Whisper, Piper, the embedder and Smart Turn
in-process, as the CPU deployment runs them; the LLM stays scripted, or `--llm chat-server`:
the deployment's LLM client against a stand-in llama-server in a process of its own).
Callers run in subprocesses and speak espeak questions `--clock-rate` times faster than real
time. After `--warmup` turns of the first caller, then after N and 3N more (`--turns N`),
this process counts the gc-tracked objects by type (weak references by referent and holder),
reads its RSS and glibc's account of malloc (in use; free but kept), takes a tracemalloc
snapshot, and prints the growth from N to 3N per turn and the top tracemalloc entries.

Read RSS from --no-trace runs only: with tracemalloc on, RSS also holds its snapshots and
trace tables (+80 MB over a run here). A checkpoint holds the GIL for a few seconds (so that
the server does not move on mid-count); the turn after one may miss its reply under tracing.
The fakes' own records (ScriptedASR.heard, ScriptedLLM.prompts, ToneTTS.sentences) are kept
in zero-length deques: they would otherwise be the largest leak in sight.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import ctypes
import gc
import json
import random
import subprocess
import sys
import tempfile
import time
import tracemalloc
import weakref
from dataclasses import replace
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
ENDLESS_STEP_S = 10.0  # with --endless, the measured unit ("turn") is this much of the monologue


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def malloc_figures() -> dict:
    """glibc's own account, all arenas (non-destructive, unlike malloc_trim): MB handed out and
    in use (in arenas + mmapped), MB free but kept in its arenas; and Python's small-object blocks."""
    figures = {"py_blocks": sys.getallocatedblocks()}
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        info = libc.mallinfo2()
        figures.update(malloc_in_use_mb=(info.uordblks + info.hblkhd) / 2**20, malloc_free_kept_mb=info.fordblks / 2**20)
    except (OSError, AttributeError):  # not glibc 2.33+
        pass
    return figures


def rss_by_mapping() -> collections.Counter:
    """Resident KB by kind of mapping (/proc/self/smaps): the C heap, anonymous mmaps (pymalloc
    arenas, large mallocs, native allocators), thread stacks, and files by name."""
    kb: collections.Counter = collections.Counter()
    name = ""
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and len(fields) >= 5 and not fields[0].endswith(":"):
            name = fields[5] if len(fields) > 5 else "[anon]"
            name = Path(name).name if name.startswith("/") else name
        elif fields and fields[0] == "Rss:":
            kb[name] += int(fields[1])
    return kb


def object_counts() -> collections.Counter:
    """gc-tracked objects by type; weak references also by what they refer to and hold them
    (`weakref->Target@Holder`), since a growing count of them says little on its own."""
    gc.collect()
    objects = gc.get_objects()
    counts = collections.Counter(type(o).__name__ for o in objects)
    holders: dict[int, set[str]] = collections.defaultdict(set)  # weakref id -> its holders' types
    for o in objects:
        for r in gc.get_referents(o):
            if type(r) is weakref.ReferenceType:
                holders[id(r)].add(type(o).__name__)
    for ref in (o for o in objects if type(o) is weakref.ReferenceType):
        counts[f"weakref->{type(ref()).__name__}@{'/'.join(sorted(holders[id(ref)]))}"] += 1
    return counts


def call_state(app) -> dict:
    """What the live call holds: turns on its timeline, messages in its LLM context."""
    state = {}
    for call in list(app.state.manager._active.values()):
        if call.voice is not None:
            state = {"timeline_turns": len(call.voice.observer.timeline.turns),
                     "context_messages": len(call.voice.context.messages),
                     "context_chars": sum(len(str(m.get("content", ""))) for m in call.voice.context.messages)}
    return state


def dead_weakref_holders() -> None:
    """Where the lists of dead weak references are: each list's length and its owners."""
    gc.collect()
    for o in gc.get_objects():
        if type(o) is list and o and all(type(r) is weakref.ReferenceType and r() is None for r in o[:50]):
            owners = []
            for h in gc.get_referrers(o):
                if isinstance(h, dict):
                    keys = [k for k, v in h.items() if v is o]
                    owners.append(f"dict[{keys}] of " + ",".join(
                        type(x).__qualname__ + (f"({getattr(x, '__qualname__', '')})" if callable(x) else "")
                        for x in gc.get_referrers(h) if x is not None and type(x).__name__ not in ("frame", "list"))[:300])
                elif type(h).__name__ not in ("frame", "list"):
                    owners.append(type(h).__qualname__)
            print(f"  list of {len(o)} dead weakrefs held by {owners}", flush=True)


def checkpoint(label: str, app, trace: bool, holders: bool = False, trim: bool = False) -> dict:
    # The server runs in a thread of this process: it waits while we count (a long switch
    # interval keeps the GIL here), so it neither moves on mid-count nor meets objects
    # (buffers, memoryviews) that our lists keep alive.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(60.0)
    try:
        point = _checkpoint(label, app, trace, holders)
        if trim:  # what of the RSS is freed heap glibc kept (returned now) rather than memory in use
            from agent.memory import return_freed_memory

            return_freed_memory()
            point["rss_trimmed_mb"] = rss_mb()
            print(f"[{label}] after gc + malloc_trim: rss {point['rss_trimmed_mb']:.1f} MB", flush=True)
        return point
    finally:
        sys.setswitchinterval(interval)


def _checkpoint(label: str, app, trace: bool, holders: bool) -> dict:
    if holders:
        dead_weakref_holders()
    counts = object_counts()
    point = {"label": label, "at": time.monotonic(), "rss_mb": rss_mb(), "objects": counts,
             "call": call_state(app), "mappings": rss_by_mapping(), **malloc_figures()}
    if trace:
        point["snapshot"] = tracemalloc.take_snapshot().filter_traces(
            (tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen importlib._bootstrap>")))
        point["traced_mb"] = tracemalloc.get_traced_memory()[0] / 2**20
        point["tracemalloc_overhead_mb"] = tracemalloc.get_tracemalloc_memory() / 2**20
    print(f"[{label}] rss {point['rss_mb']:.1f} MB traced {point.get('traced_mb', 0):.1f} MB "
          f"(tracemalloc's own {point.get('tracemalloc_overhead_mb', 0):.1f} MB) "
          f"malloc in use {point.get('malloc_in_use_mb', 0):.1f} MB, free kept {point.get('malloc_free_kept_mb', 0):.1f} MB, "
          f"python blocks {point['py_blocks']} objects {sum(counts.values())} call {point['call']}", flush=True)
    return point


def report(a: dict, b: dict, turns: int, trace: bool, top: int) -> None:
    print(f"\n=== growth from {a['label']} to {b['label']} ({turns} turns) ===")
    print(f"RSS: {b['rss_mb'] - a['rss_mb']:+.2f} MB, {(b['rss_mb'] - a['rss_mb']) * 1024 / turns:+.1f} KB/turn"
          + (" (with tracemalloc on, RSS holds the snapshots and trace tables: compare RSS with --no-trace)"
             if trace else ""))
    if "malloc_in_use_mb" in a:
        in_use, kept = (b[k] - a[k] for k in ("malloc_in_use_mb", "malloc_free_kept_mb"))
        print(f"glibc malloc: in use {in_use:+.2f} MB ({in_use * 1024 / turns:+.1f} KB/turn), "
              f"free but kept {kept:+.2f} MB; python blocks {b['py_blocks'] - a['py_blocks']:+d}")
    mapped = collections.Counter(b["mappings"])
    mapped.subtract(a["mappings"])
    print("  RSS by mapping: " + ", ".join(f"{name} {kb:+d} KB" for name, kb in mapped.most_common(6) if kb)
          + "; shrank: " + ", ".join(f"{name} {kb:+d} KB" for name, kb in mapped.most_common()[:-4:-1] if kb < 0))
    if "rss_trimmed_mb" in a:
        grown = b["rss_trimmed_mb"] - a["rss_trimmed_mb"]
        print(f"RSS after gc + malloc_trim: {grown:+.2f} MB, {grown * 1024 / turns:+.1f} KB/turn")
    if trace:
        traced = b["traced_mb"] - a["traced_mb"]
        print(f"traced (Python allocations): {traced:+.2f} MB, {traced * 1024 / turns:+.1f} KB/turn")
    diff = b["objects"] - a["objects"]
    shrunk = a["objects"] - b["objects"]
    print(f"gc objects: {sum(b['objects'].values()) - sum(a['objects'].values()):+d} "
          f"({(sum(b['objects'].values()) - sum(a['objects'].values())) / turns:+.1f}/turn)")
    print("  grew most: " + ", ".join(f"{name} {n:+d} ({n / turns:+.2f}/turn)" for name, n in diff.most_common(15)))
    print("  shrank most: " + ", ".join(f"{name} -{n}" for name, n in shrunk.most_common(5)))
    print(f"call state: {a['call']} -> {b['call']}")
    if trace:
        for key in ("lineno", "traceback"):
            print(f"\n--- tracemalloc top {top} by {key} ---")
            for stat in b["snapshot"].compare_to(a["snapshot"], key)[:top]:
                if key == "lineno":
                    print(f"  {stat.size_diff / 1024:+9.1f} KB {stat.count_diff:+7d} blocks  {stat.traceback[0]}")
                else:
                    frames = [f"{f.filename.replace(str(REPO_ROOT) + '/', '').split('site-packages/')[-1]}:{f.lineno}"
                              for f in stat.traceback]
                    print(f"  {stat.size_diff / 1024:+9.1f} KB {stat.count_diff:+7d} blocks  "
                          + " <- ".join(reversed(frames[-8:])))


def chat_server(port_file: str) -> None:
    """A stand-in for llama-server (its own process: its memory is not the agent server's): an
    OpenAI chat endpoint that streams a one-sentence reply of 4-24 words, a word a piece."""
    import socket

    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    replies = random.Random(0)
    words = ("we open at nine on saturday and the clinic closes at noon while parking is free behind "
             "the building for every patient who books").split()

    async def chat(request):
        body = await request.json()
        # A new sentence length most turns, as a real model's replies have (the voice meets them).
        reply = " ".join(replies.choices(words, k=replies.randint(4, 24))).capitalize() + "."
        pieces = [f"{w} " for w in reply.split()]

        async def events():
            for piece in pieces[: body.get("max_tokens", len(pieces))]:
                yield f"data: {json.dumps({'choices': [{'delta': {'content': piece}}]})}\n\n"
                await asyncio.sleep(0.02)
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                            Route("/health", lambda request: JSONResponse({"status": "ok"}))])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    Path(port_file).write_text(str(sock.getsockname()[1]))
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


def chat_server_llm(tmp: str):
    """The LLM client the CPU deployment uses (OpenAIChatLLMEngine) against `chat_server`."""
    from models.openai_chat import OpenAIChatLLMEngine, OpenAIChatOptions

    port_file = Path(tmp) / "chat.port"
    server = subprocess.Popen([sys.executable, "-m", "tests.reliability.mem_per_turn", "--chat-server", str(port_file)],
                              cwd=REPO_ROOT)
    while not port_file.exists() or not port_file.read_text():
        time.sleep(0.05)
    engine = OpenAIChatLLMEngine(OpenAIChatOptions(base_url=f"http://127.0.0.1:{port_file.read_text()}"))
    for _ in range(100):
        try:
            engine.load()
            break
        except Exception:
            time.sleep(0.1)
    return engine, server


def forgetful_engines():
    from pipelines.voice import Engines
    from tests.fakes import HashingEmbedder, ScriptedASR, ScriptedLLM, ToneTTS

    asr = ScriptedASR("what time do you open on saturday")
    llm = ScriptedLLM(["We open at nine ", "on Saturday."])
    tts = ToneTTS(chunks=3)
    asr.heard = collections.deque(maxlen=0)
    llm.prompts, llm.warmed, llm.samplings = (collections.deque(maxlen=0) for _ in range(3))
    tts.sentences = collections.deque(maxlen=0)
    return Engines(asr=asr, llm=llm, tts=tts, embedder=HashingEmbedder())


def real_engines(config):
    """The in-process models of the CPU deployment (Whisper, Piper, the embedder, Smart Turn),
    loaded and warmed; the LLM stays scripted (it is a process of its own there, outside this
    process's memory)."""
    from agent import engine_factory
    from pipelines.voice import Engines

    fake = forgetful_engines()
    engines = Engines(asr=engine_factory.build_asr(config), llm=fake.llm, tts=engine_factory.build_tts(config),
                      embedder=engine_factory.build_embedder(config), turn_end=engine_factory.build_turn_end(config))
    engine_factory.load_and_warm(engines)
    return engines


def serve_and_measure(args) -> None:
    from agent.config import StoreConfig, load_config
    from tests.conftest import running_server

    from loguru import logger

    logger.remove()  # pipecat's DEBUG lines cost more CPU than the calls here
    logger.add(sys.stderr, level="WARNING")
    config = load_config(REPO_ROOT / "configs" / "default.yaml")
    with tempfile.TemporaryDirectory() as tmp:
        config = replace(config, store=StoreConfig(path=f"{tmp}/calls.sqlite3"),
                         limits=replace(config.limits, max_audio_ahead_seconds=1e6, idle_timeout_seconds=600),
                         transcription=replace(config.transcription, upload_dir=f"{tmp}/uploads"))
        engines = real_engines(config) if args.engines == "real" else forgetful_engines()
        chat = None
        if args.llm == "chat-server":
            llm, chat = chat_server_llm(tmp)
            engines = replace(engines, llm=llm)
        config = replace(config, server=replace(config.server, max_concurrent_calls=args.callers))
        if args.trace:
            tracemalloc.start(args.frames)
        with running_server(config, engines) as server:
            command = [sys.executable, "-m", "tests.reliability.mem_per_turn", "--client", server.ws_url,
                       "--turns", str(args.warmup + 3 * args.turns + 1), "--clock-rate", str(args.clock_rate),
                       "--endless", str(args.endless)]
            # Callers after the first talk on in the background (their turns are logged to a file).
            others = [subprocess.Popen(command, stdout=open(f"{tmp}/caller-{n}.log", "w"), cwd=REPO_ROOT)
                      for n in range(1, args.callers)]
            client = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT)
            marks = {args.warmup: "warm", args.warmup + args.turns: "N", args.warmup + 3 * args.turns: "3N"}
            points = {}
            started = time.monotonic()
            try:
                for line in client.stdout:
                    done = json.loads(line)
                    if done.get("error"):
                        print(f"turn {done['turn']}: {done['error']}", flush=True)
                    if done["turn"] in marks:
                        print(f"turn {done['turn']} after {time.monotonic() - started:.0f} s", flush=True)
                        label = marks[done["turn"]]
                        points[label] = checkpoint(label, server.app, args.trace, args.holders and label == "3N",
                                                   args.trim)
                    if "3N" in points:
                        break
            finally:
                for process in (client, *others):
                    process.terminate()
                    process.wait(timeout=10)
                for n in range(1, args.callers):
                    failed = [line for line in Path(f"{tmp}/caller-{n}.log").read_text().splitlines()
                              if json.loads(line).get("error")]
                    print(f"caller {n}: {len(failed)} turns failed", flush=True)
        if chat is not None:
            chat.terminate()
            chat.wait(timeout=10)
        if "3N" in points:
            report(points["N"], points["3N"], 2 * args.turns, args.trace, args.top)
            report(points["warm"], points["N"], args.turns, False, 0)


async def call(url: str, turns: int, clock_rate: float) -> None:
    from latency_bench.callers import twilio_caller
    from latency_bench.callers.conversation import PlannedTurn
    from latency_bench.callers.speech import available_voices, speak_as

    questions = ("What time do you open on Saturday?", "Can I book an appointment for Tuesday?",
                 "Where do I park when I arrive?", "Do you take walk-in patients?")
    spoken = [speak_as(q, available_voices()[0]) for q in questions]
    plan = [PlannedTurn.of(*spoken[i % len(spoken)], questions[i % len(spoken)], pause_before_s=0.6)
            for i in range(turns)]

    def on_turn(turn) -> None:
        print(json.dumps({"turn": turn.index + 1, "error": turn.error}), flush=True)

    await twilio_caller.call(f"{url}/ws/twilio", plan, clock_rate=clock_rate, reply_quiet_s=0.3,
                             reply_timeout_s=20, on_turn=on_turn)


async def monologue_call(url: str, seconds: float, clock_rate: float, every_s: float) -> None:
    """One turn that does not end for `seconds` (chaos endless's monologue), then a pause;
    a line on stdout every `every_s` of audio sent."""
    import uuid

    import websockets

    from latency_bench.chaos.endless import monologue
    from latency_bench.callers.twilio_caller import PhoneLine

    audio, rate, _ = monologue(seconds)
    sid = "MZ" + uuid.uuid4().hex
    async with websockets.connect(f"{url}/ws/twilio", max_size=2**20) as ws:
        await ws.send(json.dumps({"event": "connected"}))
        await ws.send(json.dumps({"event": "start", "streamSid": sid, "start": {
            "streamSid": sid, "callSid": "CA" + uuid.uuid4().hex, "accountSid": "AC" + "0" * 32,
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}}))
        drain = asyncio.create_task(_drain(ws))
        line = PhoneLine(ws, sid, clock_rate)
        step = int(every_s * rate)
        for n, start in enumerate(range(0, len(audio), step)):
            await line.say(audio[start:start + step], rate, lambda at: None)
            print(json.dumps({"turn": n + 1, "audio_s": (start + step) / rate, "error": None}), flush=True)
        await line.pause(3.0)
        drain.cancel()


async def _drain(ws) -> None:
    async for _ in ws:
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=40, help="N: growth measured from warm-up + N to warm-up + 3N turns")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--clock-rate", type=float, default=3.0, help="the caller's speed against real time")
    parser.add_argument("--frames", type=int, default=12, help="tracemalloc traceback depth")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--no-trace", dest="trace", action="store_false")
    parser.add_argument("--engines", choices=("fake", "real"), default="fake",
                        help="real: Whisper, Piper, the embedder and Smart Turn in-process (the LLM stays scripted)")
    parser.add_argument("--llm", choices=("scripted", "chat-server"), default="scripted",
                        help="chat-server: the deployment's LLM client against a stand-in llama-server")
    parser.add_argument("--callers", type=int, default=1, help="callers, one call each (caller 0 paces the checkpoints)")
    parser.add_argument("--trim", action="store_true",
                        help="at each checkpoint also gc + malloc_trim and read RSS again")
    parser.add_argument("--holders", action="store_true", help="at 3N, say who holds lists of dead weakrefs")
    parser.add_argument("--endless", type=float, default=0.0, metavar="SECONDS",
                        help="one turn of SECONDS without a pause instead; a 'turn' is then 10 s of it")
    parser.add_argument("--client", metavar="WS_URL")
    parser.add_argument("--chat-server", metavar="PORT_FILE")
    args = parser.parse_args()
    if args.chat_server:
        chat_server(args.chat_server)
    elif args.client and args.endless:
        asyncio.run(monologue_call(args.client, args.endless, args.clock_rate, ENDLESS_STEP_S))
    elif args.client:
        asyncio.run(call(args.client, args.turns, args.clock_rate))
    else:
        serve_and_measure(args)


if __name__ == "__main__":
    main()
