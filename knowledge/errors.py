"""Knowledge's exceptions: the `KnowledgeError` branch of the one tree under `CadenceError`,
drawn whole in agent/errors.py.

`http_status` is the answer an API gives; `retryable` says whether the same request may
succeed later. Messages name the file (or agent) and say what to do; they never quote
document text. This module imports only models/errors.py, so every layer may raise these.
"""

from __future__ import annotations

from models.errors import CadenceError


class KnowledgeError(CadenceError):
    http_status = 500
    retryable = False


class BadUpload(KnowledgeError):
    """The request is not a multipart form with files."""

    http_status = 400


class BadQuery(KnowledgeError):
    """A search parameter is missing or out of range."""

    http_status = 400


class UnsupportedDocumentType(KnowledgeError):
    """Not .txt, .md, .html/.htm or .pdf."""

    http_status = 415


class DocumentTooLarge(KnowledgeError):
    """One file is over max_file_bytes."""

    http_status = 413


class TooManyFiles(KnowledgeError):
    """More files in one request than max_files_per_request."""

    http_status = 413


class EmptyDocument(KnowledgeError):
    """Nothing but whitespace."""

    http_status = 422


class UnreadableDocument(KnowledgeError):
    """Not what its type says: not UTF-8, not a PDF, no text in it."""

    http_status = 422


class KnowledgeFull(KnowledgeError):
    """The agent's document or chunk cap is reached."""

    http_status = 409


class DocumentNotFound(KnowledgeError):
    """No such document or job for this agent."""

    http_status = 404


class UnknownAgent(KnowledgeError):
    """No such agent."""

    http_status = 404


class IngestQueueFull(KnowledgeError):
    """Background ingestion is saturated."""

    http_status = 503
    retryable = True


class EmbedderUnavailable(KnowledgeError):
    """The embedder is still loading or failed."""

    http_status = 503
    retryable = True


class IngestCancelled(KnowledgeError):
    """The server is stopping; nothing of the upload was stored."""

    http_status = 503
    retryable = True


class KnowledgeBusy(KnowledgeError):
    """The database stayed locked by another writer."""

    http_status = 503
    retryable = True


class KnowledgeSchemaError(KnowledgeError):
    """The database's knowledge tables do not fit this Cadence."""

    http_status = 500
