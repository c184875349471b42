"""The real server on fake engines, in a process of its own, for scenarios that signal it.

    python -m tests.reliability.fake_server --db PATH --port-file PATH [--grace S] [--max-calls N]

Binds 127.0.0.1 on a free port, writes the port to --port-file once it is ready for calls,
and serves on the main thread as `cadence serve` does, so uvicorn handles SIGTERM and SIGINT.
Exits with the server's own status."""

from __future__ import annotations

import argparse
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path

from agent.app import create_app
from agent.config import StoreConfig, load_config
from agent.serve import cadence_server
from pipelines.voice import Engines
from tests.fakes import HashingEmbedder, ScriptedASR, ScriptedLLM, ToneTTS

REPO_ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--grace", type=float, default=25.0)
    parser.add_argument("--max-calls", type=int, default=10)
    args = parser.parse_args()

    config = load_config(REPO_ROOT / "configs" / "default.yaml")
    config = replace(config, store=StoreConfig(path=args.db),
                     server=replace(config.server, max_concurrent_calls=args.max_calls,
                                    shutdown_grace_seconds=args.grace))
    engines = Engines(asr=ScriptedASR("hi"), llm=ScriptedLLM(["Hello there."]), tts=ToneTTS(),
                      embedder=HashingEmbedder())
    app = create_app(config, engines=engines, engines_loaded=True, environ={}, freeze_after_load=True)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = cadence_server(app, config, log_level="info", lifespan="on")

    def announce_when_ready() -> None:
        while not (server.started and app.state.readiness.ready.is_set()):
            time.sleep(0.02)
        Path(args.port_file).write_text(str(sock.getsockname()[1]))

    threading.Thread(target=announce_when_ready, daemon=True).start()
    server.run(sockets=[sock])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
