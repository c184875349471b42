"""Slow clients (slowloris) against the real server on loopback, under both of uvicorn's HTTP
implementations (httptools, which it picks when installed, and h11, its fallback).

Connections that send nothing, or trickle a request head a byte at a time, are closed at
server.request_header_timeout_seconds while real requests are served at once; a connection
whose head is complete (a slow upload after it, a WebSocket, an event stream) is not cut;
a keep-alive connection that is idle or trickles after its response is closed too.
Engines are fakes built on the real interfaces."""

from __future__ import annotations

import asyncio
import contextlib
import re
from dataclasses import replace
from urllib.parse import urlsplit

import httpx
import pytest
import websockets
from uvicorn.config import HTTP_PROTOCOLS

from agent.config import StoreConfig
from latency_bench.chaos import slow_clients
from pipelines.voice import Engines
from tests.conftest import running_server
from tests.fakes import HashingEmbedder, ScriptedASR, ScriptedLLM, ToneTTS

DEADLINE_S = 0.5
# How late past the deadline a close may come on a loaded 2-core machine.
SLACK_S = 1.5
# The server starts its timer when it accepts; the client's clock starts when its own
# connect returns, which for the last of 100 concurrent connects can be ~0.15 s later. A close
# this much before the deadline (client-side) would mean the deadline is not honoured.
EARLY_S = 0.25
SLOW_CLIENTS = 50  # of each kind
BYTE_INTERVAL_S = 0.1


