"""A worker's replicas share the load: the replica policy (models/replicas.py) without I/O,
then the remote engines and the LLM client against several real servers on loopback (the
workers of tests/test_worker_server.py, and fake OpenAI chat servers), then the model plane
handing every replica's URL to the engines."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from agent import engine_factory
from agent.model_plane import Endpoint, model_plane_for
from models.errors import CapacityError, ConfigError, WorkerUnavailableError
from models.openai_chat import OpenAIChatLLMEngine, OpenAIChatOptions, conversation_key
from models.fallback_asr import FallbackASREngine
from models.remote import RemoteASREngine, RemoteEmbeddingEngine, RemoteOptions, RemoteTTSEngine, replica_urls
from models.replicas import ReplicaSet, stable_index
from tests.fakes_workers import GatedASR, GatedEmbedder, ScriptedTTS, fake_vector
from tests.test_worker_server import WAIT_S, _app, _listening_socket, serving, until

A, B, C = "http://a:1", "http://b:1", "http://c:1"
ROOT = Path(__file__).resolve().parent.parent


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- the policy, pure -------------------------------------------------------------------------

def test_a_request_goes_to_the_replica_with_the_fewest_in_flight():
    replicas = ReplicaSet([A, B, C])
    for url in (A, A, B):
        replicas.started(url)
    assert replicas.pick() == C
    replicas.started(C)
    assert replicas.pick() == B  # A has 2, B and C 1: B is next after C in the round
    replicas.finished(A)
    replicas.finished(A)
    assert replicas.pick() == A
    assert replicas.in_flight == 2 and replicas.in_flight_at(B) == 1


def test_equally_loaded_replicas_take_turns():
    replicas = ReplicaSet([A, B, C])
    assert [replicas.pick() for _ in range(7)] == [A, B, C, A, B, C, A]


def test_a_replica_that_refused_cools_off_then_comes_back():
    clock = FakeClock()
    replicas = ReplicaSet([A, B], cool_off_s=2.0, clock=clock)
    replicas.mark_down(A)
    assert [replicas.pick() for _ in range(3)] == [B, B, B]
    assert replicas.alternative(B) is None  # A is cooling off: no one to retry on
    clock.now += 1.999
    assert replicas.is_down(A) and replicas.pick() == B
    clock.now += 0.001
    assert not replicas.is_down(A)
    assert replicas.alternative(B) == A
    assert {replicas.pick(), replicas.pick()} == {A, B}


def test_a_longer_pass_over_is_not_cut_short_by_a_refusal_and_says_why_while_it_lasts():
    clock = FakeClock()
    replicas = ReplicaSet([A, B], cool_off_s=2.0, clock=clock)
    replicas.mark_down(A, for_s=30.0, why="went silent past a reply's deadline")
    replicas.mark_down(A)  # refused since: 2 s from now would end the 30 s early
    clock.now += 29.9
    assert replicas.states()[0] == {"url": A, "in_flight": 0, "cooling_off": True,
                                    "why": "went silent past a reply's deadline"}
    assert replicas.pick() == B
    clock.now += 0.1
    assert replicas.states()[0]["why"] is None and not replicas.is_down(A)
    replicas.mark_down(A)
    assert replicas.states()[0]["why"] == "refused a connection"
    replicas.mark_down(A, for_s=30.0, why="went silent")
    replicas.mark_up(A)  # heard from again
    assert not replicas.is_down(A) and replicas.states()[0]["why"] is None


def test_when_every_replica_cools_off_the_least_loaded_is_still_tried():
    clock = FakeClock()
    replicas = ReplicaSet([A, B], clock=clock)
    replicas.mark_down(A)
    replicas.mark_down(B)
    replicas.started(A)
    assert replicas.pick() == B
    alone = ReplicaSet([A], clock=clock)
    alone.mark_down(A)
    assert alone.pick() == A and alone.alternative(A) is None


def test_a_conversation_stays_home_unless_home_is_down_or_busier_than_its_share():
    clock = FakeClock()
    replicas = ReplicaSet([A, B, C], clock=clock)
    key = "conversation 1"
    home = replicas.pick_for(key, busy_at=2)
    assert [replicas.pick_for(key, busy_at=2) for _ in range(5)] == [home] * 5
    others = [url for url in (A, B, C) if url != home]
    replicas.started(home)
    assert replicas.pick_for(key, busy_at=2) == home  # below its share
    replicas.started(home)
    assert replicas.pick_for(key, busy_at=2) in others  # at its share while the others are idle
    for url in others:
        replicas.started(url)
        replicas.started(url)
    assert replicas.pick_for(key, busy_at=2) == home  # busy, but nobody has fewer
    replicas.mark_down(home)
    assert replicas.pick_for(key, busy_at=2) in others


def test_different_conversations_spread_over_the_replicas():
    replicas = ReplicaSet([A, B, C])
    homes = [replicas.pick_for(f"conversation {i}", busy_at=10) for i in range(60)]
    assert {url: homes.count(url) > 10 for url in (A, B, C)} == {A: True, B: True, C: True}


def test_the_home_of_a_key_is_the_same_in_every_process():
    script = "from models.replicas import stable_index; print([stable_index(f'k{i}', 7) for i in range(20)])"
    runs = [subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")]
    assert runs[0] == runs[1] == f"{[stable_index(f'k{i}', 7) for i in range(20)]}\n"


def test_replica_urls_are_checked():
    assert replica_urls("http://a:1/", "asr") == ("http://a:1",)
    assert replica_urls([A, B], "asr") == (A, B)
    for bad, words in [([], "at least one"), ([A, A + "/"], "repeat"), (["a:1"], "http://")]:
        with pytest.raises(ConfigError, match=words):
            replica_urls(bad, "asr")
    with pytest.raises(ConfigError, match="repeat"):
        OpenAIChatOptions(A, replica_urls=(B, A))
    with pytest.raises(ConfigError, match="http://"):
        OpenAIChatOptions(A, replica_urls=("b:1",))
    assert OpenAIChatOptions(A, replica_urls=(B,)).urls == (A, B)


# --- remote engines over two real workers -----------------------------------------------------

async def test_concurrent_transcriptions_split_over_both_replicas(default_config):
    first, second = GatedASR(), GatedASR()
    first.gate.clear()
    second.gate.clear()
    async with serving(_app(first, "asr")) as url_1, serving(_app(second, "asr")) as url_2:
        remote = engine_factory.build_asr(default_config, Endpoint("asr", "faster-whisper", (url_1, url_2), None, 8))
        await asyncio.to_thread(remote.load)  # both ready and serving asr
        calls = [asyncio.create_task(remote.transcribe(b"\x00\x01" * n)) for n in (1, 2, 3, 4)]
        await until(lambda: len(first.prompts) + len(second.prompts) == 4)
        assert (len(first.prompts), len(second.prompts), remote.queue_depth) == (2, 2, 4)
        first.gate.set()
        second.gate.set()
        assert [t.text for t in await asyncio.gather(*calls)] == ["1 samples", "2 samples", "3 samples", "4 samples"]
        assert remote.queue_depth == 0
        await remote.close()


class BrokenASR(GatedASR):
    def load(self) -> None:
        raise OSError("weights missing")


async def test_load_checks_every_replica_and_names_the_one_that_fails():
    broken = _app(BrokenASR(), "asr", loaded=False, on_load_failure=lambda exc: None)
    async with serving(_app(GatedASR(), "asr")) as asr_url, serving(_app(ScriptedTTS(), "tts")) as tts_url, \
            serving(broken) as broken_url:
        wrong_role = RemoteASREngine([asr_url, tts_url])
        with pytest.raises(ConfigError, match=f"worker at {tts_url} serves 'tts'"):
            await asyncio.to_thread(wrong_role.load)
        not_ready = RemoteASREngine([asr_url, broken_url])
        with pytest.raises(WorkerUnavailableError, match=f"worker at {broken_url} is not ready"):
            await asyncio.to_thread(not_ready.load)
        for remote in (wrong_role, not_ready):
            await remote.close()


async def test_a_stopped_replica_is_skipped_and_its_requests_go_to_the_other():
    stopped, alive = GatedASR(), GatedASR()
    async with serving(_app(alive, "asr")) as alive_url:
        async with serving(_app(stopped, "asr")) as stopped_url:
            remote = RemoteASREngine([stopped_url, alive_url])
            await asyncio.gather(*(remote.transcribe(b"\x00\x01") for _ in range(2)))  # a connection to each
            assert (len(stopped.prompts), len(alive.prompts)) == (1, 1)
        # The first of these picks the stopped replica (its turn), is refused, and goes on to the other.
        texts = [(await remote.transcribe(b"\x00\x01" * n)).text for n in (1, 2, 3)]
        assert texts == ["1 samples", "2 samples", "3 samples"]
        assert (len(stopped.prompts), len(alive.prompts)) == (1, 4)
        assert remote._client.replicas.is_down(stopped_url) and remote.queue_depth == 0
        await remote.close()


async def test_a_synthesis_and_a_blocking_embedding_go_to_the_replica_that_is_up():
    tts, embedder = ScriptedTTS([b"\x01\x02"]), GatedEmbedder(dimensions=4)
    embedder.load()
    async with serving(_app(tts, "tts")) as tts_url, serving(_app(embedder, "embedder")) as embed_url:
        async with serving(_app(ScriptedTTS(), "tts")) as gone_tts, \
                serving(_app(GatedEmbedder(), "embedder")) as gone_embed:
            pass  # served once, stopped: their ports now refuse connections
        speaker = RemoteTTSEngine([gone_tts, tts_url], sample_rate=ScriptedTTS.sample_rate)
        assert [chunk async for chunk in speaker.synthesize("Hello.")] == [b"\x01\x02"]
        indexer = RemoteEmbeddingEngine([gone_embed, embed_url], 4)
        vectors = await asyncio.to_thread(indexer.embed_blocking, ["a text"])
        np.testing.assert_array_equal(vectors, fake_vector("a text", 4)[None, :])
        assert embedder.calls == [["a text"]]
        for remote in (speaker, indexer):
            await remote.close()


async def test_a_full_replica_passes_the_request_to_the_other_once():
    full, free = GatedASR(), GatedASR()
    full.gate.clear()
    async with serving(_app(full, "asr", max_in_flight=1)) as full_url, \
            serving(_app(free, "asr", max_in_flight=1)) as free_url, httpx.AsyncClient(base_url=full_url) as http:
        held = asyncio.create_task(http.post("/v1/transcribe", content=b"\x00\x01"))  # someone else's request
        await asyncio.wait_for(full.entered.wait(), WAIT_S)
        remote = RemoteASREngine([full_url, free_url])  # its first pick is full_url
        assert (await remote.transcribe(b"\x00\x01" * 5)).text == "5 samples"
        assert free.prompts == [None] and not remote._client.replicas.is_down(full_url)
        free.gate.clear()
        also_held = asyncio.create_task(remote.transcribe(b"\x00\x01"))  # now both are full
        await until(lambda: len(free.prompts) == 2)
        with pytest.raises(CapacityError, match="in flight"):
            await remote.transcribe(b"\x00\x01")
        full.gate.set()
        free.gate.set()
        assert (await held).status_code == 200 and (await also_held).text == "1 samples"
        await remote.close()


# --- a replica that goes silent (stopped, wedged): it still accepts connections -----------------

PROBING = RemoteOptions(probe_after_s=0.05, probe_timeout_s=0.1, read_timeout_s=60.0)  # the read timeout never decides


@contextlib.contextmanager
def silent_worker():
    """A port whose connections the kernel accepts and no process ever answers, as a SIGSTOPped
    worker's: a request to it (and its /healthz) waits for ever."""
    sock = _listening_socket()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


