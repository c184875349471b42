"""The `cadence` command.

    cadence serve [--config FILE] [--host H] [--port P] [--insecure]
    cadence agents list | show NAME | apply FILE     [--url URL]
    cadence chat NAME [--passages]                   [--url URL]
    cadence ingest NAME PATH...                      [--url URL]
    cadence bench SUBCOMMAND ...                     the bench: runs `python -m latency_bench SUBCOMMAND ...`
    cadence workers plan --deployment FILE [--json]   where each model's worker would run, or why not
    cadence workers up --deployment FILE              start them here, restart crashes, stop on SIGTERM
    cadence worker --deployment FILE --worker NAME    one of Cadence's own model workers (what `up` starts)
    cadence drain [--url URL] [--timeout S]           refuse new calls, wait for live ones (preStop)
    cadence transcribe FILE... [--json] [--workers N] long recordings to text, here (see --help)

`agents`, `chat` and `ingest` talk to a running server's HTTP API, sending $CADENCE_API_KEY
as the operator key when it is set. `serve` refuses a non-loopback --host without API keys
(auth.api_keys or $CADENCE_API_KEYS) unless given --insecure.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable

from agent.auth import bind_refusal, operator_keys
from agent.config import load_config
from agent.errors import ConfigError

DEFAULT_CONFIG = "configs/default.yaml"
DEFAULT_URL = "http://127.0.0.1:8000"
API_KEY_ENV = "CADENCE_API_KEY"  # the key `agents`, `chat` and `ingest` send, when the server has keys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    delegated = _delegated(argv)
    if delegated is not None:
        own_main, own_argv = delegated
        return own_main(own_argv)
    args = _parser().parse_args(argv)
    if args.command in ("agents", "chat", "ingest", "drain"):
        return _client(args)
    return _serve(args)


def _delegated(argv: list[str]) -> tuple[Callable[[list[str]], int | None], list[str]] | None:
    """(its main, its arguments) for a command that parses its own flags, or None. Nothing of
    the web server loads for these."""
    if argv[:1] == ["workers"] and argv[1:2] == ["plan"]:
        from workers import plan_cli

        return plan_cli.main, argv[2:]
    if argv[:1] == ["workers"] and argv[1:2] == ["up"]:
        from workers import up_cli

        return up_cli.main, argv[2:]
    if argv[:1] == ["transcribe"]:
        from transcription import cli as transcribe_cli

        return transcribe_cli.main, argv[1:]
    if argv[:1] == ["worker"]:
        from workers import serve_worker

        return serve_worker.main, argv[1:]
    if argv[:1] == ["bench"]:
        return _bench, argv[1:]
    return None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cadence", description="Cadence voice agent server")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the agent over WebRTC, phone WebSocket and HTTP")
    serve.add_argument("--config", default=DEFAULT_CONFIG, help=f"YAML config (default {DEFAULT_CONFIG})")
    serve.add_argument("--host", help="bind address (overrides server.host)")
    serve.add_argument("--port", type=int, help="port (overrides server.port)")
    serve.add_argument("--deployment", help="where each model runs (overrides the config's `deployment`)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.add_argument("--insecure", action="store_true",
                       help="serve on a non-loopback address without API keys (anyone who reaches it may call)")
    _add_client_commands(sub)
    workers = sub.add_parser("workers", help="the model plane: `workers plan|up --deployment FILE` (see --help of each)")
    workers.add_argument("workers_command", choices=["plan", "up"])
    sub.add_parser("worker", help="one of Cadence's own model workers: `worker --deployment FILE --worker NAME`")
    drain = sub.add_parser("drain", help="refuse new calls and wait until the live ones end (Kubernetes preStop)")
    drain.add_argument("--url", default=DEFAULT_URL, help=f"the server (default {DEFAULT_URL}); only from its machine")
    drain.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for live calls (default 600)")
    sub.add_parser("bench", help="the bench (a distribution of its own): `bench SUBCOMMAND ...` runs "
                                 "`python -m latency_bench SUBCOMMAND ...`, e.g. `bench tts-codec --json`")
    return parser


def _add_client_commands(sub) -> None:
    """`agents`, `chat` and `ingest`: clients of a running server's HTTP API."""
    agents = sub.add_parser("agents", help="list, show or apply agents on a running server")
    agents_sub = agents.add_subparsers(dest="agents_command", required=True)
    listing = agents_sub.add_parser("list", help="every agent, the default first")
    show = agents_sub.add_parser("show", help="one agent: its definition and what calls get")
    show.add_argument("name")
    apply = agents_sub.add_parser("apply", help="create or replace the agent a YAML/JSON file defines")
    apply.add_argument("file")
    chat = sub.add_parser("chat", help="talk to an agent in text: the same retrieval + LLM path as a call")
    chat.add_argument("name")
    chat.add_argument("--passages", action="store_true", help="print the passages each reply used")
    ingest = sub.add_parser("ingest", help="add documents (.txt .md .html .pdf, or folders) to an agent's knowledge")
    ingest.add_argument("name")
    ingest.add_argument("paths", nargs="+")
    ingest.add_argument("--quiet", action="store_true", help="no progress bar")
    for client in (listing, show, apply, chat, ingest):
        client.add_argument("--url", default=DEFAULT_URL, help=f"the server (default {DEFAULT_URL})")


