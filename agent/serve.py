"""Serving the app with uvicorn (the CLI and the tests' loopback servers both use this)."""

from __future__ import annotations

import logging
import signal
import socket
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI

from agent.access import keep_credentials_out_of_logs
from agent.calls import CallManager
from agent.client_fault_logs import demote_client_faults
from agent.config import CadenceConfig
from agent.http_deadline import http_protocol_class
from agent.query_logs import keep_query_text_out_of_logs

log = logging.getLogger(__name__)


class CadenceServer(uvicorn.Server):
    """uvicorn's server, stopping as a voice server must.

    SIGTERM (Kubernetes' stop, `docker stop`) drains: `calls.drain()` turns /readyz 503 and
    refuses new calls, and the server keeps serving the live ones until none is left or
    `grace_s` has passed; then it stops and exits 0. Calls still live then (or at a second
    signal, or Ctrl-C) are ended as `server_shutdown` before uvicorn closes their sockets, so
    the store says the server ended them, not the caller.

    uvicorn's shutdown waits for every open response to finish before the app's own
    shutdown runs, and a dashboard's event stream never finishes by itself: without a word
    first (`before_shutdown`), one open dashboard tab would hold the server up forever."""

    def __init__(self, config: uvicorn.Config, *, before_shutdown: Callable[[], None], calls: CallManager,
                 grace_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(config)
        self._before_shutdown = before_shutdown
        self._calls = calls
        self._grace_s = grace_s
        self._clock = clock
        self.drain_deadline: float | None = None  # set by the first SIGTERM

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and self.drain_deadline is None and not self.should_exit:
            # Not recorded in uvicorn's captured signals: it would raise SIGTERM again after a
            # clean stop, and the process would exit by the signal instead of with 0.
            self.drain_deadline = self._clock() + self._grace_s
            self._calls.drain()
            log.info("SIGTERM: draining %d calls (up to %.0f s), refusing new ones",
                     self._calls.active_count, self._grace_s)
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if self.drain_deadline is not None and not self.should_exit:
            if self._calls.active_count == 0:
                log.info("drained: no calls left; stopping")
                self.should_exit = True
            elif self._clock() >= self.drain_deadline:
                log.warning("drain grace over with %d calls live; ending them", self._calls.active_count)
                self.should_exit = True
        return await super().on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._before_shutdown()
        await self._calls.end_all("server_shutdown")
        await super().shutdown(sockets=sockets)


def cadence_server(app: FastAPI, config: CadenceConfig, **uvicorn_options: Any) -> CadenceServer:
    """A server for an app from `create_app`; `uvicorn_options` go to `uvicorn.Config`. Unless
    they name an `http` protocol, a connection that has not sent a whole request head within
    server.request_header_timeout_seconds is closed (agent/http_deadline.py)."""
    if "http" not in uvicorn_options:
        uvicorn_options["http"] = http_protocol_class(config.server.request_header_timeout_seconds,
                                                      on_expired=app.state.metrics.request_head_timeouts.inc)
    options = uvicorn.Config(app, ws_max_size=config.server.max_ws_message_bytes, **uvicorn_options)
    keep_credentials_out_of_logs()  # after uvicorn has set its loggers up: --log-level debug logs handshakes
    keep_query_text_out_of_logs()  # its INFO access lines carry query strings: a search's words
    demote_client_faults()  # a stranger's bad frame is a warning, not the server's error
    return CadenceServer(options, before_shutdown=app.state.events.close, calls=app.state.manager,
                         grace_s=config.server.shutdown_grace_seconds)
