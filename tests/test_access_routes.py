"""Access control on the real app and a real server on loopback: operator keys on the routes
that change agents, client tokens minted and redeemed on the routes that start calls, the
Origin allowlist, per-key session caps, Twilio's request signature, and no credential in the
log. Engines are fakes built on the real interfaces; transports and the store are real."""

from __future__ import annotations

import asyncio
import json
from contextlib import contextmanager
from dataclasses import replace

import httpx
import pytest
import websockets

from agent.auth import AuthConfig
from agent.config import CadenceConfig
from agent.transports.twilio_protocol import request_signature
from pipelines.voice import Engines
from tests.conftest import running_server
from tests.fakes import HashingEmbedder, ScriptedASR, ScriptedLLM, ToneTTS
from tests.test_bad_input import closed_with

KEY = "test-operator-key-0123456789"
OTHER_KEY = "second-operator-key-abcdefghij"
TWILIO_TOKEN = "twilio-auth-token-for-tests"
AGENT = {"name": "bakery", "system_prompt": "You answer calls for a bakery."}
START = {"event": "start", "start": {"streamSid": "MZauth", "callSid": "CAauth", "customParameters": {}}}
CLOSE_POLICY, CLOSE_TRY_LATER = 1008, 1013


def fake_engines() -> Engines:
    return Engines(asr=ScriptedASR("hi"), llm=ScriptedLLM(["Hello there."]), tts=ToneTTS(), embedder=HashingEmbedder())


@contextmanager
def serving(config: CadenceConfig, environ: dict[str, str]):
    with running_server(config, fake_engines(), environ=environ) as running:
        yield running


@pytest.fixture
def keyed(server_config: CadenceConfig):
    config = replace(server_config, auth=AuthConfig(max_sessions_per_key=1, allowed_origins=("https://app.example",)))
    with serving(config, {"CADENCE_API_KEYS": f"{KEY},{OTHER_KEY}", "TWILIO_AUTH_TOKEN": TWILIO_TOKEN}) as running:
        yield running


@pytest.fixture
def open_server(server_config: CadenceConfig):
    with serving(server_config, {}) as running:
        yield running


def bearer(credential: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}"}


async def mint(base_url: str, key: str = KEY, **body) -> str:
    async with httpx.AsyncClient(base_url=base_url) as http:
        response = await http.post("/v1/realtime/client_secrets", headers=bearer(key), json=body or None)
    assert response.status_code == 200, response.text
    return response.json()["value"]


# --- changes need an operator key ---------------------------------------------------------------

async def test_agent_changes_need_a_valid_key_and_reads_do_not(keyed):
    async with httpx.AsyncClient(base_url=keyed.base_url) as http:
        missing = await http.post("/api/agents", json=AGENT)
        wrong = await http.post("/api/agents", json=AGENT, headers=bearer("not-the-key-at-all-000"))
        malformed = await http.post("/api/agents", json=AGENT, headers={"Authorization": f"Basic {KEY}"})
        assert [r.status_code for r in (missing, wrong, malformed)] == [401, 401, 401]
        assert [r.json()["reason"] for r in (missing, wrong, malformed)] == ["missing", "invalid", "malformed"]
        assert missing.headers["www-authenticate"] == "Bearer"
        assert (await http.get("/api/agents")).status_code == 200
        assert (await http.post("/api/agents", json=AGENT, headers={"api-key": KEY})).status_code == 201
        assert (await http.patch("/api/agents/bakery", json={"greeting": "Hi!"},
                                 headers=bearer(OTHER_KEY))).status_code == 200
        assert (await http.delete("/api/agents/bakery")).status_code == 401
        assert (await http.post("/api/agents/default/chat", json={"message": "hi"})).status_code == 401
        assert (await http.post("/api/agents/default/knowledge", files={"file": ("a.txt", b"x")})).status_code == 401
        assert (await http.post("/api/transcriptions", files={"file": ("a.wav", b"x")})).status_code == 401
        assert (await http.delete("/api/agents/bakery", headers=bearer(KEY))).status_code == 204


