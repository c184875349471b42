"""/v1/realtime on a real server on loopback, driven by the official `openai` SDK: text use,
manual commits, G.711, refusals of bad events and of bad credentials, the session cap. The
engines are fakes built on the real interfaces (a scripted transcript and reply, a tone for a
voice); tests/test_e2e_realtime.py holds a spoken conversation with the real models."""

from __future__ import annotations

import asyncio
import base64
import json
from dataclasses import replace

import httpx
import pytest
import websockets

from agent.auth import AuthConfig
from pipelines.voice import Engines
from tests.conftest import running_server
from tests.fakes import HashingEmbedder, ScriptedASR, ScriptedLLM, ToneTTS
from tests.realtime_client import audio_ms, realtime_session, utterance

KEY = "realtime-test-key-0123456789"
REPLY = ["We open", " at eight.", " Walk-ins are welcome."]


def fake_engines() -> Engines:
    return Engines(asr=ScriptedASR("When do you open?"), llm=ScriptedLLM(REPLY), tts=ToneTTS(chunks=4),
                   embedder=HashingEmbedder())


@pytest.fixture
def server(server_config):
    config = replace(server_config, auth=AuthConfig(max_sessions_per_key=1))
    with running_server(config, fake_engines(), environ={"CADENCE_API_KEYS": KEY}) as running:
        yield running


