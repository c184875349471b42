"""What a call's WebSocket says when it closes: a code and a reason the client can act on.

Pipecat's WebSocket transport closes the socket with a bare 1000 whenever the pipeline ends, so
a call the server ended itself (nobody spoke, the duration limit, a shutdown) reads to the
client exactly like one that simply finished. `ExplainedClose` stands in for the socket inside
the transport and puts the call's end reason into that close.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fastapi import WebSocket, WebSocketDisconnect

from agent.calls import ActiveCall

log = logging.getLogger(__name__)

MAX_REASON_BYTES = 123  # RFC 6455: a close frame's payload is 125 bytes, 2 of them the code
CLOSE_NORMAL, CLOSE_GOING_AWAY = 1000, 1001


def close_reason(text: str) -> str:
    """`text` cut to what a close frame holds, counted in UTF-8 bytes and never mid-character:
    a longer reason makes the close itself fail, and the client sees the connection drop (1006)."""
    return text.encode("utf-8")[:MAX_REASON_BYTES].decode("utf-8", "ignore")


def close_for(end_reason: str, *, idle_timeout_s: float, max_call_s: float) -> tuple[int, str] | None:
    """The close for a call the server ended, by its stored end reason; None where the bare
    close is the truth (the caller hung up) or the transport already said why (bad input)."""
    if end_reason == "idle_timeout":
        return CLOSE_NORMAL, f"idle timeout: nobody spoke for {idle_timeout_s:g} s"
    if end_reason == "max_duration":
        return CLOSE_NORMAL, f"the call reached its limit of {max_call_s:g} s"
    if end_reason == "server_shutdown":
        return CLOSE_GOING_AWAY, "the server is shutting down; call again"
    return None


class ExplainedClose:
    """The call's socket as the transport sees it: a close without a reason gets the call's.
    `explain()` is asked at close time, when the call's end reason has been decided."""

    def __init__(self, websocket: WebSocket, explain: Callable[[], tuple[int, str] | None]) -> None:
        self._websocket = websocket
        self._explain = explain

    def __getattr__(self, name: str):
        return getattr(self._websocket, name)

    async def close(self, code: int = CLOSE_NORMAL, reason: str | None = None) -> None:
        if code == CLOSE_NORMAL and not reason:
            code, reason = self._explain() or (code, reason)
        try:
            await self._websocket.close(code=code, reason=close_reason(reason or ""))
        except WebSocketDisconnect:
            # The caller's side closed as ours did (a hang-up the instant the call ended; uvicorn's
            # ClientDisconnected, as Starlette raises it): the close has nobody left to reach.
            # Pipecat would log it as an ERROR with an empty message, paging an operator for an
            # ordinary hang-up.
            log.debug("close %d: the peer had already gone", code)


def for_call(websocket: WebSocket, call: ActiveCall, *, max_call_s: float) -> ExplainedClose:
    return ExplainedClose(websocket, lambda: close_for(call.end_reason, idle_timeout_s=call.agent.idle_timeout_seconds,
                                                       max_call_s=max_call_s))
