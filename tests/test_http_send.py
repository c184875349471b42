"""Cancelled requests leak no pooled connection (models/http_send.py), against a real server on
loopback that answers one request per connection and hangs up, as llama-server does."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from models.http_send import detached_in_flight, send_detached
from tests.test_worker_server import until


class OneShotServer:
    """Answers each connection's one request with 200 "ok" and closes it."""

    def __init__(self) -> None:
        self.open_connections = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc) -> None:
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open_connections += 1
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client hung up first
        finally:
            self.open_connections -= 1
            writer.close()


async def _cancel_sends_at_every_step(client: httpx.AsyncClient, send) -> None:
    """Sends cancelled after 0, 1, ... 29 steps of the loop, twenty times over: some land between
    the pool's choice of a new connection and its connect, httpcore 1.0.9's leak."""
    for _ in range(20):
        for steps in range(30):
            sending = asyncio.ensure_future(send(client, client.build_request("GET", "/"), stream=False))
            for _ in range(steps):
                await asyncio.sleep(0)  # one step of the loop, not a timed wait
            sending.cancel()
            try:
                await (await sending).aclose()  # it was answered before the cancellation came
            except asyncio.CancelledError:
                pass


async def _cancel_reads_at_every_step(client: httpx.AsyncClient, send) -> None:
    """Streamed responses read to their end and closed by a task cancelled after 0, 1, ... 9
    steps of the loop, twenty times over: some land inside the close httpx makes as the body
    ends, or in the caller's own close."""
    for _ in range(20):
        for steps in range(10):
            response = await send(client, client.build_request("GET", "/"), stream=True)

            async def read_and_close() -> None:
                try:
                    async for _ in response.aiter_bytes():
                        pass
                finally:
                    await response.aclose()

            reading = asyncio.ensure_future(read_and_close())
            for _ in range(steps):
                await asyncio.sleep(0)
            reading.cancel()
            await asyncio.wait({reading})
            if not response.is_closed:  # cancelled before it began: never reached httpcore
                await response.aclose()


async def _plain_send(client: httpx.AsyncClient, request: httpx.Request, *, stream: bool = False) -> httpx.Response:
    return await client.send(request, stream=stream)


def _client(url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, limits=httpx.Limits(max_connections=2),
                             timeout=httpx.Timeout(5.0, pool=0.5))


@pytest.mark.parametrize("cancel_at_every_step", [_cancel_sends_at_every_step, _cancel_reads_at_every_step],
                         ids=["sends", "reads"])
async def test_cancelled_detached_sends_and_reads_leave_the_pool_free_and_no_connection_open(cancel_at_every_step):
    server = OneShotServer()
    async with server as url, _client(url) as client:
        await cancel_at_every_step(client, send_detached)
        await until(lambda: detached_in_flight() == 0 and server.open_connections == 0)
        assert (await send_detached(client, client.build_request("GET", "/"), stream=False)).text == "ok"


async def test_the_leak_the_detached_send_avoids_is_real_in_this_httpcore():
    """If this starts failing, httpcore no longer leaks: send_detached's shield can go."""
    server = OneShotServer()
    async with server as url, _client(url) as client:
        await _cancel_sends_at_every_step(client, _plain_send)
        with pytest.raises(httpx.PoolTimeout):  # every slot held by a connection no request owns
            await _plain_send(client, client.build_request("GET", "/"))


async def test_the_leak_in_closing_a_response_is_real_in_this_httpcore():
    """If this starts failing, httpcore's close holds off asyncio's cancellation: send_detached's
    responses need not close in the background."""
    server = OneShotServer()
    async with server as url, _client(url) as client:
        with pytest.raises(httpx.PoolTimeout):  # both slots lost, often before the loop's end
            await _cancel_reads_at_every_step(client, _plain_send)
            await _plain_send(client, client.build_request("GET", "/"))