class CountingProbes:
    """An ASGI app that counts the /healthz probes it is sent."""

    def __init__(self, app) -> None:
        self.app, self.probes = app, 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] == "/healthz":
            self.probes += 1
        await self.app(scope, receive, send)


async def test_a_request_to_a_silent_replica_is_sent_to_the_other_and_later_ones_pass_it_over():
    alive = GatedASR()
    with silent_worker() as silent_url:
        async with serving(_app(alive, "asr")) as alive_url:
            remote = RemoteASREngine([silent_url, alive_url], options=PROBING)  # its first pick is the silent one
            try:
                async with asyncio.timeout(WAIT_S):  # without the probe: the 60 s read timeout
                    assert (await remote.transcribe(b"\x00\x01" * 2)).text == "2 samples"
                    assert (await remote.transcribe(b"\x00\x01" * 3)).text == "3 samples"
                assert len(alive.prompts) == 2 and remote.queue_depth == 0
                states = remote.health()["replicas"]
                assert states[0]["cooling_off"] and "went silent" in states[0]["why"] and not states[1]["cooling_off"]
            finally:
                await remote.close()


async def test_a_synthesis_meeting_a_silent_replica_is_spoken_by_the_other():
    with silent_worker() as silent_url:
        async with serving(_app(ScriptedTTS([b"\x01\x02"]), "tts")) as tts_url:
            speaker = RemoteTTSEngine([silent_url, tts_url], sample_rate=ScriptedTTS.sample_rate, options=PROBING)
            try:
                async with asyncio.timeout(WAIT_S):
                    assert [chunk async for chunk in speaker.synthesize("Hello.")] == [b"\x01\x02"]
            finally:
                await speaker.close()


