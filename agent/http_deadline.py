"""A deadline for each HTTP request head (request line and headers), which uvicorn lacks.

uvicorn's only timer on a connection is its keep-alive timeout: armed once a response has
been sent, cancelled by the next byte that arrives, and never armed before the first
request. So a client that opens a connection and sends nothing, or trickles its request
head a byte at a time (slowloris), holds a socket and a file descriptor for as long as it
likes, and a few thousand of them take the server's descriptors from real callers.

Here a deadline runs while a connection waits for a request head with no response in
flight: from the moment it opens, and again once each exchange is over (request read,
response sent). Bytes that arrive do not push it back, so a client sending one byte a second
is cut all the same; it stops when the head is complete, so a long upload, a long response
(a dashboard's event stream) or a WebSocket after its upgrade request is not limited.
uvicorn's keep-alive timer is left as it is: on a silent idle connection the shorter of the
two closes it; only this deadline catches a client that trickles after its first response.

uvicorn builds one protocol object per connection from `Config(http=...)`, a class it calls
with (config, server_state, app_state, _loop); `http_protocol_class` returns a subclass of
the implementation uvicorn would pick, with the deadline bound as a class attribute.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import h11
from uvicorn.config import HTTP_PROTOCOLS
from uvicorn.importer import import_from_string
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

Implementation = Literal["auto", "h11", "httptools"]


@dataclass(frozen=True)
class RequestHeadDeadline:
    # Seconds from a connection's opening, or from the end of its last exchange, until its
    # next request head must be complete (server.request_header_timeout_seconds).
    timeout_s: float
    # Called once for each connection closed by the deadline (a metric's `inc`); None: nothing.
    on_expired: Callable[[], None] | None = None


class _HeadDeadlineHooks:
    """What both implementations share: the timer. A subclass says when the connection is
    waiting for a request head (`_awaiting_request_head`) and calls `_sync_head_deadline`
    after every step that can change that."""

    head_deadline: ClassVar[RequestHeadDeadline]
    # Set by uvicorn's protocol classes, which these hooks are mixed into.
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    client: tuple[str, int] | None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # type: ignore[misc]
        self._head_timer: asyncio.TimerHandle | None = None
        self._sync_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_deadline()
        super().connection_lost(exc)  # type: ignore[misc]

    def _awaiting_request_head(self) -> bool:
        raise NotImplementedError

    def _sync_head_deadline(self) -> None:
        """Runs the deadline while the connection waits for a head, and only then. Starting
        it while it runs changes nothing, so arriving bytes never push it back."""
        if self.transport.is_closing() or not self._awaiting_request_head():
            self._cancel_head_deadline()
        elif self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_deadline.timeout_s, self._request_head_too_slow)

    def _cancel_head_deadline(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _request_head_too_slow(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        log.debug("closing %s: no complete request head within %.1f s", self.client, self.head_deadline.timeout_s)
        if self.head_deadline.on_expired is not None:
            self.head_deadline.on_expired()
        # Closed without a 408 (as nginx does at client_header_timeout): a connection idle
        # since it opened or since its last response may be a browser's preconnect or a
        # client sending its next request this very moment, which would read the 408 as the
        # answer to that request; and a trickler does not read what it is sent. Nothing of a
        # response is buffered here, so close() sends FIN at once.
        self.transport.close()


class _H11Hooks(_HeadDeadlineHooks):
    conn: h11.Connection

    def _awaiting_request_head(self) -> bool:
        # h11 leaves IDLE for the client only when it has parsed a whole request head, and
        # goes back to it when both sides have finished the exchange (start_next_cycle).
        return self.conn.their_state is h11.IDLE

    def handle_events(self) -> None:
        # Every parse goes through here: on bytes received, and after a response for
        # requests that were pipelined behind it.
        super().handle_events()  # type: ignore[misc]
        self._sync_head_deadline()


class _HttpToolsHooks(_HeadDeadlineHooks):
    """httptools parses ahead of the response (pipelining), so "between requests" is kept
    from its callbacks, and the exchange is over when the latest request's response is."""

    cycle: Any
    parser: Any

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._between_requests = True
        super().connection_made(transport)

    def _awaiting_request_head(self) -> bool:
        return self._between_requests and (self.cycle is None or self.cycle.response_complete)

    def on_headers_complete(self) -> None:
        self._between_requests = False
        super().on_headers_complete()  # type: ignore[misc]

    def on_message_complete(self) -> None:
        super().on_message_complete()  # type: ignore[misc]
        # An upgrade's request ends its HTTP life: the WebSocket protocol takes the socket.
        if not (self.parser.should_upgrade() and self._should_upgrade()):  # type: ignore[attr-defined]
            self._between_requests = True

    def data_received(self, data: bytes) -> None:
        super().data_received(data)  # type: ignore[misc]
        self._sync_head_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._sync_head_deadline()


def http_protocol_class(timeout_s: float, *, on_expired: Callable[[], None] | None = None,
                        implementation: Implementation = "auto") -> type[asyncio.Protocol]:
    """The protocol class for `uvicorn.Config(http=...)`: uvicorn's own (`auto`: httptools
    when installed, else h11, as uvicorn chooses), closing connections whose request head is
    not complete within `timeout_s`. A class per call: two servers in one process keep
    their own deadline and metric."""
    base: type[asyncio.Protocol] = import_from_string(HTTP_PROTOCOLS[implementation])
    if issubclass(base, H11Protocol):
        hooks: type[_HeadDeadlineHooks] = _H11Hooks
    else:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        if not issubclass(base, HttpToolsProtocol):
            raise ValueError(f"no request head deadline for uvicorn's {base.__name__}")
        hooks = _HttpToolsHooks
    return type(f"{base.__name__}WithHeadDeadline", (hooks, base),
                {"head_deadline": RequestHeadDeadline(timeout_s, on_expired)})
