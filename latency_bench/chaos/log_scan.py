"""Which of a caller's secrets a log holds, however it came to be spelled there: as said, in a
URL's percent- or plus-encoding, a phone or card number with other separators (or none), a
key or token without its prefix. Pure: text in, findings out.

`sensitive` is (kind, secret) pairs; kinds as `latency_bench.chaos.inputs.injections.TURN_KINDS` names them.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_plus

# Numbers a log could hold in another spelling: phone numbers as their last 10 digits (the
# national number), cards as their 16.
DIGIT_KINDS = {"phone": 10, "card": 16}
_DIGIT_RUN = re.compile(r"\d[\d\s().+\-/]*\d")
FIRST_LINE_CHARS = 300  # of the first offending line, kept for a person to read


def _digit_runs(line: str) -> list[str]:
    return [re.sub(r"\D", "", run) for text in {line, unquote_plus(line)} for run in _DIGIT_RUN.findall(text)]


def spellings(kind: str, secret: str) -> list[str]:
    """How a log could hold `secret`: as said, and for keys and tokens their random part alone."""
    if kind == "ek-token":
        return [secret, secret.removeprefix("ek_")]
    if kind == "api-key":
        return [secret, secret.rsplit("-", 1)[-1]]
    return [secret]


def scan_log(text: str, sensitive: list[tuple[str, str]]) -> dict:
    lines = text.splitlines()
    runs = [_digit_runs(line) if any(c.isdigit() for c in line) else [] for line in lines]
    found = []
    for kind, secret in sensitive:
        digits = re.sub(r"\D", "", secret)[-DIGIT_KINDS[kind]:] if kind in DIGIT_KINDS else None
        hits = [n for n, line in enumerate(lines)
                if any(s in line or s in unquote_plus(line) for s in spellings(kind, secret))
                or (digits and any(digits in run for run in runs[n]))]
        if hits:
            found.append({"kind": kind, "lines": len(hits), "first_line": lines[hits[0]][:FIRST_LINE_CHARS]})
    return {"lines": len(lines), "secrets_checked": len(sensitive), "secrets_found": found}
