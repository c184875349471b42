"""A client's fault is not the server's error.

uvicorn's WebSocket protocol (websockets-sansio) closes a connection that sends a text frame of
invalid UTF-8 with 1007, as RFC 6455 says, and then logs "Invalid UTF-8 sequence received from
client." at ERROR, with a traceback. Any stranger can send such a frame, as often as they like:
each one would page whoever watches the server's errors and fill its log with tracebacks. Here
they become one-line warnings; the close itself is unchanged.
"""

from __future__ import annotations

import logging

CLIENT_FAULT_MESSAGES = frozenset({"Invalid UTF-8 sequence received from client."})
UVICORN_LOGGER = "uvicorn.error"


class ClientFaultsAreWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and record.getMessage() in CLIENT_FAULT_MESSAGES:
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.exc_info, record.exc_text = None, None
        return True


def demote_client_faults() -> None:
    """Idempotent; call after uvicorn.Config, which configures uvicorn's loggers."""
    logger = logging.getLogger(UVICORN_LOGGER)
    if not any(isinstance(f, ClientFaultsAreWarnings) for f in logger.filters):
        logger.addFilter(ClientFaultsAreWarnings())
