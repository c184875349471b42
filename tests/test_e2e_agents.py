"""Agents over real transports: a phone call names its agent in the Twilio `start` event's
customParameters and hears that agent's greeting (transcribed by the project's own ASR);
an unknown agent is refused with a clear close reason; the call is stored under its agent."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from dataclasses import dataclass

import httpx
import numpy as np
import pytest
import websockets

from latency_bench.callers.audio import mulaw_decode, mulaw_encode, resample
from tests.call_checks import wait_until_ended

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PHONE_RATE = 8000
FRAME = 160  # 20 ms at 8 kHz
FRONT_DESK = {
    "name": "front-desk",
    "system_prompt": "You are the front desk of Oakwood Family Clinic. Answer briefly.",
    "greeting": "Welcome to Oakwood Family Clinic. How can I help you today?",
    "knowledge": {"enabled": False},
}


@dataclass
class Heard:
    audio: np.ndarray
    call_sid: str
    close_code: int | None
    close_reason: str


async def listen_on_a_phone_call(ws_url: str, agent: str | None, seconds: float) -> Heard:
    """Connects like a phone, sends line silence for `seconds`, returns what it heard."""
    stream_sid, call_sid = "MZ" + uuid.uuid4().hex, "CA" + uuid.uuid4().hex
    heard: list[np.ndarray] = []
    start = {"streamSid": stream_sid, "callSid": call_sid, "tracks": ["inbound"],
             "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
             "customParameters": {"agent": agent} if agent else {}}
    silence = base64.b64encode(mulaw_encode(np.zeros(FRAME, dtype=np.int16))).decode()
    async with websockets.connect(f"{ws_url}/ws/twilio") as ws:
        await ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
        await ws.send(json.dumps({"event": "start", "streamSid": stream_sid, "start": start}))

        async def receive() -> None:
            async for message in ws:
                event = json.loads(message)
                if event.get("event") == "media":
                    heard.append(mulaw_decode(base64.b64decode(event["media"]["payload"])))

        receiver = asyncio.create_task(receive())
        try:
            for _ in range(int(seconds / 0.02)):
                await ws.send(json.dumps({"event": "media", "streamSid": stream_sid, "media": {"payload": silence}}))
                await asyncio.sleep(0.02)
            await ws.send(json.dumps({"event": "stop", "streamSid": stream_sid}))
        except websockets.ConnectionClosed:
            pass
        finally:
            receiver.cancel()
            await asyncio.gather(receiver, return_exceptions=True)
    audio = np.concatenate(heard) if heard else np.zeros(0, dtype=np.int16)
    return Heard(audio, call_sid, ws.close_code, ws.close_reason or "")


async def test_a_phone_call_to_a_named_agent_hears_that_agents_greeting(server, embedded_engines):
    async with httpx.AsyncClient(base_url=server.base_url) as http:
        assert (await http.post("/api/agents", json=FRONT_DESK)).status_code == 201
        call = await listen_on_a_phone_call(server.ws_url, "front-desk", seconds=6.0)
        assert call.audio.size > PHONE_RATE, "no greeting audio came back"
        pcm16 = resample(call.audio, PHONE_RATE, embedded_engines.asr.sample_rate)
        heard = (await embedded_engines.asr.transcribe(pcm16.tobytes())).text.lower()
        assert "clinic" in heard or "oakwood" in heard or "welcome" in heard, f"greeting not heard: {heard!r}"

        calls = (await http.get("/api/calls", params={"external_id": call.call_sid})).json()["calls"]
        assert calls and calls[0]["agent"] == "front-desk"
        stored = await wait_until_ended(http, calls[0]["id"])
        assert stored["agent"] == "front-desk"


async def test_the_default_agent_waits_for_the_caller_and_an_unknown_agent_is_refused(server):
    quiet = await listen_on_a_phone_call(server.ws_url, None, seconds=1.5)
    assert np.abs(quiet.audio.astype(np.int32)).max(initial=0) < 2000, "the default agent has no greeting"
    refused = await listen_on_a_phone_call(server.ws_url, "nobody-here", seconds=0.5)
    assert refused.audio.size == 0 and refused.close_code == 1008
    assert "no agent 'nobody-here'" in refused.close_reason
