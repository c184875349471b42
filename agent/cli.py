"""`cadence serve [--config FILE] [--host H] [--port P]` and `cadence bench tts-codec [--json]`"""

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
    bench = sub.add_parser("bench", help="component benchmarks")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    codec = bench_sub.add_parser("tts-codec", help="streaming SNAC decode vs the public sliding-window decoder")
    codec.add_argument("--json", action="store_true", help="print one JSON object")
    codec.add_argument("--quick", action="store_true", help="fewer batch sizes and shorter streams")
    codec.add_argument("--device", default="cpu", help="cpu, or cuda on GPU hosts")
    codec.add_argument("--max-streams", type=int, default=32, help="stop the real-time stream search here")
    codec.add_argument("--batches", default="1,2,4,8,16", help="batch sizes whose throughput is measured")
    codec.add_argument("--compile", action="store_true", help="torch.compile the decoder (each shape compiles once)")
    codec.add_argument("--trials", type=int, default=3, help="runs per stream count in the real-time search (median)")
    args = parser.parse_args(argv)
    if args.command == "bench":
        return _bench(args)

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _quiet_loguru(args.log_level)
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


def _quiet_loguru(level: str) -> None:
    """pipecat logs through loguru at DEBUG by default: a line per frame event per call,
    which costs CPU under load and floods the log. Hold it to the server's log level."""
    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level=level.upper())


def _bench(args) -> int:
    import json

    from models.orpheus import codec_bench

    batches = tuple(int(b) for b in args.batches.split(","))
    result = codec_bench.run(quick=args.quick, device=args.device, max_streams=args.max_streams, batches=batches,
                             compile=args.compile, trials=args.trials)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:45s} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