async def test_a_foreign_origin_is_refused_even_with_a_key(keyed):
    async with httpx.AsyncClient(base_url=keyed.base_url) as http:
        foreign = await http.post("/api/agents", json=AGENT, headers={**bearer(KEY), "Origin": "https://evil.example"})
        listed = await http.post("/api/agents", json=AGENT, headers={**bearer(KEY), "Origin": "https://app.example"})
        # The server's own pages, reached by IP address, are always allowed.
        own = await http.put("/api/agents/bakery", json=AGENT,
                             headers={**bearer(KEY), "Origin": keyed.base_url})
    assert foreign.status_code == 403 and "allowed_origins" in foreign.json()["error"]
    assert (listed.status_code, own.status_code) == (201, 200)


async def test_a_domain_that_resolves_here_is_not_our_own_origin(keyed):
    # DNS rebinding: evil.example resolves to 127.0.0.1, and its page's Host and Origin agree.
    async with httpx.AsyncClient(base_url=keyed.base_url) as http:
        rebound = await http.post("/api/agents", json=AGENT, headers={
            **bearer(KEY), "Host": "evil.example:8000", "Origin": "http://evil.example:8000"})
    assert rebound.status_code == 403


# --- client tokens --------------------------------------------------------------------------------

async def test_client_secrets_are_minted_only_for_operator_keys(keyed):
    async with httpx.AsyncClient(base_url=keyed.base_url) as http:
        assert (await http.post("/v1/realtime/client_secrets")).status_code == 401
        minted = await http.post("/v1/realtime/client_secrets", headers=bearer(KEY),
                                 json={"expires_after": {"anchor": "created_at", "seconds": 30}})
        token = minted.json()["value"]
        assert minted.status_code == 200 and token.startswith("ek_")
        assert minted.headers["cache-control"] == "no-store"
        assert (await http.post("/v1/realtime/client_secrets", headers=bearer(token))).status_code == 401
        too_long = await http.post("/v1/realtime/client_secrets", headers=bearer(KEY),
                                   json={"expires_after": {"seconds": 100_000}})
        assert too_long.status_code == 400 and "lifetime" in too_long.json()["error"]
        assert (await http.post("/v1/realtime/client_secrets", headers=bearer(KEY),
                                content=b"{not json")).status_code == 400


async def test_the_openai_sdk_mints_a_client_secret(keyed):
    from openai import AsyncOpenAI

    client = AsyncOpenAI(api_key=KEY, base_url=f"{keyed.base_url}/v1")
    secret = await client.realtime.client_secrets.create(expires_after={"anchor": "created_at", "seconds": 60})
    assert secret.value.startswith("ek_") and secret.expires_at > 0


async def test_an_offer_needs_a_credential_and_a_token_opens_one_session_only(keyed):
    offer = json.dumps({"type": "offer", "sdp": "hello"})  # refused after admission: 400
    token = await mint(keyed.base_url)
    async with httpx.AsyncClient(base_url=keyed.base_url) as http:
        refused = await http.post("/api/offer", content=offer)
        assert refused.status_code == 401 and refused.json()["reason"] == "missing"
        first = await http.post("/api/offer", content=offer, headers=bearer(token))
        assert first.status_code == 400  # past access control, on to the (bad) offer
        again = await http.post("/api/offer", content=offer, headers=bearer(token))
        assert again.status_code == 401 and again.json()["reason"] == "reused"
        unknown = await http.post("/api/offer", content=offer, headers=bearer("ek_" + "x" * 43))
        assert unknown.json()["reason"] == "unknown"
        # The refused offer gave its session back: the key's one slot is free.
        assert keyed.app.state.gate.open_sessions("key-1") == 0


async def test_an_expired_token_is_refused(keyed):
    token = await mint(keyed.base_url, expires_after={"seconds": 0.05})
    await asyncio.sleep(0.1)  # real time: the server's clock is the wall clock
    async with httpx.AsyncClient(base_url=keyed.base_url) as http:
        expired = await http.post("/api/offer", content=b"{}", headers=bearer(token))
    assert expired.status_code == 401 and expired.json()["reason"] == "expired"


