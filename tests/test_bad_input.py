"""Bad input gets a clear answer and harms nothing: not the server, not other calls, not the store.

What is tested is the transport, the limits and the store around the models, so the models
are fakes on the real engine interfaces (tests/fakes.py): a real Silero VAD still hears the
caller, a scripted ASR and LLM answer and a tone is the voice. Real models on every transport
are the e2e tests' (tests/test_e2e_*.py)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from dataclasses import replace

import httpx
import numpy as np
import pytest
import websockets
from loguru import logger

from latency_bench.callers import twilio_caller
from latency_bench.callers.audio import mulaw_encode, resample, speak
from latency_bench.callers.conversation import PlannedTurn
from pipelines.voice import Engines
from tests.conftest import running_server
from tests.fakes import HashingEmbedder, ScriptedASR, ScriptedLLM, ToneTTS

START = {"event": "start", "start": {"streamSid": "MZbad", "callSid": "CAbad",
                                     "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000}}}


@pytest.fixture
def fake_engines() -> Engines:
    return Engines(asr=ScriptedASR("Tell me a story."),
                   llm=ScriptedLLM(["Once upon a time, ", "there was a sea. ", "And ships sailed on it."]),
                   tts=ToneTTS(chunks=20), embedder=HashingEmbedder())


@pytest.fixture
def server(server_config, fake_engines):
    with running_server(server_config, fake_engines) as running:
        yield running


@pytest.fixture
def server_errors():
    """Every ERROR logged by the server (loguru from pipecat, logging from us) during a test."""
    records: list[str] = []
    sink_id = logger.add(lambda message: records.append(str(message)), level="ERROR")

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(self.format(record) + (" [traceback]" if record.exc_info else ""))

    handler = Collect(level=logging.ERROR)
    logging.getLogger().addHandler(handler)
    yield records
    logger.remove(sink_id)
    logging.getLogger().removeHandler(handler)


async def open_call(ws_url: str):
    ws = await websockets.connect(f"{ws_url}/ws/twilio", open_timeout=5)
    await ws.send(json.dumps({"event": "connected"}))
    await ws.send(json.dumps(START))
    return ws


async def closed_with(ws, timeout_s: float = 10.0) -> tuple[int | None, str]:
    try:
        async with asyncio.timeout(timeout_s):
            async for _ in ws:
                pass
    except websockets.ConnectionClosed:
        pass
    return ws.close_code, ws.close_reason


async def health(base_url: str) -> dict:
    async with httpx.AsyncClient(base_url=base_url) as http:
        assert (await http.get("/healthz")).status_code == 200
        return (await http.get("/readyz")).json()


async def wait_for_no_calls(base_url: str) -> None:
    for _ in range(100):
        if (await health(base_url))["calls_active"] == 0:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("calls still active")


async def test_garbage_messages_are_dropped_and_the_call_goes_on(server, server_errors):
    ws = await open_call(server.ws_url)
    for junk in ["not json", "[1,2]", '{"event": "teleport"}', '{"event": "media", "media": {"payload": "@@@"}}',
                 json.dumps({"event": "media", "media": {"payload": base64.b64encode(bytes(5000)).decode()}}),
                 b"\x00binary"]:
        await ws.send(junk)
    # Valid audio after the junk is still accepted: the call is alive.
    await ws.send(json.dumps({"event": "media", "media": {"payload": base64.b64encode(b"\xff" * 160).decode()}}))
    await asyncio.sleep(0.3)
    assert ws.close_code is None
    await ws.send(json.dumps({"event": "stop"}))
    assert (await closed_with(ws))[0] is not None
    await wait_for_no_calls(server.base_url)
    async with httpx.AsyncClient(base_url=server.base_url) as http:
        metrics = (await http.get("/metrics")).text
        calls = (await http.get("/api/calls")).json()["calls"]
    assert 'cadence_bad_input_total{kind="BadSignalingError",transport="twilio"} 4.0' in metrics
    assert 'cadence_bad_input_total{kind="BadMediaError",transport="twilio"} 2.0' in metrics
    assert calls[0]["end_reason"] == "caller_hung_up"
    assert server_errors == []


async def test_a_flood_of_bad_messages_closes_only_that_call(server_config, fake_engines, server_errors):
    config = replace(server_config, limits=replace(server_config.limits, max_bad_messages=5))
    with running_server(config, fake_engines) as srv:
        good = await open_call(srv.ws_url)
        bad = await open_call(srv.ws_url)
        for _ in range(10):
            await bad.send("garbage")
        code, reason = await closed_with(bad)
        assert code == 1008 and "too many invalid messages" in reason
        assert good.close_code is None  # the other call is untouched
        await good.send(json.dumps({"event": "stop"}))
        await closed_with(good)
        await wait_for_no_calls(srv.base_url)
        async with httpx.AsyncClient(base_url=srv.base_url) as http:
            reasons = sorted(c["end_reason"] for c in (await http.get("/api/calls")).json()["calls"])
        assert reasons == ["bad_input", "caller_hung_up"]
    assert server_errors == []


@pytest.mark.parametrize("first, second", [
    ("hello", None),
    (json.dumps({"event": "media", "media": {"payload": "AAAA"}}), None),
    (json.dumps({"event": "connected"}), json.dumps({"event": "start", "start": {"streamSid": ""}})),
])
async def test_a_bad_handshake_is_closed_with_a_reason(server, first, second, server_errors):
    ws = await websockets.connect(f"{server.ws_url}/ws/twilio")
    await ws.send(first)
    if second:
        await ws.send(second)
    code, reason = await closed_with(ws)
    assert code == 1008 and reason
    await wait_for_no_calls(server.base_url)
    assert server_errors == []


async def test_an_oversized_message_closes_the_connection_not_the_server(server, server_errors):
    ws = await open_call(server.ws_url)
    await ws.send("x" * (server.app.state.manager._config.server.max_ws_message_bytes + 1))
    code, _ = await closed_with(ws)
    assert code == 1009  # message too big
    await wait_for_no_calls(server.base_url)
    assert (await health(server.base_url))["status"] == "ready"
    assert server_errors == []


async def test_calls_beyond_capacity_are_refused_with_try_again_later(server_config, fake_engines):
    config = replace(server_config, server=replace(server_config.server, max_concurrent_calls=1))
    with running_server(config, fake_engines) as srv:
        first = await open_call(srv.ws_url)
        await asyncio.sleep(0.2)
        second = await websockets.connect(f"{srv.ws_url}/ws/twilio")
        code, reason = await closed_with(second)
        assert code == 1013 and "limit of 1" in reason
        async with httpx.AsyncClient(base_url=srv.base_url) as http:
            offer = await http.post("/api/offer", json={"type": "offer", "sdp": "v=0\r\nm=audio 9 x\r\n"})
        assert offer.status_code == 503 and offer.json()["retryable"] is True
        await first.send(json.dumps({"event": "stop"}))
        await closed_with(first)


@pytest.mark.slow
async def test_a_call_is_hung_up_at_its_maximum_duration(server_config, fake_engines, server_errors):
    config = replace(server_config, limits=replace(server_config.limits, max_call_seconds=1.5))
    with running_server(config, fake_engines) as srv:
        ws = await open_call(srv.ws_url)
        code, _ = await closed_with(ws, timeout_s=10)
        assert code is not None  # the server ended it; the caller did nothing
        await wait_for_no_calls(srv.base_url)
        async with httpx.AsyncClient(base_url=srv.base_url) as http:
            calls = (await http.get("/api/calls")).json()["calls"]
        assert calls[0]["end_reason"] == "max_duration"
        assert 1.5 <= calls[0]["ended_at"] - calls[0]["started_at"] < 8
    assert not [r for r in server_errors if "Traceback" in r or "[traceback]" in r]


@pytest.mark.slow
async def test_a_silent_call_is_hung_up_after_the_idle_timeout(server_config, fake_engines, server_errors):
    config = replace(server_config, limits=replace(server_config.limits, idle_timeout_seconds=1.5))
    with running_server(config, fake_engines) as srv:
        ws = await open_call(srv.ws_url)
        code, _ = await closed_with(ws, timeout_s=15)
        assert code is not None
        await wait_for_no_calls(srv.base_url)
        async with httpx.AsyncClient(base_url=srv.base_url) as http:
            assert (await http.get("/api/calls")).json()["calls"][0]["end_reason"] == "idle_timeout"
    assert not [r for r in server_errors if "Traceback" in r or "[traceback]" in r]


async def test_browser_origins_are_refused_on_the_phone_socket(server):
    with pytest.raises(websockets.InvalidStatus):
        await websockets.connect(f"{server.ws_url}/ws/twilio", origin="https://evil.example")


@pytest.mark.parametrize("body, status, text", [
    (b"not json", 400, "must be JSON"),
    (b"[]", 400, "JSON object"),
    (json.dumps({"type": "answer", "sdp": "v=0"}).encode(), 400, "'type' must be"),
    (json.dumps({"type": "offer", "sdp": "hello"}).encode(), 400, "starting with v=0"),
    (json.dumps({"type": "offer", "sdp": "v=0\r\ns=-\r\n"}).encode(), 400, "no audio"),
    (json.dumps({"type": "offer", "sdp": "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=garbage\r\n"}).encode(),
     400, "malformed SDP"),
    (json.dumps({"type": "offer", "sdp": "v=0\r\nm=audio" + "x" * 70_000}).encode(), 413, "larger than"),
])
async def test_malformed_offers_get_a_clear_http_error(server, body, status, text, server_errors):
    async with httpx.AsyncClient(base_url=server.base_url) as http:
        response = await http.post("/api/offer", content=body, headers={"content-type": "application/json"})
    assert response.status_code == status
    assert text in response.json()["error"]
    assert (await health(server.base_url))["calls_active"] == 0
    assert not [r for r in server_errors if "Traceback" in r or "[traceback]" in r]


async def test_ice_candidates_for_an_unknown_connection_are_404(server):
    async with httpx.AsyncClient(base_url=server.base_url) as http:
        r = await http.patch("/api/offer", json={"pc_id": "nope", "candidates": []})
        assert r.status_code == 404
        r = await http.patch("/api/offer", content=b"{{{")
        assert r.status_code == 400


@pytest.mark.slow
async def test_a_caller_who_vanishes_mid_reply_leaves_a_stored_turn_and_a_healthy_server(server, server_errors):
    samples, rate = speak("Please tell me a long story about the sea and the ships on it.")
    question = resample(samples, rate, twilio_caller.PHONE_RATE)
    ws = await open_call(server.ws_url)
    got_audio = asyncio.Event()

    async def listen():
        async for message in ws:
            if json.loads(message).get("event") == "media":
                got_audio.set()

    listener = asyncio.create_task(listen())
    for start in range(0, len(question) + 8000 * 4, twilio_caller.FRAME_SAMPLES):
        frame = question[start:start + twilio_caller.FRAME_SAMPLES]
        frame = np.pad(frame, (0, twilio_caller.FRAME_SAMPLES - len(frame)))
        await ws.send(json.dumps({"event": "media", "media": {
            "payload": base64.b64encode(mulaw_encode(frame)).decode()}}))
        await asyncio.sleep(twilio_caller.FRAME_SECONDS)
        if got_audio.is_set():
            break
    assert got_audio.is_set(), "the agent never started replying"
    ws.transport.abort()  # the line drops: no stop event, no close handshake
    listener.cancel()
    await asyncio.gather(listener, return_exceptions=True)

    await wait_for_no_calls(server.base_url)
    async with httpx.AsyncClient(base_url=server.base_url) as http:
        call_id = (await http.get("/api/calls")).json()["calls"][0]["id"]
        call = (await http.get(f"/api/calls/{call_id}")).json()
    assert call["end_reason"] == "caller_hung_up"
    assert len(call["turns"]) == 1 and call["turns"][0]["ttfs_ms"] is not None
    # The server keeps serving: a new call works end to end.
    result = await twilio_caller.call(f"{server.ws_url}/ws/twilio",
                                      [PlannedTurn.of(question[: 8000 * 2], twilio_caller.PHONE_RATE)])
    assert result.turns[0].first_audible_at is not None
    assert not [r for r in server_errors if "Traceback" in r or "[traceback]" in r]
