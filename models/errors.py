"""The exceptions every layer may raise, at the bottom so that `models/` (and a worker
process that imports only `models/`) needs nothing above it: the root of the one tree,
which agent/errors.py draws whole.

    CadenceError                 base; `retryable` says whether the same request may succeed later
    ├── ConfigError              the configuration is invalid; fix the YAML or the flags
    ├── ModelAssetError          weights missing or corrupt (sha256 mismatch); reinstall the package
    ├── CapacityError            a limit is reached (calls, engine queue, a full worker); retry later (retryable)
    ├── WorkerUnavailableError   a model worker cannot be reached or went away mid-request (retryable)
    └── StalledError             a model's answer stopped coming within its deadline (retryable)

Above them: the agent server's own (agent/errors.py: not found, conflicts, access, bad
input), knowledge's (knowledge/errors.py) and transcription's (transcription/errors.py),
all under the same base. Messages say what went wrong and what to do, and never carry
secrets or transcripts.
"""

from __future__ import annotations


class CadenceError(Exception):
    retryable = False


class ConfigError(CadenceError):
    pass


class ModelAssetError(CadenceError):
    pass


class CapacityError(CadenceError):
    retryable = True


class WorkerUnavailableError(CadenceError):
    retryable = True


class StalledError(CadenceError):
    """A model's answer stopped coming: nothing within its deadline (models/stalls.py)."""

    retryable = True