def text_item(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


async def sessions_closed(server, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while server.app.state.gate.open_sessions("key-1") or server.app.state.manager.active_count:
            await asyncio.sleep(0.02)


async def stored_calls(base_url: str) -> list[dict]:
    async with httpx.AsyncClient(base_url=base_url) as http:
        return (await http.get("/api/calls")).json()["calls"]


async def test_a_text_conversation_gets_spoken_replies_with_their_transcript(server):
    async with realtime_session(server.base_url, api_key=KEY) as rt:
        created = await rt.next("session.created")
        assert created.session.model == "default" and created.session.audio.input.format.rate == 24000
        await rt.connection.conversation.item.create(item=text_item("When do you open?"))
        added = await rt.next("conversation.item.added")
        assert added.item.role == "user" and added.item.content[0].text == "When do you open?"
        await rt.connection.response.create()
        done = await rt.next("response.done")
        order = [e.type for e in rt.events]
        assert order.index("response.created") < order.index("response.output_audio.delta") < order.index(
            "response.output_audio.done") < order.index("response.done")
        transcript = "".join(e.delta for e in rt.of_type("response.output_audio_transcript.delta"))
        assert "We open at eight." in transcript
        assert done.response.status == "completed"
        assert done.response.output[0].content[0].transcript == transcript
        assert audio_ms(rt.of_type("response.output_audio.delta")) > 100
        # The model sees what the client added: a second question gets a second reply.
        await rt.connection.conversation.item.create(item=text_item("And on Sundays?"))
        await rt.connection.response.create()
        second = await rt.next("response.done", after=rt.index_of(done) + 1)
        assert second.response.id != done.response.id
        calls = await stored_calls(server.base_url)
        assert calls[0]["transport"] == "realtime" and calls[0]["live"]
        llm_saw = server.app.state.engines.llm.prompts[-1]
        assert [m["content"] for m in llm_saw if m["role"] == "user"][-2:] == ["When do you open?", "And on Sundays?"]


async def test_text_modality_replies_without_audio(server):
    async with realtime_session(server.base_url, api_key=KEY) as rt:
        await rt.connection.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        updated = await rt.next("session.updated")
        assert updated.session.output_modalities == ["text"]
        await rt.connection.conversation.item.create(item=text_item("When do you open?"))
        await rt.connection.response.create()
        done = await rt.next("response.done")
        assert not rt.of_type("response.output_audio.delta")
        text = "".join(e.delta for e in rt.of_type("response.output_text.delta"))
        assert text.startswith("We open at eight.") and done.response.status == "completed"


@pytest.mark.slow
async def test_manual_commits_transcribe_the_buffer_and_wait_for_response_create(server):
    async with realtime_session(server.base_url, api_key=KEY) as rt:
        await rt.connection.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
        assert (await rt.next("session.updated")).session.audio.input.turn_detection is None
        await rt.connection.input_audio_buffer.commit()  # nothing buffered yet
        assert (await rt.next("error")).error.code == "input_audio_buffer_commit_empty"
        await rt.send_pcm(utterance("When do you open?", trailing_silence_s=0.2))
        assert not rt.of_type("input_audio_buffer.speech_started")  # no server VAD: no turn by itself
        await rt.connection.input_audio_buffer.commit()
        completed = await rt.next("conversation.item.input_audio_transcription.completed")
        assert completed.transcript == "When do you open?"
        assert rt.of_type("input_audio_buffer.committed")
        assert not rt.of_type("response.created")
        await rt.connection.response.create()
        assert (await rt.next("response.done")).response.status == "completed"


async def test_g711_sessions_get_mu_law_audio(server):
    async with realtime_session(server.base_url, api_key=KEY) as rt:
        await rt.connection.session.update(session={"type": "realtime", "audio": {
            "input": {"format": {"type": "audio/pcmu"}}, "output": {"format": {"type": "audio/pcmu"}}}})
        assert (await rt.next("session.updated")).session.audio.output.format.type == "audio/pcmu"
        await rt.connection.conversation.item.create(item=text_item("When do you open?"))
        await rt.connection.response.create()
        await rt.next("response.done")
        mulaw = b"".join(base64.b64decode(e.delta) for e in rt.of_type("response.output_audio.delta"))
        # ToneTTS: 4 chunks of 1600 samples at 16 kHz per sentence = 0.4 s; 8 kHz mu-law: 8 bytes a ms.
        assert 0.35 * 8000 <= len(mulaw) <= 2 * 0.45 * 8000
        assert len(set(mulaw)) > 8  # a tone, not silence


async def test_bad_events_get_error_events_and_the_session_goes_on(server):
    async with realtime_session(server.base_url, api_key=KEY) as rt:
        await rt.next("session.created")
        await rt.connection.send_raw("{not json")
        await rt.connection.send_raw(json.dumps({"type": "no.such.event", "event_id": "ev1"}))
        await rt.connection.send_raw(json.dumps({"type": "input_audio_buffer.append", "audio": "%%%"}))
        await rt.connection.send_raw(json.dumps({"type": "session.update", "event_id": "ev2", "session": {
            "type": "realtime", "audio": {"input": {"format": {"type": "audio/pcma"}}}}}))
        await rt.connection.send_raw(json.dumps({"type": "response.cancel"}))
        await rt.connection.send_raw(json.dumps({"type": "conversation.item.delete", "item_id": "item_nope"}))
        errors = []
        while len(errors) < 6:
            errors.append(await rt.next("error", after=rt.index_of(errors[-1]) + 1 if errors else 0))
        codes = [e.error.code for e in errors]
        assert codes == ["invalid_json", "unknown_event", "invalid_value", "unsupported",
                         "response_cancel_not_active", "item_not_found"]
        assert errors[1].error.event_id == "ev1" and "no.such.event" in errors[1].error.message
        assert errors[3].error.param.startswith("session.audio.input.format")
        await rt.connection.conversation.item.create(item=text_item("When do you open?"))
        await rt.connection.response.create()
        assert (await rt.next("response.done")).response.status == "completed"


async def test_credentials_are_checked_at_the_handshake_and_never_logged(server, log_lines):
    url = f"{server.ws_url}/v1/realtime?model=default"
    for headers, status in (({}, 401), ({"Authorization": "Bearer wrong-key-0123456789"}, 401),
                            ({"Authorization": f"Bearer {KEY}", "Origin": "https://evil.example"}, 403)):
        with pytest.raises(websockets.InvalidStatus) as refused:
            await websockets.connect(url, additional_headers=headers, open_timeout=5)
        assert refused.value.response.status_code == status
        body = json.loads(refused.value.response.body)
        assert body["error"]["message"]
    async with httpx.AsyncClient(base_url=server.base_url) as http:
        token = (await http.post("/v1/realtime/client_secrets", headers={"Authorization": f"Bearer {KEY}"})).json()
    # A browser sends the token as a subprotocol; it opens one session only.
    protocols = ["realtime", f"openai-insecure-api-key.{token['value']}"]
    async with websockets.connect(url, subprotocols=protocols, open_timeout=5) as browser:
        assert browser.subprotocol == "realtime"
        assert json.loads(await browser.recv())["type"] == "session.created"
    with pytest.raises(websockets.InvalidStatus) as reused:
        await websockets.connect(url, subprotocols=protocols, open_timeout=5)
    assert json.loads(reused.value.response.body)["error"]["code"] == "reused"
    await sessions_closed(server)  # the browser's session ends on the server a moment later
    with pytest.raises(websockets.InvalidStatus) as unknown_agent:
        await websockets.connect(url.replace("default", "nobody"), open_timeout=5,
                                 additional_headers={"Authorization": f"Bearer {KEY}"})
    assert unknown_agent.value.response.status_code == 404
    text = "\n".join(log_lines)
    assert "access refused" in text  # the log was captured
    for secret in (KEY, token["value"], token["value"][3:]):
        assert secret not in text


async def test_the_session_cap_refuses_a_second_session_without_disturbing_the_first(server):
    async with realtime_session(server.base_url, api_key=KEY) as first:
        await first.next("session.created")
        with pytest.raises(websockets.InvalidStatus) as refused:
            await websockets.connect(f"{server.ws_url}/v1/realtime", open_timeout=5,
                                     additional_headers={"Authorization": f"Bearer {KEY}"})
        assert refused.value.response.status_code == 429
        await first.connection.conversation.item.create(item=text_item("When do you open?"))
        await first.connection.response.create()
        assert (await first.next("response.done")).response.status == "completed"


async def test_a_session_that_ends_is_stored_as_a_realtime_call(server):
    async with realtime_session(server.base_url, api_key=KEY) as rt:
        await rt.next("session.created")
    await sessions_closed(server)
    calls = await stored_calls(server.base_url)
    assert calls[0]["transport"] == "realtime" and calls[0]["agent"] == "default" and not calls[0]["live"]

