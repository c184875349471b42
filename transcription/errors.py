"""Transcription's exceptions, in one place.

    TranscriptionError        base; `http_status` is the answer an API gives
    ├── UnreadableAudio       not audio ffmpeg can read, no audio stream, or nothing decodes (422)
    ├── EmptyAudio            the file holds no samples at all (422)
    ├── AudioTooLong          longer than the configured maximum duration (413)
    ├── UploadTooLarge        an upload over the configured size (413)
    ├── BadTranscriptionRequest  a parameter out of range, an empty upload (400)
    ├── JobNotFound           no such transcription job (404)
    ├── JobQueueFull          too many jobs waiting (503, retryable)
    └── TranscriberClosed     the worker processes were shut down under a job (503, retryable)

Messages name the file and say what is wrong; this module imports nothing.
"""

from __future__ import annotations


class TranscriptionError(Exception):
    http_status = 500
    retryable = False


class UnreadableAudio(TranscriptionError):
    http_status = 422


class EmptyAudio(TranscriptionError):
    http_status = 422


class AudioTooLong(TranscriptionError):
    http_status = 413


class TranscriberClosed(TranscriptionError):
    http_status = 503
    retryable = True


class UploadTooLarge(TranscriptionError):
    http_status = 413


class BadTranscriptionRequest(TranscriptionError):
    http_status = 400


class JobNotFound(TranscriptionError):
    http_status = 404


class JobQueueFull(TranscriptionError):
    http_status = 503
    retryable = True
