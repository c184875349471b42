"""The OpenAI-compatible chat client: its pure parts here; against a real llama-server in
tests/test_llama_server.py."""

import pytest

from models.base import Sampling
from models.errors import ConfigError
from models.openai_chat import LLMServerError, OpenAIChatLLMEngine, OpenAIChatOptions, ServerSentEvents


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
    vllm = OpenAIChatLLMEngine(OpenAIChatOptions("http://x", dialect="vllm", use_priority=True, default_sampling=default))
    body = vllm.request_body(messages, max_tokens=8, sampling=None)
    assert body["repetition_penalty"] == 1.3 and "repeat_penalty" not in body and body["priority"] == 0
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