async def test_a_transcript_whose_only_worker_went_silent_is_made_in_process_before_any_deadline():
    in_process = GatedASR()
    with silent_worker() as silent_url:
        asr = FallbackASREngine(RemoteASREngine(silent_url, options=PROBING), in_process)
        try:
            async with asyncio.timeout(WAIT_S):
                assert (await asr.transcribe(b"\x00\x01" * 4)).text == "4 samples"
            assert asr.fallbacks == 1 and len(in_process.prompts) == 1
        finally:
            await asr.close()


async def test_a_busy_replica_that_answers_its_probes_is_waited_for():
    busy = GatedASR()
    busy.gate.clear()
    counting = CountingProbes(_app(busy, "asr"))
    async with serving(counting) as url:
        remote = RemoteASREngine(url, options=PROBING)
        try:
            asking = asyncio.create_task(remote.transcribe(b"\x00\x01"))
            await until(lambda: counting.probes >= 3)  # probed again while it waits, each answered
            busy.gate.set()
            assert (await asking).text == "1 samples"
            assert not remote._client.replicas.is_down(url)
        finally:
            await remote.close()


async def test_a_silent_replica_is_probed_at_once_by_the_next_request_and_used_again_once_it_answers():
    asr = GatedASR()
    with silent_worker() as url:
        remote = RemoteASREngine(url, options=PROBING)
        async with asyncio.timeout(WAIT_S):
            with pytest.raises(WorkerUnavailableError, match="went silent"):
                await remote.transcribe(b"\x00\x01")
    assert remote._client.replicas.is_down(url)
    port = int(url.rsplit(":", 1)[1])
    try:
        async with serving(_app(asr, "asr"), port=port):  # restarted on its port
            assert (await remote.transcribe(b"\x00\x01" * 2)).text == "2 samples"
            assert not remote._client.replicas.is_down(url) and remote.health()["replicas"][0]["why"] is None
    finally:
        await remote.close()


