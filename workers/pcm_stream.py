"""Streaming an engine's PCM chunks to an HTTP client, and closing the engine's iterator when it leaves.

Starlette's StreamingResponse notices a disconnect only at its next send, and never closes
the iterator it was given: a hung-up call would leave synthesis running until the engine's
own end. PcmStream sends and listens at once; whichever ends first, the engine's iterator is
closed (`aclose`) before the response returns, and `on_close` learns the outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client went away": logged, never sent
STREAM_FAILED = 500  # the engine raised after the first chunk: the connection is cut, not completed


async def wait_for_disconnect(receive: Callable[[], Awaitable[dict[str, Any]]]) -> None:
    """Returns when the client has gone. Call only after the request body has been read."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def close_quietly(chunks: AsyncIterator[Any]) -> None:
    close = getattr(chunks, "aclose", None)
    if close is not None:
        with contextlib.suppress(Exception):
            await close()


class PcmStream(StreamingResponse):
    media_type = "application/octet-stream"

    def __init__(self, first: bytes | None, chunks: AsyncIterator[bytes], *, sample_rate: int) -> None:
        super().__init__(chunks, headers={"X-Sample-Rate": str(sample_rate)})
        self._first = first  # pulled before the response started, so an engine error could still be a 500
        self.on_close: Callable[[int], None] = lambda status: None  # told 200, 499 or 500 once the stream ends

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sender = asyncio.create_task(self._send_all(send))
        listener = asyncio.create_task(wait_for_disconnect(receive))
        status = CLIENT_CLOSED_REQUEST
        try:
            done, _ = await asyncio.wait({sender, listener}, return_when=asyncio.FIRST_COMPLETED)
            if sender in done:
                status = 200 if sender.exception() is None else STREAM_FAILED
                sender.result()  # an engine error mid-stream: re-raised, so the server cuts the connection
        finally:
            listener.cancel()
            sender.cancel()
            await asyncio.gather(sender, listener, return_exceptions=True)
            await close_quietly(self.body_iterator)  # type: ignore[arg-type]
            self.on_close(status)

    async def _send_all(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        if self._first:
            await send({"type": "http.response.body", "body": bytes(self._first), "more_body": True})
        async for chunk in self.body_iterator:
            if chunk:
                await send({"type": "http.response.body", "body": bytes(chunk), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
