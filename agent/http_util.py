"""Small HTTP helpers the routers share: bounded bodies, JSON bodies, and one error shape."""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from agent.errors import (BadInputError, CadenceError, ConfigError, ConflictError, ForbiddenError, NotFoundError,
                          SessionLimitError, UnauthorizedError)
from knowledge.errors import KnowledgeError
from transcription.errors import TranscriptionError


async def bounded_body(request: Request, limit: int) -> bytes | None:
    """Reads at most `limit` bytes; None if the body is larger (no matter what it claims)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


def error_response(status: int, message: str, *, retryable: bool = False) -> JSONResponse:
    return JSONResponse({"error": message, "retryable": retryable}, status_code=status)


class BodyTooLarge(BadInputError):
    pass


async def json_body(request: Request, limit: int) -> Any:
    """The request's JSON; BodyTooLarge (413) or BadInputError (400) says what is wrong."""
    body = await bounded_body(request, limit)
    if body is None:
        raise BodyTooLarge(f"request body is larger than {limit} bytes")
    return parse_json(body)


def parse_json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise BadInputError(f"request body is not valid JSON: {exc}") from None


def error_for(exc: CadenceError) -> JSONResponse:
    """One mapping from our exceptions to HTTP statuses."""
    if isinstance(exc, UnauthorizedError):
        # RFC 6750: a 401 names the scheme the client should use.
        return JSONResponse({"error": str(exc), "retryable": False, "reason": exc.reason}, status_code=401,
                            headers={"WWW-Authenticate": "Bearer"})
    if isinstance(exc, (KnowledgeError, TranscriptionError)):
        status = exc.http_status  # those branches carry their own
    elif isinstance(exc, BodyTooLarge):
        status = 413
    elif isinstance(exc, ForbiddenError):
        status = 403
    elif isinstance(exc, SessionLimitError):
        status = 429
    elif isinstance(exc, NotFoundError):
        status = 404
    elif isinstance(exc, ConflictError):
        status = 409
    elif isinstance(exc, ConfigError):
        status = 422  # well-formed, but a field is wrong: the message names it
    elif isinstance(exc, BadInputError):
        status = 400
    elif exc.retryable:
        status = 503
    else:
        status = 500
    return error_response(status, str(exc), retryable=exc.retryable)
