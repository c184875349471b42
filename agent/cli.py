"""`cadence serve [--config FILE] [--host H] [--port P]`"""

from __future__ import annotations

import argparse
import logging
import sys

from agent.config import load_config
from agent.errors import ConfigError

DEFAULT_CONFIG = "configs/default.yaml"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cadence", description="Cadence voice agent server")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the agent over WebRTC, phone WebSocket and HTTP")
    serve.add_argument("--config", default=DEFAULT_CONFIG, help=f"YAML config (default {DEFAULT_CONFIG})")
    serve.add_argument("--host", help="bind address (overrides server.host)")
    serve.add_argument("--port", type=int, help="port (overrides server.port)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    overrides = {}
    if args.host:
        overrides["server__host"] = args.host
    if args.port:
        overrides["server__port"] = args.port
    try:
        config = load_config(args.config, **overrides)
    except ConfigError as exc:
        print(f"cadence: {exc}", file=sys.stderr)
        return 2

    from agent.app import create_app
    from agent.serve import cadence_server

    cadence_server(create_app(config), config, host=config.server.host, port=config.server.port,
                   log_level=args.log_level).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
