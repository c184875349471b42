"""Audio sent faster than it is spoken (found by the bad-audio scenario: an hour of audio in
three seconds was all queued, +160 MB): past limits.max_audio_ahead_seconds it is refused, said
so and counted as bad input, on the phone and on /v1/realtime; the call itself goes on."""

from __future__ import annotations

import base64
import json
import re
from dataclasses import replace

import httpx
import pytest
import websockets

from pipelines.voice import Engines
from tests.conftest import running_server
from tests.fakes import HashingEmbedder, ScriptedASR, ScriptedLLM, ToneTTS
from tests.test_bad_input import START, closed_with
from tests.test_bad_input import server_errors  # noqa: F401 - a fixture

AHEAD_S = 2.0


@pytest.fixture
def server(server_config):
    config = replace(server_config, limits=replace(server_config.limits, max_audio_ahead_seconds=AHEAD_S),
                     server=replace(server_config.server, max_ws_message_bytes=2**20))  # 1 s appends
    engines = Engines(asr=ScriptedASR("hi"), llm=ScriptedLLM(["Hello there."]), tts=ToneTTS(),
                      embedder=HashingEmbedder())
    with running_server(config, engines) as running:
        yield running


async def test_a_phone_flooding_audio_is_refused_past_the_allowance_then_closed_at_the_budget(server,
                                                                                             server_errors):
    ws = await websockets.connect(f"{server.ws_url}/ws/twilio", open_timeout=5)
    await ws.send(json.dumps({"event": "connected"}))
    await ws.send(json.dumps(START))
    frame = json.dumps({"event": "media", "media": {"payload": base64.b64encode(b"\xff" * 160).decode()}})
    sent = 0
    try:
        for _ in range(3000):  # a minute of audio, as fast as the socket takes it
            await ws.send(frame)
            sent += 1
    except websockets.ConnectionClosed:
        pass
    code, reason = await closed_with(ws)
    assert code == 1008 and "faster than it is spoken" in reason
    async with httpx.AsyncClient(base_url=server.base_url) as http:
        metrics = (await http.get("/metrics")).text
    refused = re.search(r'^cadence_bad_input_total\{kind="BadMediaError",transport="twilio"\} ([0-9.]+)$', metrics,
                        re.MULTILINE)
    # The 100 frames of the allowance went in; the rest in flight were refused, one by one.
    assert refused and 51 <= float(refused[1]) <= sent - AHEAD_S / 0.02
    assert server_errors == []


async def test_a_realtime_client_flooding_audio_gets_rate_limited_errors_and_the_session_goes_on(server,
                                                                                                server_errors):
    second = base64.b64encode(bytes(48_000)).decode()  # 1 s of 24 kHz PCM16 silence
    async with websockets.connect(f"{server.ws_url}/v1/realtime", open_timeout=5) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        for n in range(5):  # 5 s at once
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": second, "event_id": f"a{n}"}))
        await ws.send(json.dumps({"type": "input_audio_buffer.clear", "event_id": "probe"}))
        errors = []
        while (event := json.loads(await ws.recv()))["type"] != "input_audio_buffer.cleared":
            if event["type"] == "error":
                errors.append(event["error"])
        # 2 s admitted at once, the rest refused, each said so with the append it was.
        assert [e["code"] for e in errors] == ["rate_limited"] * 3
        assert [e["event_id"] for e in errors] == ["a2", "a3", "a4"]
    assert server_errors == []
