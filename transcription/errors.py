"""Transcription's exceptions: the `TranscriptionError` branch of the one tree under
`CadenceError`, drawn whole in agent/errors.py.

`http_status` is the answer an API gives; `retryable` says whether the same request may
succeed later. Messages name the file and say what is wrong. This module imports only
models/errors.py.
"""

from __future__ import annotations

from models.errors import CadenceError


class TranscriptionError(CadenceError):
    http_status = 500
    retryable = False


class UnreadableAudio(TranscriptionError):
    """Not audio ffmpeg can read, no audio stream, or nothing decodes."""

    http_status = 422


class EmptyAudio(TranscriptionError):
    """The file holds no samples at all."""

    http_status = 422


class AudioTooLong(TranscriptionError):
    """Longer than the configured maximum duration."""

    http_status = 413


class TranscriberClosed(TranscriptionError):
    """The worker processes were shut down under a job."""

    http_status = 503
    retryable = True


class UploadTooLarge(TranscriptionError):
    """An upload over the configured size."""

    http_status = 413


class BadTranscriptionRequest(TranscriptionError):
    """A parameter out of range, an empty upload."""

    http_status = 400


class JobNotFound(TranscriptionError):
    """No such transcription job."""

    http_status = 404


class JobQueueFull(TranscriptionError):
    """Too many jobs waiting."""

    http_status = 503
    retryable = True
