"""Cancelled requests leak no pooled connection (models/http_send.py), against a real server on
loopback that answers one request per connection and hangs up, as llama-server does."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from models.http_send import detached_in_flight, send_detached
from tests.fakes import LoopbackServer
from tests.test_worker_server import until


class OneShotServer(LoopbackServer):
    """Answers each connection's one request with 200 "ok" and closes it; with `body_after_s`,
    the headers at once and the body that much later (a reply being generated)."""

    def __init__(self, *, body_after_s: float = 0.0) -> None:
        self.open_connections = 0
        self.withdrawn = 0  # requests whose client hung up before the body came
        self._body_after_s = body_after_s

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open_connections += 1
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n")
            if self._body_after_s:
                await writer.drain()
                await asyncio.sleep(self._body_after_s)
                if reader.at_eof():
                    self.withdrawn += 1
                    return
            writer.write(b"ok")
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

            reading = asyncio.ensure_future(_read_and_close(response))
            for _ in range(steps):
                await asyncio.sleep(0)
            reading.cancel()
            await asyncio.wait({reading})
            if not response.is_closed:  # cancelled before it began: never reached httpcore
                await response.aclose()


async def _read_and_close(response: httpx.Response) -> None:
    try:
        async for _ in response.aiter_bytes():
            pass
    finally:
        await response.aclose()


async def _cancel_reads_twice(client: httpx.AsyncClient, send) -> None:
    """Reads of a body that is slow to come cancelled, then cancelled again 0, 1, ... 4 steps of
    the loop later, twenty times over (a deadline and a barge-in at once, or a canceller that
    times out and cancels again): the second lands in the close httpcore makes for the first."""
    for _ in range(20):
        for gap in range(5):
            response = await send(client, client.build_request("GET", "/"), stream=True)
            reading = asyncio.ensure_future(_read_and_close(response))
            await asyncio.sleep(0)  # it reads, and waits for the body
            reading.cancel()
            for _ in range(gap):
                await asyncio.sleep(0)
            reading.cancel()
            await asyncio.wait({reading})


async def _plain_send(client: httpx.AsyncClient, request: httpx.Request, *, stream: bool = False) -> httpx.Response:
    return await client.send(request, stream=stream)


def _client(url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, limits=httpx.Limits(max_connections=2),
                             timeout=httpx.Timeout(5.0, pool=0.5))


@pytest.mark.slow
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


async def test_reads_cancelled_twice_leave_the_pool_free_and_no_connection_open():
    server = OneShotServer(body_after_s=0.2)
    async with server as url, _client(url) as client:
        await _cancel_reads_twice(client, send_detached)
        await until(lambda: detached_in_flight() == 0 and server.open_connections == 0)
        assert server.withdrawn == 100  # each hung up at once, not once its body came
        assert (await send_detached(client, client.build_request("GET", "/"), stream=False)).text == "ok"


async def test_the_leak_in_reads_cancelled_twice_is_real_in_this_httpcore():
    """If this starts failing, httpcore's close of a failed read holds off asyncio's cancellation:
    send_detached's bodies need not be read in tasks of their own."""
    server = OneShotServer(body_after_s=0.2)
    async with server as url, _client(url) as client:
        with pytest.raises(httpx.PoolTimeout):
            await _cancel_reads_twice(client, _plain_send)
            await _plain_send(client, client.build_request("GET", "/"))


@pytest.mark.slow
async def test_a_read_cancelled_withdraws_the_request_at_once_even_with_the_response_left_open():
    server = OneShotServer(body_after_s=0.5)
    async with server as url, _client(url) as client:
        response = await send_detached(client, client.build_request("GET", "/"), stream=True)

        async def read_only() -> None:  # a careless caller: never closes the response
            async for _ in response.aiter_bytes():
                pass

        reading = asyncio.ensure_future(read_only())
        await asyncio.sleep(0)
        reading.cancel()
        await asyncio.wait({reading})
        await until(lambda: server.open_connections == 0 and detached_in_flight() == 0)
        assert server.withdrawn == 1  # the server learnt of it before its body was due
        assert (await send_detached(client, client.build_request("GET", "/"), stream=False)).text == "ok"