# --- the LLM over two chat servers ------------------------------------------------------------

class FakeChatServer:
    """An OpenAI chat server that streams its own name as the reply and records each prompt."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.prompts: list[list[dict]] = []
        self.app = Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"]),
                                     Route("/health", lambda request: JSONResponse({"status": "ok"}))])

    async def _chat(self, request: Request) -> StreamingResponse:
        self.prompts.append((await request.json())["messages"])

        async def events():
            yield f"data: {json.dumps({'choices': [{'delta': {'content': self.name}}]})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")


async def reply(engine: OpenAIChatLLMEngine, messages: list[dict]) -> str:
    return "".join([piece async for piece in engine.stream_chat(messages, max_tokens=8)])


def turn(conversation: list[dict], question: str, answer: str) -> list[dict]:
    return conversation + [{"role": "assistant", "content": answer}, {"role": "user", "content": question}]


async def test_a_conversation_keeps_its_replica_and_conversations_spread(default_config):
    servers = [FakeChatServer("one"), FakeChatServer("two")]
    async with serving(servers[0].app) as url_1, serving(servers[1].app) as url_2:
        engine = engine_factory.build_llm(default_config, Endpoint("llm", "llama-server", (url_1, url_2), None, 4))
        await asyncio.to_thread(engine.load)
        homes = {}
        for caller in range(8):
            conversation = [{"role": "system", "content": "You are a receptionist."},
                            {"role": "user", "content": f"Hello, this is caller {caller}."}]
            answers = []
            for question in ("When are you open?", "And on Sundays?"):
                answers.append(await reply(engine, conversation))
                conversation = turn(conversation, question, answers[-1])
            answers.append(await reply(engine, conversation))
            assert len(set(answers)) == 1, f"caller {caller} moved: {answers}"
            homes[caller] = answers[0]
        assert sorted(set(homes.values())) == ["one", "two"], homes
        assert len(servers[0].prompts) + len(servers[1].prompts) == 24 and engine.queue_depth == 0
        await engine.close()


async def test_a_reply_whose_replica_refuses_comes_from_the_other():
    servers = {"one": FakeChatServer("one"), "two": FakeChatServer("two")}
    async with contextlib.AsyncExitStack() as first, contextlib.AsyncExitStack() as second:
        urls = {"one": await first.enter_async_context(serving(servers["one"].app)),
                "two": await second.enter_async_context(serving(servers["two"].app))}
        engine = OpenAIChatLLMEngine(OpenAIChatOptions(urls["one"], replica_urls=(urls["two"],)))
        conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there."}]
        home = await reply(engine, conversation)
        other = "two" if home == "one" else "one"
        await (first if home == "one" else second).aclose()  # the home replica stops: its port refuses
        conversation = turn(conversation, "What time is it?", home)
        assert await reply(engine, conversation) == other
        assert len(servers[other].prompts) == 1 and servers[other].prompts[0][-1]["content"] == "What time is it?"
        with pytest.raises(WorkerUnavailableError, match=urls[home]):
            await asyncio.to_thread(engine.load)  # every replica must answer
        assert engine.queue_depth == 0
        await engine.close()


class HungChatServer:
    """Accepts a chat request and never answers it (a stopped or wedged server) until released."""

    def __init__(self) -> None:
        self.requests = 0
        self.release = asyncio.Event()
        self.app = Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"]),
                                     Route("/health", lambda request: JSONResponse({"status": "ok"}))])

    async def _chat(self, request: Request) -> JSONResponse:
        self.requests += 1
        await self.release.wait()
        return JSONResponse({"error": "released"}, status_code=500)


async def test_a_replica_that_goes_silent_past_a_replys_deadline_is_passed_over_by_later_replies():
    from models.errors import StalledError
    from models.stalls import StallLimits, without_stalls

    hung, healthy = HungChatServer(), FakeChatServer("healthy")
    async with serving(hung.app) as hung_url, serving(healthy.app) as healthy_url:
        engine = OpenAIChatLLMEngine(OpenAIChatOptions(hung_url, replica_urls=(healthy_url,), stall_cool_off_s=30.0))
        conversation = homed_at(0)  # the hung server is its home
        try:
            with pytest.raises(StalledError):
                async for _ in without_stalls(engine.stream_chat(conversation, max_tokens=8),
                                              StallLimits(0.2, 0.2), what="LLM reply"):
                    pass
            assert hung.requests == 1
            assert [r["why"] for r in engine.health()["replicas"]] == ["went silent past a reply's deadline", None]
            conversation = turn(conversation, "Are you there?", "")
            assert await reply(engine, conversation) == "healthy"  # its home is passed over
            assert hung.requests == 1 and engine.queue_depth == 0
        finally:
            hung.release.set()
            await engine.close()


def homed_at(index: int, count: int = 2, *, skip: int = 0) -> list[dict]:
    """A conversation whose home replica is `index` (the client's own hash); `skip` gives another."""
    found = (c for c in ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Caller {i} here."}]
                         for i in range(200)) if stable_index(conversation_key(c), count) == index)
    for _ in range(skip):
        next(found)
    return next(found)


