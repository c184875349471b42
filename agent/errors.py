"""Cadence's exceptions, in one place.

    CadenceError                 base; `retryable` says whether the same request may succeed later
    ├── ConfigError              the configuration is invalid; fix the YAML or the flags
    ├── ModelAssetError          weights missing or corrupt (sha256 mismatch); reinstall the package
    ├── CapacityError            a limit is reached (calls, engine queue, dashboard streams); retry later (retryable)
    ├── NotFoundError            no such agent, call or document (-> 404)
    ├── ConflictError            the change clashes with what exists: a duplicate name, a file-defined agent (-> 409)
    └── BadInputError            a caller sent something we cannot accept; the call may go on
        ├── BadMediaError        audio payload undecodable or of the wrong size
        ├── BadSignalingError    malformed JSON event or SDP
        └── BadQueryError        an HTTP query parameter is malformed or out of range (-> 400)

Messages say what went wrong and what to do, and never carry secrets or transcripts.
"""


class CadenceError(Exception):
    retryable = False


class ConfigError(CadenceError):
    pass


class ModelAssetError(CadenceError):
    pass


class CapacityError(CadenceError):
    retryable = True


class NotFoundError(CadenceError):
    pass


class ConflictError(CadenceError):
    pass


class BadInputError(CadenceError):
    pass


class BadMediaError(BadInputError):
    pass


class BadSignalingError(BadInputError):
    pass


class BadQueryError(BadInputError):
    pass
