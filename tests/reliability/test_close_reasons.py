"""A call's WebSocket closes with a code and a reason the client can act on
(agent/transports/closing.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import httpx
import pytest
import websockets

from pipecat.transports.websocket.fastapi import FastAPIWebsocketCallbacks, FastAPIWebsocketClient
from starlette.websockets import WebSocket
from uvicorn.protocols.utils import ClientDisconnected

from agent.transports.closing import MAX_REASON_BYTES, ExplainedClose, close_for, close_reason
from pipelines.voice import Engines
from tests.conftest import running_server
from tests.fakes import HashingEmbedder, ScriptedASR, ScriptedLLM, ToneTTS
from tests.test_bad_input import closed_with, open_call, wait_for_no_calls
from tests.test_bad_input import server_errors  # noqa: F401 - a fixture

BUDGET = 2
GRIN = "\U0001F600"  # 4 bytes in UTF-8


@pytest.fixture
def server(server_config):
    config = replace(server_config, limits=replace(server_config.limits, max_bad_messages=BUDGET))
    engines = Engines(asr=ScriptedASR("hi"), llm=ScriptedLLM(["Hello."]), tts=ToneTTS(), embedder=HashingEmbedder())
    with running_server(config, engines) as running:
        yield running


def test_a_reason_is_cut_to_the_bytes_a_close_frame_holds_never_mid_character():
    assert close_reason("too many invalid messages") == "too many invalid messages"
    cut = close_reason("last: " + GRIN * 40)
    assert len(cut.encode()) <= MAX_REASON_BYTES and cut == "last: " + GRIN * ((MAX_REASON_BYTES - 6) // 4)


@pytest.mark.parametrize("end_reason, code, says", [
    ("idle_timeout", 1000, "nobody spoke for 120 s"),
    ("max_duration", 1000, "limit of 1800 s"),
    ("server_shutdown", 1001, "shutting down"),
])
def test_a_call_the_server_ended_says_why(end_reason, code, says):
    got_code, reason = close_for(end_reason, idle_timeout_s=120.0, max_call_s=1800.0)
    assert got_code == code and says in reason


@pytest.mark.parametrize("end_reason", ["caller_hung_up", "bad_input", "completed"])
def test_other_ends_keep_their_own_close(end_reason):
    assert close_for(end_reason, idle_timeout_s=120.0, max_call_s=1800.0) is None


async def test_a_phone_call_past_the_budget_on_non_ascii_junk_is_closed_1008_not_dropped(server, server_errors):
    """Found by the bad-audio scenario's review: a reason of 120 characters but over 123 bytes made
    the close itself fail (websockets: "control frame too long"): the caller saw 1006, the call was
    stored as hung up, and the failure was logged as an error."""
    call = await open_call(server.ws_url)
    for _ in range(BUDGET + 1):
        await call.send(json.dumps({"event": GRIN * 40}))
    code, reason = await closed_with(call)
    assert code == 1008 and reason.startswith("too many invalid messages; last: unknown event")
    await wait_for_no_calls(server.base_url)
    async with httpx.AsyncClient(base_url=server.base_url) as http:
        assert (await http.get("/api/calls")).json()["calls"][0]["end_reason"] == "bad_input"
    assert server_errors == []


async def test_a_realtime_session_past_the_budget_says_what_the_last_fault_was(server, server_errors):
    async with websockets.connect(f"{server.ws_url}/v1/realtime", open_timeout=5) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        for _ in range(BUDGET + 1):
            await ws.send(json.dumps({"type": GRIN * 40}))
        code, reason = await closed_with(ws)
    assert code == 1008 and reason.startswith("too many invalid events; last: event type")
    assert server_errors == []


async def _accepted_socket_whose_peer_is_gone() -> WebSocket:
    """A Starlette socket, accepted, over an ASGI `send` that refuses the close as uvicorn's does
    when the client's side of the connection has already closed."""
    async def receive():
        return {"type": "websocket.connect"}

    async def send(message):
        if message["type"] == "websocket.close":
            raise ClientDisconnected()

    websocket = WebSocket({"type": "websocket", "path": "/ws/twilio", "headers": []}, receive, send)
    await websocket.accept()
    return websocket


async def test_a_caller_who_hangs_up_as_the_server_closes_is_no_error(server_errors):
    """Found by CI's three-minute soak: a caller hung up in the instant the server closed its call,
    and pipecat logged the failed close as an ERROR with an empty message."""
    async def ignored(_websocket):
        return None

    socket = ExplainedClose(await _accepted_socket_whose_peer_is_gone(), lambda: None)
    client = FastAPIWebsocketClient(socket, FastAPIWebsocketCallbacks(
        on_client_connected=ignored, on_client_disconnected=ignored, on_session_timeout=ignored))
    await client.setup(None)
    await client.disconnect()
    assert server_errors == []