async def test_a_reply_waiting_on_a_replica_another_reply_found_silent_is_sent_to_the_other():
    from models.base import PROMPT_PROGRESS
    from models.errors import StalledError
    from models.stalls import StallLimits, without_stalls

    hung, healthy = HungChatServer(), FakeChatServer("healthy")
    async with serving(hung.app) as hung_url, serving(healthy.app) as healthy_url:
        engine = OpenAIChatLLMEngine(OpenAIChatOptions(hung_url, replica_urls=(healthy_url,)))
        try:
            # The second reply has no deadline of its own: unmoved, it would wait on the hung server for good.
            waiting = asyncio.create_task(
                collect(engine.stream_chat(homed_at(0, skip=1), max_tokens=8)))
            await until(lambda: hung.requests == 1)
            with pytest.raises(StalledError):
                await collect(without_stalls(engine.stream_chat(homed_at(0), max_tokens=8), StallLimits(0.2),
                                             what="LLM reply"))
            async with asyncio.timeout(WAIT_S):
                assert await waiting == [PROMPT_PROGRESS, "healthy"]  # a fresh deadline, then the other's reply
            assert hung.requests == 2 and len(healthy.prompts) == 1 and engine.queue_depth == 0
            assert not engine._unanswered
        finally:
            hung.release.set()
            await engine.close()


