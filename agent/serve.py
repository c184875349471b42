"""Serving the app with uvicorn (the CLI and the tests' loopback servers both use this)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import uvicorn
from fastapi import FastAPI

from agent.config import CadenceConfig


class CadenceServer(uvicorn.Server):
    """uvicorn's shutdown waits for every open response to finish before the app's own
    shutdown runs, and a dashboard's event stream never finishes by itself: without a word
    first, one open dashboard tab would hold the server up forever."""

    def __init__(self, config: uvicorn.Config, *, before_shutdown: Callable[[], None]) -> None:
        super().__init__(config)
        self._before_shutdown = before_shutdown

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._before_shutdown()
        await super().shutdown(sockets=sockets)


def cadence_server(app: FastAPI, config: CadenceConfig, **uvicorn_options: Any) -> CadenceServer:
    """A server for an app from `create_app`; `uvicorn_options` go to `uvicorn.Config`."""
    options = uvicorn.Config(app, ws_max_size=config.server.max_ws_message_bytes, **uvicorn_options)
    return CadenceServer(options, before_shutdown=app.state.events.close)
