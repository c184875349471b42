"""Load: callers in numbers against a server (run, capacity, compare, transports, retrieval A/B), and the
stock-pipecat baseline that compare measures beside Cadence."""
