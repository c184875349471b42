"""Sending an HTTP request so that cancelling the caller cannot leak a pooled connection.

httpcore 1.0.9 (httpx's transport; neither has had a release since) leaks a connection when
the task sending a request is cancelled after the pool gave the request a new connection and
before that connection was established (encode/httpcore#1093, open): the connection is then
neither idle, nor closed, nor any request's, so it keeps one of the pool's slots for good, and
its socket (CLOSE_WAIT once the server hangs up). Cadence cancels requests all the time (a
barge-in, a hang-up, a deadline), so a client lost a slot every few hundred cancellations
(`chaos sdp`: 12-15 sockets to llama-server left after 20,000 offers), and once
`max_connections` were gone every request would fail with PoolTimeout.

`send_detached` never lets a cancellation reach httpcore before the request's connection is
established: until httpcore starts writing the request on a connection (its `trace` events
say when), the caller's cancellation takes effect at once for the caller while the send goes
on in the background, until its headers come or its own timeouts end it, and the response is
then closed (closing its connection, which is how the server learns the request was
withdrawn). From then on the send is cancelled as any (httpcore closes an established
connection it is cancelled on), so a worker still learns at once that a caller hung up.
`detach` lets any such task the caller no longer waits for end by itself the same way.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

# Detached sends, referenced until they end (the loop keeps only weak references to tasks).
_detached: set[asyncio.Future[Any]] = set()


# httpcore's trace events, "<connection class>.<step>.started": writing the request has begun,
# so the connection is established (a pooled one, or a new one now connected).
_WRITING = ("http11.send_request_headers.started", "http2.send_request_headers.started")


async def send_detached(client: httpx.AsyncClient, request: httpx.Request, *, stream: bool) -> httpx.Response:
    """`client.send(request, stream=stream)`, never cancelled mid-connect (see above)."""
    established = False
    traced = request.extensions.get("trace")

    async def trace(event: str, info: dict[str, Any]) -> None:
        nonlocal established
        if event in _WRITING:
            established = True
        if traced is not None:
            await traced(event, info)

    request.extensions["trace"] = trace
    sending = asyncio.ensure_future(client.send(request, stream=stream))
    try:
        return await asyncio.shield(sending)
    except asyncio.CancelledError:
        if established:
            sending.cancel()
            await asyncio.wait({sending})  # httpcore closes the connection; a second cancellation still propagates
        detach(sending)  # left to end by itself, or ended: a response it got all the same is closed
        raise


async def cancel_send(task: asyncio.Future[Any]) -> None:
    """Cancels a task that makes requests through `send_detached` and waits for it; a
    response it returned before the cancellation took is closed."""
    task.cancel()
    await asyncio.wait({task})
    detach(task)


def detach(task: asyncio.Future[Any]) -> None:
    """Lets `task` (a send) run to its end unwatched, or forgets it if it has ended; a response
    it returns is closed."""
    if task in _detached:
        return
    _detached.add(task)
    task.add_done_callback(_closed_when_done)


def _closed_when_done(task: asyncio.Future[Any]) -> None:
    if task.cancelled() or task.exception() is not None:
        _detached.discard(task)
        return
    result = task.result()
    if not isinstance(result, httpx.Response):
        _detached.discard(task)
        return
    closing = asyncio.ensure_future(result.aclose())
    _detached.add(closing)
    closing.add_done_callback(_forget)
    _detached.discard(task)


def _forget(task: asyncio.Future[Any]) -> None:
    _detached.discard(task)
    if not task.cancelled():
        task.exception()  # a close that failed has nothing left to close: retrieved, not logged


def detached_in_flight() -> int:
    """Sends detached and not yet ended (for tests and health)."""
    return len(_detached)
