"""The OpenAI-compatible chat client: its pure parts and its connection handling (against a
small real HTTP server) here; against a real llama-server in tests/test_llama_server.py."""

import asyncio
import contextlib

import pytest

from models.base import Sampling
from models.errors import ConfigError, WorkerUnavailableError
from models.openai_chat import LLMServerError, OpenAIChatLLMEngine, OpenAIChatOptions, ServerSentEvents
from tests.fakes import LoopbackServer
from tests.test_worker_server import until


def test_events_cut_anywhere_come_out_whole():
    stream = (': ping\n\ndata: {"choices":[{"delta":{"content":"Hel"}}]}\n\n'
              'data: {"choices":[{"delta":{"content":"lo"}}]}\n\ndata: [DONE]\n\n')
    for cut in range(1, len(stream)):
        parser = ServerSentEvents()
        events = parser.feed(stream[:cut]) + parser.feed(stream[cut:])
        assert [e["choices"][0]["delta"]["content"] for e in events] == ["Hel", "lo"], cut
        assert parser.finished


def test_a_malformed_event_is_an_error_not_silence():
    with pytest.raises(LLMServerError, match="malformed"):
        ServerSentEvents().feed("data: {not json\n")


def test_each_dialect_gets_the_sampling_names_it_understands():
    messages = [{"role": "user", "content": "hi"}]
    agent = Sampling(temperature=0.2, repeat_penalty=1.1)
    default = Sampling(temperature=0.7, top_p=0.9, repeat_penalty=1.3)
    llama = OpenAIChatLLMEngine(OpenAIChatOptions("http://x", default_sampling=default))
    body = llama.request_body(messages, max_tokens=8, sampling=agent)
    assert body["temperature"] == 0.2 and body["top_p"] == 0.9 and body["repeat_penalty"] == 1.1
    assert body["cache_prompt"] is True and body["stream"] is True and "priority" not in body
    assert body["return_progress"] is True and llama.reports_prompt_progress
    vllm = OpenAIChatLLMEngine(OpenAIChatOptions("http://x", dialect="vllm", use_priority=True, default_sampling=default))
    body = vllm.request_body(messages, max_tokens=8, sampling=None)
    assert body["repetition_penalty"] == 1.3 and "repeat_penalty" not in body and body["priority"] == 0
    assert "return_progress" not in body and not vllm.reports_prompt_progress
    plain = OpenAIChatLLMEngine(OpenAIChatOptions("http://x", dialect="openai", default_sampling=default))
    assert "repeat_penalty" not in plain.request_body(messages, max_tokens=8, sampling=agent)


@pytest.mark.parametrize("bad", [dict(base_url="ftp://x"), dict(base_url="http://x", dialect="tgi"),
                                 dict(base_url="http://x", max_in_flight=0)])
def test_bad_options_are_refused(bad):
    with pytest.raises(ConfigError):
        OpenAIChatOptions(**bad)


def test_an_agents_sampling_keeps_its_own_settings_and_takes_the_rest_from_the_default():
    default = Sampling(temperature=0.7, top_p=0.9, repeat_penalty=1.3)
    assert Sampling(temperature=0.2).over(default) == Sampling(temperature=0.2, top_p=0.9, repeat_penalty=1.3)
    assert Sampling().over(default) == default


class _KeepAliveServer(LoopbackServer):
    """A real HTTP/1.1 server on loopback that answers `answered_per_connection` requests on
    each connection with a short streamed reply, then closes the connection on the next one
    without a word, as llama-server's close after a streamed reply meets a request sent in
    that instant."""

    REPLY = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n'

    def __init__(self, answered_per_connection: int, reply: bytes = REPLY) -> None:
        self.answered_per_connection = answered_per_connection
        self.reply = reply
        self.connections = 0
        self.requests = 0
        self.closed_by_client = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            for answered in range(self.answered_per_connection + 1):
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                await reader.readexactly(length)
                self.requests += 1
                if answered == self.answered_per_connection:
                    break  # closed with the request unanswered
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(self.reply), self.reply))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed_by_client += 1
        finally:
            writer.close()