def _serve(args) -> int:
    overrides = {}
    if args.host:
        overrides["server__host"] = args.host
    if args.port:
        overrides["server__port"] = args.port
    if args.deployment:
        overrides["deployment"] = args.deployment
    from agent.app import create_app
    from agent.serve import cadence_server

    try:
        config = load_config(args.config, **overrides)
        refusal = bind_refusal(config.server.host, bool(operator_keys(config.auth, os.environ)), insecure=args.insecure)
        if refusal:
            raise ConfigError(refusal.replace("insecure=True", "--insecure"))
        logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        if args.log_level.upper() != "DEBUG":  # at INFO, a line per llama-server health probe (every 2 s)
            logging.getLogger("httpx").setLevel(logging.WARNING)
        _quiet_loguru(args.log_level)
        app = create_app(config, freeze_after_load=True)  # reads the agent files: a bad one stops startup here
    except ConfigError as exc:
        print(f"cadence: {exc}", file=sys.stderr)
        return 2
    cadence_server(app, config, host=config.server.host, port=config.server.port, log_level=args.log_level).run()
    return 0


def _client(args) -> int:
    import httpx

    from agent import agents_cli, ingest_cli

    url = args.url.rstrip("/")
    # The operator key, from the environment only: a flag would leave it in shell history and `ps`.
    api_key = os.environ.get(API_KEY_ENV, "").strip()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    try:
        if args.command == "drain":
            from agent.drain_cli import drain

            return drain(url, timeout_s=args.timeout)
        if args.command == "chat":
            return agents_cli.chat(url, args.name, show_passages=args.passages, headers=headers)
        if args.command == "ingest":
            return ingest_cli.ingest(url, args.name, args.paths, progress=not args.quiet, headers=headers)
        if args.agents_command == "list":
            return agents_cli.list_agents(url, headers=headers)
        if args.agents_command == "show":
            return agents_cli.show_agent(url, args.name, headers=headers)
        return agents_cli.apply_agent(url, args.file, headers=headers)
    except httpx.TransportError as exc:
        print(f"cadence: cannot reach {url}: {exc}; is `cadence serve` running?", file=sys.stderr)
        return 2


# pipecat's turn-stop strategy warns, once per call, that the VAD's stop_secs is not the 0.2 s
# its STT p99 figures assume; Cadence's STT gives it no p99 figure (pipelines/stt.py,
# supports_ttfs), so the advice does not apply, and a WARNING per call hides real ones.
_NOT_OURS = ("differs from the recommended default",)
# pipecat logs at ERROR every error frame a service pushes. A model failure Cadence handles (a
# stalled or failed model: the caller hears an apology or the CPU voice, the call goes on)
# reaches the log at WARNING anyway, as pipecat's "Something went wrong: ErrorFrame(...)" when
# the frame arrives, and for the LLM as ours naming the turn's fate; at ERROR as well, each
# handled failure would page whoever watches the server's errors.
_HANDLED_MODEL_FAILURES = ("LLM unavailable: ", "speech recognition unavailable: ",
                           "speech synthesis unavailable: ")


def _kept(record) -> bool:
    message = record["message"]
    if any(text in message for text in _NOT_OURS):
        return False
    return not (record["function"] == "push_error_frame" and any(text in message for text in _HANDLED_MODEL_FAILURES))


def _quiet_loguru(level: str) -> None:
    """pipecat logs through loguru at DEBUG by default: a line per frame event per call,
    which costs CPU under load and floods the log. Hold it to the server's log level."""
    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level=level.upper(), filter=_kept)


def _bench(argv: list[str]) -> int:
    """The bench is a tool apart from the product (it imports the product, never the other way),
    so it runs as a process of its own: `python -m latency_bench ARGV...`."""
    import importlib.util
    import subprocess
    from pathlib import Path

    # `python -m` finds it installed, or in the working directory (a checkout's root).
    if importlib.util.find_spec("latency_bench") is None and not Path("latency_bench", "__main__.py").is_file():
        print("cadence bench: the bench is not installed; from a checkout: pip install -e ./latency_bench",
              file=sys.stderr)
        return 2
    return subprocess.call([sys.executable, "-m", "latency_bench", *argv])


if __name__ == "__main__":
    sys.exit(main())