async def test_a_reply_cancelled_while_it_waits_for_its_first_answer_withdraws_its_request():
    hung = HungChatServer()
    async with serving(hung.app) as url, serving(FakeChatServer("other").app) as other_url:
        engine = OpenAIChatLLMEngine(OpenAIChatOptions(url, replica_urls=(other_url,)))
        try:
            waiting = asyncio.create_task(collect(engine.stream_chat(homed_at(0), max_tokens=8)))
            await until(lambda: hung.requests == 1)
            waiting.cancel()  # a barge-in
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert engine.queue_depth == 0 and not engine._unanswered
            assert [r["cooling_off"] for r in engine.health()["replicas"]] == [False, False]  # not a stall
        finally:
            hung.release.set()
            await engine.close()


class DyingChatServer:
    """Streams `before` events, then its process dies: the connection drops mid-response."""

    def __init__(self, before: list[dict]) -> None:
        self.before, self.requests = before, 0
        self.app = Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"]),
                                     Route("/health", lambda request: JSONResponse({"status": "ok"}))])

    async def _chat(self, request: Request) -> StreamingResponse:
        self.requests += 1

        async def events():
            for event in self.before:
                yield f"data: {json.dumps(event)}\n\n"
            raise ConnectionResetError("killed")  # uvicorn drops the connection, the response unfinished

        return StreamingResponse(events(), media_type="text/event-stream")


PROGRESS_EVENT = {"choices": [{"index": 0, "delta": {}}], "prompt_progress": {"total": 900, "processed": 512}}


async def test_a_replica_that_dies_before_the_replys_first_words_has_the_reply_sent_to_another():
    from models.base import PROMPT_PROGRESS

    dying, healthy = DyingChatServer([PROGRESS_EVENT]), FakeChatServer("healthy")
    async with serving(dying.app) as dying_url, serving(healthy.app) as healthy_url:
        engine = OpenAIChatLLMEngine(OpenAIChatOptions(dying_url, replica_urls=(healthy_url,)))
        try:
            assert await collect(engine.stream_chat(homed_at(0), max_tokens=8)) == [
                PROMPT_PROGRESS, PROMPT_PROGRESS, "healthy"]  # its progress, the resend's fresh deadline, the reply
            assert dying.requests == 1 and len(healthy.prompts) == 1 and engine.queue_depth == 0
            assert [r["why"] for r in engine.health()["replicas"]] == ["failed mid-request", None]
        finally:
            await engine.close()


async def test_a_replica_that_dies_after_the_first_words_fails_the_reply_which_is_not_said_twice():
    words = {"choices": [{"index": 0, "delta": {"content": "We open"}}]}
    dying, healthy = DyingChatServer([words]), FakeChatServer("healthy")
    async with serving(dying.app) as dying_url, serving(healthy.app) as healthy_url:
        engine = OpenAIChatLLMEngine(OpenAIChatOptions(dying_url, replica_urls=(healthy_url,)))
        said = []
        try:
            with pytest.raises(WorkerUnavailableError, match="failed mid-request"):
                async for piece in engine.stream_chat(homed_at(0), max_tokens=8):
                    said.append(piece)
            assert said == ["We open"] and not healthy.prompts
        finally:
            await engine.close()


async def collect(stream) -> list[str]:
    try:
        return [piece async for piece in stream]
    finally:
        await stream.aclose()


# --- the model plane --------------------------------------------------------------------------

def test_the_model_plane_gives_an_endpoint_every_replicas_url(default_config, tmp_path):
    deployment = tmp_path / "replicated.yaml"
    deployment.write_text(yaml.safe_dump({"name": "replicated", "workers": {
        "embedder": {"engine": "minilm-onnx", "run": "process", "model": "package:all-minilm-l6-v2-int8",
                     "device": "cpu", "replicas": 2, "max_streams": 16},
        "llm": {"engine": "vllm", "run": "external", "url": "http://gpu-box:8000", "model": "org/model"}}}))
    plane = model_plane_for(replace(default_config, deployment=str(deployment)))
    embedder, llm = plane.endpoints["embedder"], plane.endpoints["llm"]
    assert embedder.urls == tuple(launch.base_url for launch in plane.plan.launches)
    assert len(set(embedder.urls)) == 2 and embedder.max_streams == 16
    assert llm.urls == ("http://gpu-box:8000",) and set(plane.endpoints) == {"embedder", "llm"}
    assert [w.launch.name for w in plane.supervisor.workers] == ["embedder-0", "embedder-1"]  # planned, not started
