"""`python -m latency_bench SUBCOMMAND ...`: the bench's one way in (the subcommands: latency_bench/cli.py)."""

import sys

from latency_bench.cli import main

sys.exit(main())