async def _reply(engine: OpenAIChatLLMEngine) -> str:
    return "".join([piece async for piece in engine.stream_chat([{"role": "user", "content": "hi"}], max_tokens=4)])


async def test_a_request_the_server_drops_on_a_stale_pooled_connection_is_sent_again_on_a_fresh_one():
    server = _KeepAliveServer(answered_per_connection=1)
    async with server as url:
        engine = OpenAIChatLLMEngine(OpenAIChatOptions(url, dialect="vllm"))  # keeps its connections
        try:
            assert await _reply(engine) == "hi"
            assert await _reply(engine) == "hi"  # its pooled connection drops it: sent again, answered
        finally:
            await engine.close()
    assert (server.requests, server.connections) == (3, 2)


async def test_no_connection_to_llama_server_is_kept_after_a_reply_and_other_servers_keep_theirs():
    for dialect, kept in (("llama-server", False), ("vllm", True)):
        server = _KeepAliveServer(answered_per_connection=2)
        async with server as url:
            engine = OpenAIChatLLMEngine(OpenAIChatOptions(url, dialect=dialect))
            try:
                assert await _reply(engine) == "hi"
                if not kept:  # the client hangs up once the reply is read
                    await until(lambda: server.closed_by_client == 1)
                assert await _reply(engine) == "hi"
                assert (server.requests, server.connections) == ((2, 1) if kept else (2, 2)), dialect
            finally:
                await engine.close()


async def test_replies_cancelled_at_any_step_leave_the_connection_pool_free():
    """A barge-in or a hang-up cancels a reply anywhere, even while its connection is being made
    (httpcore 1.0.9 then kept that connection's pool slot for good: tests/test_http_send.py)."""
    server = _KeepAliveServer(answered_per_connection=1)
    async with server as url:
        engine = OpenAIChatLLMEngine(OpenAIChatOptions(url, max_in_flight=2))
        try:
            for _ in range(10):
                for steps in range(30):
                    replying = asyncio.ensure_future(_reply(engine))
                    for _ in range(steps):
                        await asyncio.sleep(0)  # one step of the loop, not a timed wait
                    replying.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await replying
            assert await _reply(engine) == "hi"
        finally:
            await engine.close()


async def test_a_server_that_drops_every_request_fails_it_after_one_resend():
    server = _KeepAliveServer(answered_per_connection=0)
    async with server as url:
        engine = OpenAIChatLLMEngine(OpenAIChatOptions(url))
        try:
            with pytest.raises(WorkerUnavailableError, match="RemoteProtocolError"):
                await _reply(engine)
        finally:
            await engine.close()
    assert server.requests == 2


def _progress(processed: int) -> bytes:
    """llama-server's progress event through a 1,200-token prompt (its shape, from its server-task.cpp)."""
    return (b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null}}],'
            b'"prompt_progress":{"total":1200,"cache":0,"processed":%d,"time_ms":5}}\n\n' % processed)


async def test_the_servers_progress_through_the_prompt_comes_out_as_empty_pieces_before_the_text():
    reply = _progress(0) + _progress(512) + _progress(1024) + _progress(1200) + _KeepAliveServer.REPLY
    async with _KeepAliveServer(answered_per_connection=1, reply=reply) as url:
        engine = OpenAIChatLLMEngine(OpenAIChatOptions(url))
        try:
            pieces = [p async for p in engine.stream_chat([{"role": "user", "content": "hi"}], max_tokens=4)]
        finally:
            await engine.close()
    assert pieces == ["", "", "", "", "hi"]
    assert engine.batch_size == 1  # counted as generating from its first text, not its progress


async def test_a_warm_up_tells_of_each_report_of_progress_through_the_prompt():
    reply = _progress(0) + _progress(512) + _progress(1024) + _KeepAliveServer.REPLY
    reports = []
    async with _KeepAliveServer(answered_per_connection=1, reply=reply) as url:
        engine = OpenAIChatLLMEngine(OpenAIChatOptions(url))
        try:
            await engine.warm_prefix([{"role": "system", "content": "be brief"}], on_progress=lambda: reports.append(1))
        finally:
            await engine.close()
    assert len(reports) == 3