@pytest.fixture(scope="module", params=["httptools", "h11"])
def server(request, default_config, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("slow-clients")
    config = replace(default_config, store=StoreConfig(path=str(tmp / "calls.sqlite3")),
                     server=replace(default_config.server, request_header_timeout_seconds=DEADLINE_S),
                     transcription=replace(default_config.transcription, upload_dir=str(tmp / "uploads")))
    engines = Engines(asr=ScriptedASR("hi"), llm=ScriptedLLM(["Hello there."]), tts=ToneTTS(),
                      embedder=HashingEmbedder())
    with pytest.MonkeyPatch.context() as patch:
        # What uvicorn's "auto" resolves to is the only difference between the two servers.
        patch.setitem(HTTP_PROTOCOLS, "auto", HTTP_PROTOCOLS[request.param])
        with running_server(config, engines) as running:
            yield running


async def connect(base_url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    parts = urlsplit(base_url)
    return await asyncio.open_connection(parts.hostname, parts.port)


async def closed_by_server(reader: asyncio.StreamReader) -> None:
    """Returns once the server has closed the connection, whatever it sent before."""
    with contextlib.suppress(ConnectionError):
        while await reader.read(4096):
            pass


async def head_timeouts(base_url: str) -> float:
    async with httpx.AsyncClient(base_url=base_url) as http:
        text = (await http.get("/metrics")).text
    return float(re.search(r"^cadence_request_head_timeouts_total (\S+)$", text, re.M).group(1))


async def slow_upload(base_url: str, body: bytes) -> tuple[bytes, float]:
    """A POST whose head is sent whole and whose body then comes a byte at a time, for longer
    than the deadline: the response's status line, and seconds from the head to the response."""
    reader, writer = await connect(base_url)
    loop = asyncio.get_running_loop()
    try:
        writer.write(b"POST /v1/realtime/client_secrets HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body))
        sent_head = loop.time()
        for byte in body:
            await asyncio.sleep(BYTE_INTERVAL_S)
            writer.write(bytes([byte]))
            await writer.drain()
        async with asyncio.timeout(5):
            response = await reader.read()  # to EOF: the server closes after answering
        return response.split(b"\r\n", 1)[0], loop.time() - sent_head
    finally:
        writer.close()


@pytest.mark.slow
async def test_silent_and_trickling_connections_are_closed_at_the_deadline_while_others_are_served(server):
    before = await head_timeouts(server.base_url)
    # Long enough that its last byte comes well after the deadline.
    body = b"{}" + b" " * int(3 * DEADLINE_S / BYTE_INTERVAL_S)
    figures, (status_line, upload_s) = await asyncio.gather(
        slow_clients.run(server.base_url, idle=SLOW_CLIENTS, trickle=SLOW_CLIENTS, deadline_s=DEADLINE_S,
                         slack_s=SLACK_S, trickle_interval_s=BYTE_INTERVAL_S),
        slow_upload(server.base_url, body))
    assert figures["failed_to_open"] == 0, figures
    for kind in ("idle", "trickle"):
        closures = figures[kind]
        assert closures["closed"] == SLOW_CLIENTS, figures
        assert closures["min_close_s"] >= DEADLINE_S - EARLY_S, figures
        assert closures["max_close_s"] <= DEADLINE_S + SLACK_S, figures
    assert figures["healthz"]["ok"] and figures["healthz"]["latency_s"] < 1.0, figures
    # The upload's head was complete at once: its body may take as long as it takes.
    assert upload_s > 2 * DEADLINE_S and status_line.startswith(b"HTTP/1.1 "), (status_line, upload_s)
    assert status_line.split()[1] not in (b"400", b"408", b"500"), status_line
    assert await head_timeouts(server.base_url) - before == 2 * SLOW_CLIENTS


async def after_one_exchange(base_url: str, *, then_trickle: bool) -> float:
    """A keep-alive connection that gets one answer, then sends nothing (or trickles its
    next request): seconds from the answer until the server closes it."""
    reader, writer = await connect(base_url)
    loop = asyncio.get_running_loop()
    trickler = None
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200") and b"connection: close" not in head.lower(), head
        length = int(re.search(rb"content-length: (\d+)", head, re.I).group(1))
        await asyncio.wait_for(reader.readexactly(length), 5)
        answered = loop.time()
        if then_trickle:
            trickler = asyncio.create_task(slow_clients.trickle_head(writer, BYTE_INTERVAL_S))
        await asyncio.wait_for(closed_by_server(reader), DEADLINE_S + SLACK_S)
        return loop.time() - answered
    finally:
        await slow_clients.stop_trickling(trickler)
        writer.close()


async def test_a_keep_alive_connection_idle_or_trickling_after_its_answer_is_closed(server):
    # uvicorn's own keep-alive timeout (5 s) would close the idle one later, and the
    # trickling one never: the first byte after an answer cancels it for good.
    idle_s, trickle_s = await asyncio.gather(after_one_exchange(server.base_url, then_trickle=False),
                                             after_one_exchange(server.base_url, then_trickle=True))
    assert DEADLINE_S - EARLY_S <= idle_s <= DEADLINE_S + SLACK_S, idle_s
    assert DEADLINE_S - EARLY_S <= trickle_s <= DEADLINE_S + SLACK_S, trickle_s


@pytest.mark.slow
async def test_a_websocket_and_an_event_stream_outlive_the_deadline(server):
    loop = asyncio.get_running_loop()
    ws = await websockets.connect(f"{server.ws_url}/ws/twilio", open_timeout=5)
    ws_opened = loop.time()
    try:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=5) as http:
            async with http.stream("GET", "/api/dashboard/stream") as stream, asyncio.timeout(5):
                assert stream.status_code == 200
                opened, statuses = loop.time(), 0
                async for line in stream.aiter_lines():
                    if line == "event: status":
                        statuses += 1
                    if statuses == 2:  # one at once, the next a status interval (1 s) later
                        break
                assert loop.time() - opened > DEADLINE_S
        # Still inside the socket's own wait for Twilio's `start` (limits.handshake_timeout_seconds, 5 s).
        assert loop.time() - ws_opened > 2 * DEADLINE_S
        await asyncio.wait_for(await ws.ping(), 1)
        assert ws.close_code is None
    finally:
        await ws.close()
