"""A free port on this machine, for a server started here (a worker, llama-server, a bench child)."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel says is free on `host` now (a later bind may still race another process)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
