"""Reliability scenarios: what the server survives, each judged by one Verdict (see suite.py)."""
