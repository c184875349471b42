"""Knowledge's exceptions, in one place.

    KnowledgeError                 base; `http_status` is the answer an API gives, `retryable`
    │                              says whether the same request may succeed later
    ├── BadUpload                  the request is not a multipart form with files (400)
    ├── BadQuery                   a search parameter is missing or out of range (400)
    ├── UnsupportedDocumentType    not .txt, .md, .html/.htm or .pdf (415)
    ├── DocumentTooLarge           one file is over max_file_bytes (413)
    ├── TooManyFiles               more files in one request than max_files_per_request (413)
    ├── EmptyDocument              nothing but whitespace (422)
    ├── UnreadableDocument         not what its type says: not UTF-8, not a PDF, no text in it (422)
    ├── KnowledgeFull              the agent's document or chunk cap is reached (409)
    ├── DocumentNotFound           no such document or job for this agent (404)
    ├── UnknownAgent               no such agent (404)
    ├── IngestQueueFull            background ingestion is saturated (503, retryable)
    ├── EmbedderUnavailable        the embedder is still loading or failed (503, retryable)
    ├── IngestCancelled            the server is stopping; nothing of the upload was stored (503, retryable)
    ├── KnowledgeBusy              the database stayed locked by another writer (503, retryable)
    └── KnowledgeSchemaError       the database's knowledge tables do not fit this Cadence (500)

Messages name the file (or agent) and say what to do; they never quote document text.
This module imports nothing, so every layer may raise these.
"""

from __future__ import annotations


class KnowledgeError(Exception):
    http_status = 500
    retryable = False


class BadUpload(KnowledgeError):
    http_status = 400


class BadQuery(KnowledgeError):
    http_status = 400


class UnsupportedDocumentType(KnowledgeError):
    http_status = 415


class DocumentTooLarge(KnowledgeError):
    http_status = 413


class TooManyFiles(KnowledgeError):
    http_status = 413


class EmptyDocument(KnowledgeError):
    http_status = 422


class UnreadableDocument(KnowledgeError):
    http_status = 422


class KnowledgeFull(KnowledgeError):
    http_status = 409


class DocumentNotFound(KnowledgeError):
    http_status = 404


class UnknownAgent(KnowledgeError):
    http_status = 404


class IngestQueueFull(KnowledgeError):
    http_status = 503
    retryable = True


class EmbedderUnavailable(KnowledgeError):
    http_status = 503
    retryable = True


class IngestCancelled(KnowledgeError):
    http_status = 503
    retryable = True


class KnowledgeBusy(KnowledgeError):
    http_status = 503
    retryable = True


class KnowledgeSchemaError(KnowledgeError):
    http_status = 500
