"""Cadence's exceptions, in one place.

    CadenceError                 base; `retryable` says whether the same request may succeed later
    ├── ConfigError              the configuration is invalid; fix the YAML or the flags
    ├── ModelAssetError          weights missing or corrupt (sha256 mismatch); reinstall the package
    ├── CapacityError            a limit is reached (calls, engine queue, dashboard streams); retry later (retryable)
    │   └── SessionLimitError    an operator key has all its concurrent sessions open (-> 429) (retryable)
    ├── WorkerUnavailableError   a model worker cannot be reached or went away mid-request (retryable)
    ├── NotFoundError            no such agent, call or document (-> 404)
    ├── ConflictError            the change clashes with what exists: a duplicate name, a file-defined agent (-> 409)
    ├── UnauthorizedError        no credential, a malformed one, or one we do not accept; `reason` says which (-> 401)
    ├── ForbiddenError           the caller is known but this is not allowed: a browser Origin not listed (-> 403)
    └── BadInputError            a caller sent something we cannot accept; the call may go on
        ├── BadMediaError        audio payload undecodable or of the wrong size
        ├── BadSignalingError    malformed JSON event or SDP
        └── BadQueryError        an HTTP query parameter is malformed or out of range (-> 400)

Messages say what went wrong and what to do, and never carry secrets or transcripts.
The first five live in `models/errors.py`, so that model code and workers need nothing
from this layer; they are re-exported here.
"""

from models.errors import CadenceError, CapacityError, ConfigError, ModelAssetError, WorkerUnavailableError

__all__ = [
    "CadenceError", "ConfigError", "ModelAssetError", "CapacityError", "WorkerUnavailableError",
    "NotFoundError", "ConflictError", "BadInputError", "BadMediaError", "BadSignalingError", "BadQueryError",
    "UnauthorizedError", "ForbiddenError", "SessionLimitError",
]


class NotFoundError(CadenceError):
    pass


class ConflictError(CadenceError):
    pass


class UnauthorizedError(CadenceError):
    """`reason` is one of: missing, malformed, invalid (operator key), unknown, expired, reused
    (client token). The message never repeats the credential that was presented."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class ForbiddenError(CadenceError):
    pass


class SessionLimitError(CapacityError):
    def __init__(self, message: str, *, key_id: str, limit: int, open_sessions: int) -> None:
        super().__init__(message)
        self.key_id = key_id
        self.limit = limit
        self.open_sessions = open_sessions


class BadInputError(CadenceError):
    pass


class BadMediaError(BadInputError):
    pass


class BadSignalingError(BadInputError):
    pass


class BadQueryError(BadInputError):
    pass
