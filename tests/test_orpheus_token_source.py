"""The OpenAI-compatible token source: its stream parser, and the client against a server process."""

import asyncio

import pytest

from models.orpheus.token_source import (
    CustomTokenParser,
    OpenAICompletionsTokenSource,
    OrpheusSampling,
    TokenSourceError,
    _choice_text,
)


def test_tags_split_across_chunks_are_joined():
    parser = CustomTokenParser()
    chunks = ["<custom_token_10>", "<custom_tok", "en_4106><cus", "tom_token_8202>", " <custom_token_2>"]
    ids = [i for chunk in chunks for i in parser.feed(chunk)]
    assert ids == [128266, 128256 + 4106, 128256 + 8202, 128258]
    assert parser.ignored_chars == 0


def test_stray_text_is_counted_not_turned_into_tokens():
    parser = CustomTokenParser()
    assert parser.feed("hello <custom_token_11> world") == [128267]
    assert parser.ignored_chars == len("hello") + len("world")
    assert parser.feed("a < b") == [] and parser.feed("c") == []  # a lone '<' that never becomes a tag
    assert parser.ignored_chars > 10


def test_request_carries_prompt_ids_and_orpheus_sampling():
    source = OpenAICompletionsTokenSource("http://h:1/v1/", "orpheus")
    body = source.request_body([128259, 1, 2], OrpheusSampling())
    assert body["prompt"] == [128259, 1, 2] and body["stream"] is True
    assert (body["temperature"], body["top_p"], body["repetition_penalty"]) == (0.6, 0.8, 1.1)
    assert body["stop_token_ids"] == [128258] and body["skip_special_tokens"] is False


def test_a_text_prompt_names_the_control_tokens_and_leaves_the_bos_to_the_server():
    from models.orpheus import prompt_ids
    from models.orpheus.build import byte_detokenizer, byte_tokenizer

    source = OpenAICompletionsTokenSource("http://h:1/v1", "orpheus", prompt_format="text", decode=byte_detokenizer)
    body = source.request_body(prompt_ids(byte_tokenizer, "tara", "Hi <laugh> there."), OrpheusSampling())
    assert body["prompt"] == ("<custom_token_3>tara: Hi <laugh> there.<|eot_id|>"
                              "<custom_token_4><custom_token_5><custom_token_1>")
    with pytest.raises(ValueError, match="decode"):
        OpenAICompletionsTokenSource("http://h:1/v1", "orpheus", prompt_format="text")
    with pytest.raises(ValueError, match="prompt_format"):
        OpenAICompletionsTokenSource("http://h:1/v1", "orpheus", prompt_format="chat")


@pytest.mark.parametrize("kwargs", [{"temperature": 0}, {"top_p": 1.5}, {"repetition_penalty": 0.9},
                                    {"max_tokens": 3}])
def test_out_of_range_sampling_is_refused(kwargs):
    with pytest.raises(ValueError):
        OrpheusSampling(**kwargs)


def test_a_malformed_stream_event_is_a_clear_error():
    assert _choice_text('{"choices": [{"text": "<custom_token_1>"}]}') == "<custom_token_1>"
    with pytest.raises(TokenSourceError, match="not a completions stream event"):
        _choice_text('{"error": "overloaded"}')


@pytest.fixture
def dev_server(tmp_path):
    """The Orpheus dev token server as a real process on a free loopback port."""
    import sys

    from latency_bench.servers import child, free_port

    url = f"http://127.0.0.1:{free_port()}"
    argv = [sys.executable, "-m", "latency_bench", "orpheus-dev-server", "--port", url.rsplit(":", 1)[1]]
    with child(argv, tmp_path / "server.log", url + "/v1/models", timeout_s=60):
        yield url


@pytest.mark.slow
async def test_tokens_stream_from_a_server_process_as_whole_frames(dev_server):
    from models.orpheus import FrameAssembler, prompt_ids
    from models.orpheus.build import byte_tokenizer

    source = OpenAICompletionsTokenSource(dev_server + "/v1", "orpheus-tiny-random")
    assembler = FrameAssembler()
    try:
        async for ids in source.stream(prompt_ids(byte_tokenizer, "tara", "Hello there, friend."), OrpheusSampling()):
            assembler.push(ids)
    finally:
        await source.close()
    assert assembler.frames > 5 and assembler.partial_tokens == 0
    assert not assembler.ended  # the server stops *at* end of speech (stop_token_ids), it never sends it


@pytest.mark.slow
async def test_closing_the_stream_aborts_the_generation_on_the_server(dev_server):
    import httpx

    from models.orpheus import prompt_ids
    from models.orpheus.build import byte_tokenizer

    source = OpenAICompletionsTokenSource(dev_server + "/v1", "orpheus-tiny-random")
    stream = source.stream(prompt_ids(byte_tokenizer, "tara", "A long sentence. " * 10), OrpheusSampling())
    await stream.__anext__()
    await stream.aclose()  # barge-in
    await source.close()
    async with httpx.AsyncClient(base_url=dev_server) as http:
        for _ in range(50):
            stats = (await http.get("/stats")).json()
            if stats["aborted"]:
                break
            await asyncio.sleep(0.1)
    assert stats == {"finished": 0, "aborted": 1}


@pytest.mark.slow
async def test_a_server_error_is_a_clear_token_source_error(dev_server):
    source = OpenAICompletionsTokenSource(dev_server + "/v1", "orpheus-tiny-random")
    with pytest.raises(TokenSourceError, match="answered 400"):
        async for _ in source.stream([999_999], OrpheusSampling()):
            pass
    await source.close()
    refused = OpenAICompletionsTokenSource("http://127.0.0.1:9/v1", "x", connect_timeout_s=1)
    with pytest.raises(TokenSourceError, match="failed"):
        async for _ in refused.stream([1], OrpheusSampling()):
            pass
    await refused.close()
