"""Sending an HTTP request so that cancelling the caller cannot leak a pooled connection.

httpcore 1.0.9 (httpx's transport; neither has had a release since) leaks a connection when
the task sending a request is cancelled after the pool gave the request a new connection and
before that connection was established (encode/httpcore#1093, open): the connection is then
neither idle, nor closed, nor any request's, so it keeps one of the pool's slots for good, and
its socket (CLOSE_WAIT once the server hangs up). Cadence cancels requests all the time (a
barge-in, a hang-up, a deadline), so a client could lose a slot every few hundred
cancellations (tests/test_http_send.py fills a pool so), and once `max_connections` were gone
every request would fail with PoolTimeout. (Found while looking for the sockets to
llama-server that `chaos sdp` left in CLOSE_WAIT.)

`send_detached` never lets a cancellation reach httpcore: the caller's cancellation takes
effect at once for the caller, the send goes on in the background until its headers come or
its own timeouts end it, and its response is then closed. A request that had a connection made
for it has that connection closed at once instead (its network stream, from httpcore's `trace`
events), so the server learns straight away that the request was withdrawn (a worker frees its
slot when a caller hangs up); one on a reused pooled connection is withdrawn when its answer
begins. `cancel_send` cancels a task that sends so, and `detach` lets one end by itself.

Reading and closing a streamed response leak the same way: httpcore shields its close with
anyio's cancel scope, which holds off anyio's cancellations but not asyncio's `task.cancel()`.
A cancellation that lands inside the close (a barge-in just as a reply ends: httpx closes the
response as its body ends, in the reader's task; or a second cancellation while httpcore
closes after the first) leaves the request in the pool and its connection ACTIVE for good
(found by counting closes in a loop of cancelled llama-server replies: about one in 300 ended
so; they were the CLOSE_WAIT sockets). So the body of a response `send_detached` returns is
read and closed in tasks of their own: a reader cancelled mid-read withdraws the request (the
connection's socket is closed at once, the pending read fails, httpcore reaps the connection
in a task nobody cancels), and a close cancelled midway goes on to its end in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx

# Detached sends, and the closes and withdrawals left to run in the background, referenced
# until they end (the loop keeps only weak references to tasks).
_detached: set[asyncio.Future[Any]] = set()


async def send_detached(client: httpx.AsyncClient, request: httpx.Request, *, stream: bool) -> httpx.Response:
    """`client.send(request, stream=stream)`, never cancelled inside httpcore (see above)."""
    opened: list[Any] = []  # the network stream of a connection made for this request
    traced = request.extensions.get("trace")

    async def trace(event: str, info: dict[str, Any]) -> None:
        if event == "connection.connect_tcp.complete" and info.get("return_value") is not None:
            opened.append(info["return_value"])
        if traced is not None:
            await traced(event, info)

    request.extensions["trace"] = trace
    sending = asyncio.ensure_future(_send(client, request, stream))
    try:
        return await asyncio.shield(sending)
    except asyncio.CancelledError:
        detach(sending)  # it ends by itself; a response it gets all the same is closed
        if opened and not sending.done():
            # Withdrawn at the server now, not once it answers: the send then fails on its
            # closed connection, which httpcore reaps as any failed one.
            with contextlib.suppress(Exception):
                await opened[0].aclose()
        raise


async def _send(client: httpx.AsyncClient, request: httpx.Request, stream: bool) -> httpx.Response:
    response = await client.send(request, stream=stream)
    if stream:
        response.stream = _ShieldedBody(response.stream, response.extensions.get("network_stream"))
    return response


class _ShieldedBody(httpx.AsyncByteStream):
    """A streamed response's body, read and closed in tasks of its own so that no cancellation
    of its reader reaches httpcore. A reader cancelled mid-read withdraws the request: the
    connection's socket is closed, so the pending read fails at once (the server learns of it)
    and httpcore closes the connection as any failed one, in a task nobody cancels."""

    def __init__(self, stream: httpx.AsyncByteStream, network_stream: Any) -> None:
        self._stream = stream
        self._network_stream = network_stream  # httpcore's, for HTTP/1.1; None: the read ends by its timeout

    async def __aiter__(self) -> AsyncIterator[bytes]:
        parts = self._stream.__aiter__()
        while True:
            reading = asyncio.ensure_future(_next_part(parts))
            try:
                part = await asyncio.shield(reading)
            except asyncio.CancelledError:
                _in_background(self._withdraw(reading, parts))
                raise
            if part is None:
                return
            yield part

    async def _withdraw(self, reading: asyncio.Future[bytes | None], parts: AsyncIterator[bytes]) -> None:
        if not reading.done() and self._network_stream is not None:
            with contextlib.suppress(Exception):
                await self._network_stream.aclose()
        await asyncio.wait({reading})
        if not reading.cancelled():
            reading.exception()  # a read failed by the withdrawal: expected, retrieved
        with contextlib.suppress(Exception):
            await parts.aclose()  # type: ignore[attr-defined]  # an async generator, left at a part read
        await self._stream.aclose()

    async def aclose(self) -> None:
        closing = asyncio.ensure_future(self._stream.aclose())
        try:
            await asyncio.shield(closing)
        except asyncio.CancelledError:
            _in_background(closing)
            raise


async def _next_part(parts: AsyncIterator[bytes]) -> bytes | None:
    """The body's next part, None at its end."""
    try:
        return await parts.__anext__()
    except StopAsyncIteration:
        return None


def _in_background(work: Any) -> None:
    """Runs `work` (a coroutine or task) to its end unwatched; what it raises is retrieved, not logged."""
    task = asyncio.ensure_future(work)
    _detached.add(task)
    task.add_done_callback(_forget)


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
    _in_background(result.aclose())
    _detached.discard(task)


def _forget(task: asyncio.Future[Any]) -> None:
    _detached.discard(task)
    if not task.cancelled():
        task.exception()  # a close that failed has nothing left to close: retrieved, not logged


def detached_in_flight() -> int:
    """Detached sends, background closes and withdrawals not yet ended (for tests and health)."""
    return len(_detached)
