"""A real browser-style call over WebRTC (aiortc client <-> pipecat SmallWebRTC), end to end.

The caller's question is spoken by espeak-ng at test time and sent as a real-time Opus
audio track after host-only ICE on loopback (no STUN); the reply audio that comes back
on the same transceiver is transcribed with the project's own ASR and must hold real
English words.

aioice never gathers 127.0.0.1, so left alone both peers would pair over this host's
other interface addresses, and a host with loopback only (a sandboxed CI job) would
have no candidate at all. Server and caller share this process, so one patch makes
both gather exactly 127.0.0.1: the call stays on loopback and works on any host.
"""

from __future__ import annotations

import re

import aioice.ice
import httpx
import pytest

from tests.call_checks import assert_answered_capital_question, wait_until_ended
from latency_bench.callers import webrtc_caller
from latency_bench.callers.audio import resample, speak
from latency_bench.callers.conversation import PlannedTurn

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

QUESTION = "Hello. What is the capital of France?"
LOOPBACK = "127.0.0.1"


@pytest.fixture(autouse=True)
def loopback_ice_only(monkeypatch):
    monkeypatch.setattr(aioice.ice, "get_host_addresses",
                        lambda use_ipv4, use_ipv6: [LOOPBACK] if use_ipv4 else [])


async def test_webrtc_call_gets_a_spoken_english_reply(server, embedded_engines):
    samples, rate = speak(QUESTION)
    result = await webrtc_caller.call(f"{server.base_url}/api/offer", [PlannedTurn.of(samples, rate, QUESTION)],
                                      keep_audio=True)

    turn, = result.turns
    assert turn.error is None and turn.first_audible_at is not None, "no reply audio came back"
    assert turn.reply_audio_seconds > 0.5
    assert 0 < turn.ttfb_ms <= turn.ttfs_ms < 10_000, f"caller-side TTFB {turn.ttfb_ms} ms, TTFS {turn.ttfs_ms} ms"
    pcm16 = resample(turn.reply_audio(), result.reply_rate, embedded_engines.asr.sample_rate)
    heard = (await embedded_engines.asr.transcribe(pcm16.tobytes())).text
    words = re.findall(r"[a-zA-Z']{2,}", heard)
    assert len(words) >= 2, f"reply did not sound like English: {heard!r}"

    async with httpx.AsyncClient(base_url=server.base_url) as http:
        call = await wait_until_ended(http, result.call_id)
        calls = (await http.get("/api/calls")).json()["calls"]
        metrics = (await http.get("/metrics")).text
    assert [c["transport"] for c in calls if c["id"] == result.call_id] == ["webrtc"]
    assert_answered_capital_question(call)
    assert 'cadence_ttfs_seconds_count{transport="webrtc"} 1.0' in metrics


async def test_webrtc_call_through_every_model_in_a_worker_process(default_config, tmp_path):
    from dataclasses import replace

    from agent.config import StoreConfig
    from tests.conftest import REPO_ROOT, running_server

    config = replace(default_config, store=StoreConfig(path=str(tmp_path / "calls.sqlite3")),
                     deployment=str(REPO_ROOT / "configs" / "deployments" / "cpu-workers.yaml"))
    samples, rate = speak(QUESTION)
    with running_server(config, None, ready_timeout_s=240) as server:
        assert len(server.app.state.model_plane.supervisor.workers) == 4
        result = await webrtc_caller.call(f"{server.base_url}/api/offer", [PlannedTurn.of(samples, rate, QUESTION)])
        turn, = result.turns
        assert turn.error is None and turn.first_audible_at is not None, "no reply audio came back"
        assert turn.reply_audio_seconds > 0.5
        async with httpx.AsyncClient(base_url=server.base_url) as http:
            assert_answered_capital_question(await wait_until_ended(http, result.call_id))


async def test_a_caller_whose_audio_ends_is_hung_up_though_its_close_never_came(server_config):
    """At 10 % loss a hanging-up caller's RTCP BYE can arrive where its DTLS close is lost: the
    call ends on the BYE (its audio track ending), not ~30 s later when ICE consent runs out."""
    from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

    from latency_bench.chaos.server_figures import poll_until
    from pipelines.voice import Engines
    from tests.conftest import running_server
    from tests.fakes import HashingEmbedder, ScriptedASR, ScriptedLLM, ToneTTS

    engines = Engines(asr=ScriptedASR("what time do you open"), llm=ScriptedLLM(["We open at nine."]),
                      tts=ToneTTS(chunks=10, frequency_hz=440.0), embedder=HashingEmbedder())
    with running_server(server_config, engines) as server:
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        try:
            pc.addTransceiver(webrtc_caller.MicrophoneTrack(), direction="sendrecv")
            pc.createDataChannel(webrtc_caller.DATA_CHANNEL_LABEL)
            await pc.setLocalDescription(await pc.createOffer())
            async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as http:
                answer = (await http.post("/api/offer", json={"sdp": pc.localDescription.sdp,
                                                              "type": "offer"})).json()
                await pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))
                assert await poll_until(lambda: pc.connectionState == "connected", 10)
                await pc.getSenders()[0].stop()  # the caller's audio ends (RTCP BYE); the connection stays open
                call: dict = {}

                async def ended() -> bool:
                    nonlocal call
                    call = (await http.get(f"/api/calls/{answer['call_id']}")).json()
                    return call.get("live") is False

                assert await poll_until(ended, 10), call  # consent would take ~30 s
                assert call["end_reason"] == "caller_hung_up"
        finally:
            await pc.close()
