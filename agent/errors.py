"""Cadence's exceptions: one tree under `CadenceError`, drawn whole here.

    CadenceError                 base; `retryable` says whether the same request may succeed later
    ├── ConfigError              the configuration is invalid; fix the YAML or the flags (-> 422 over HTTP)
    ├── ModelAssetError          weights missing or corrupt (sha256 mismatch); reinstall the package
    ├── CapacityError            a limit is reached (calls, engine queue, dashboard streams); retry later (retryable)
    │   └── SessionLimitError    an operator key has all its concurrent sessions open (-> 429) (retryable)
    ├── WorkerUnavailableError   a model worker cannot be reached or went away mid-request (retryable)
    ├── StalledError             a model's answer stopped coming within its deadline (retryable)
    ├── LLMServerError           the LLM server answered, but not with a reply stream (models/openai_chat.py)
    ├── TokenSourceError         the Orpheus token server failed or sent no completion stream
    │                            (models/orpheus/token_source.py)
    ├── NotFoundError            no such agent, call or document (-> 404)
    ├── ConflictError            the change clashes with what exists: a duplicate name, a file-defined agent (-> 409)
    ├── UnauthorizedError        no credential, a malformed one, or one we do not accept; `reason` says which (-> 401)
    ├── ForbiddenError           the caller is known but this is not allowed: a browser Origin not listed (-> 403)
    ├── BadInputError            a caller sent something we cannot accept; the call may go on (-> 400)
    │   ├── BadMediaError        audio payload undecodable or of the wrong size
    │   ├── BadSignalingError    malformed JSON event or SDP
    │   ├── BadQueryError        an HTTP query parameter is malformed or out of range
    │   ├── BodyTooLarge         a request body over its limit (-> 413; agent/http_util.py)
    │   └── RealtimeProtocolError  a Realtime client event we cannot accept; carries OpenAI's error
    │                              code and the field at fault (agent/transports/realtime_protocol.py)
    ├── KnowledgeError           agents' knowledge (knowledge/errors.py); each carries its `http_status`
    │   ├── BadUpload                  the request is not a multipart form with files (400)
    │   ├── BadQuery                   a search parameter is missing or out of range (400)
    │   ├── UnsupportedDocumentType    not .txt, .md, .html/.htm or .pdf (415)
    │   ├── DocumentTooLarge           one file is over max_file_bytes (413)
    │   ├── TooManyFiles               more files in one request than max_files_per_request (413)
    │   ├── EmptyDocument              nothing but whitespace (422)
    │   ├── UnreadableDocument         not what its type says: not UTF-8, not a PDF, no text in it (422)
    │   ├── KnowledgeFull              the agent's document or chunk cap is reached (409)
    │   ├── DocumentNotFound           no such document or job for this agent (404)
    │   ├── UnknownAgent               no such agent (404)
    │   ├── IngestQueueFull            background ingestion is saturated (503, retryable)
    │   ├── EmbedderUnavailable        the embedder is still loading or failed (503, retryable)
    │   ├── IngestCancelled            the server is stopping; nothing of the upload was stored (503, retryable)
    │   ├── KnowledgeBusy              the database stayed locked by another writer (503, retryable)
    │   └── KnowledgeSchemaError       the database's knowledge tables do not fit this Cadence (500)
    └── TranscriptionError       long recordings (transcription/errors.py); each carries its `http_status`
        ├── UnreadableAudio            not audio ffmpeg can read, no audio stream, or nothing decodes (422)
        ├── EmptyAudio                 the file holds no samples at all (422)
        ├── AudioTooLong               longer than the configured maximum duration (413)
        ├── UploadTooLarge             an upload over the configured size (413)
        ├── BadTranscriptionRequest    a parameter out of range, an empty upload (400)
        ├── JobNotFound                no such transcription job (404)
        ├── JobQueueFull               too many jobs waiting (503, retryable)
        └── TranscriberClosed          the worker processes were shut down under a job (503, retryable)

Where each lives: the first six in `models/errors.py`, so that model code and workers need
nothing from the layers above (they are re-exported here); the knowledge and transcription
branches beside their packages, which import only `models/errors.py`; those that name a
module beside the engine or protocol that raises them; the rest here, raised by the agent
server alone. `agent/http_util.error_for` maps the tree to HTTP statuses.
Messages say what went wrong and what to do, and never carry secrets or transcripts.
"""

from models.errors import (CadenceError, CapacityError, ConfigError, ModelAssetError, StalledError,
                           WorkerUnavailableError)

__all__ = [
    "CadenceError", "ConfigError", "ModelAssetError", "CapacityError", "WorkerUnavailableError", "StalledError",
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