async def test_without_keys_the_page_mints_its_own_token(open_server):
    async with httpx.AsyncClient(base_url=open_server.base_url) as http:
        minted = await http.post("/v1/realtime/client_secrets")
        assert minted.status_code == 200
        offer = await http.post("/api/offer", content=b"{}", headers=bearer(minted.json()["value"]))
        assert offer.status_code == 400
        assert (await http.post("/api/agents", json=AGENT)).status_code == 201


# --- the phone socket: keys, session caps, Twilio signatures ------------------------------------

async def phone_call(ws_url: str, headers: dict[str, str]):
    ws = await websockets.connect(f"{ws_url}/ws/twilio", additional_headers=headers, open_timeout=5)
    await ws.send(json.dumps({"event": "connected"}))
    await ws.send(json.dumps(START))
    return ws


async def wait_until(condition, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.02)


async def test_the_session_cap_refuses_at_once_and_frees_when_a_call_ends(keyed):
    gate = keyed.app.state.gate
    with pytest.raises(websockets.InvalidStatus):  # no credential
        await websockets.connect(f"{keyed.ws_url}/ws/twilio", open_timeout=5)
    first = await phone_call(keyed.ws_url, bearer(KEY))
    await wait_until(lambda: keyed.app.state.manager.active_count == 1)
    # key-1 holds its one session: a second call on it is refused as soon as it starts (sockets
    # that never start hold no session: tests/reliability/test_admission.py).
    refused = await phone_call(keyed.ws_url, bearer(KEY))
    code, reason = await closed_with(refused)
    assert code == CLOSE_TRY_LATER and "limit of 1" in reason, reason
    other = await phone_call(keyed.ws_url, bearer(OTHER_KEY))  # another key has its own cap
    await wait_until(lambda: keyed.app.state.manager.active_count == 2)
    assert first.state is websockets.State.OPEN  # the refusal disturbed nothing
    await first.close()
    await other.close()
    await wait_until(lambda: gate.open_sessions("key-1") == 0 and keyed.app.state.manager.active_count == 0)
    again = await phone_call(keyed.ws_url, bearer(KEY))
    await wait_until(lambda: keyed.app.state.manager.active_count == 1)
    await again.close()


async def test_twilio_signed_sockets_are_admitted_and_bad_signatures_refused(keyed):
    url = f"{keyed.ws_url}/ws/twilio?region=eu"
    good = request_signature(TWILIO_TOKEN, url.replace("ws://", "wss://"))  # as dialled, behind TLS
    for wrong in (good[:-4] + "AAA=", request_signature("another-token", url), "",
                  request_signature(TWILIO_TOKEN, url.replace("eu", "us"))):
        with pytest.raises(websockets.InvalidStatus):
            await websockets.connect(url, open_timeout=5, additional_headers={"X-Twilio-Signature": wrong})
    signed = await websockets.connect(url, open_timeout=5, additional_headers={"X-Twilio-Signature": good})
    await signed.send(json.dumps({"event": "connected"}))
    await signed.send(json.dumps(START))
    await wait_until(lambda: keyed.app.state.manager.active_count == 1)
    await signed.close()


async def test_no_credential_reaches_the_log(keyed, log_lines):
    token = await mint(keyed.base_url)
    async with httpx.AsyncClient(base_url=keyed.base_url) as http:
        await http.post("/api/offer", content=b"{}", headers=bearer(token))
        await http.post("/api/offer", content=b"{}", headers=bearer(token))  # reused
        await http.post("/api/agents", json=AGENT, headers=bearer(KEY + "x"))
        await http.post("/api/agents", json=AGENT, headers={"api-key": KEY})
    text = "\n".join(log_lines)
    assert "access refused" in text and "client token minted" in text  # the log was captured
    for secret in (KEY, OTHER_KEY, token, token[3:], TWILIO_TOKEN):
        assert secret not in text
