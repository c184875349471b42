"""The LLM's context shared between an agent's prompt and the call's dialogue: a long prompt
shrinks the dialogue, one that leaves no room is refused when the agent is defined, and the
prompts a call then sends fit the context the engine was started with."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agent.agent_registry import load_agent_files
from agent.agents import AgentLimits, check_against_server, parse_spec, resolve
from agent.config import AgentsConfig, CadenceConfig
from agent.engine_factory import build_llm
from agent.errors import ConfigError
from agent.model_plane import endpoints_of
from pipelines.knowledge_context import Passage, with_references
from pipelines.llm import prompt_window
from pipelines.prompt_budget import CHARS_PER_TOKEN, MIN_DIALOGUE_CHARS, TEMPLATE_TOKENS, PromptBudget
from pipelines.reply import prompt_chars
from workers.deployment import load_deployment
from workers.placement import plan

LIMITS = AgentLimits(max_prompt_chars=20_000, max_greeting_chars=50)


def test_the_dialogue_gets_what_the_prompt_leaves_up_to_its_own_cap():
    budget = PromptBudget(context_tokens=2048, reply_tokens=64, passage_tokens=200)
    room = int((2048 - 64 - 200 - TEMPLATE_TOKENS) * CHARS_PER_TOKEN)
    assert budget.room_chars() == room
    assert budget.dialogue_chars("short prompt", 4000) == 4000  # a short prompt leaves the cap
    assert budget.dialogue_chars("x" * (room - 1000), 4000) == 1000
    assert budget.dialogue_chars("x" * (room + 5), 4000) == 0
    assert budget.max_prompt_chars() == room - MIN_DIALOGUE_CHARS


def test_a_prompt_that_leaves_no_room_is_refused_naming_the_most_it_may_hold():
    budget = PromptBudget(context_tokens=2048, reply_tokens=64, passage_tokens=200)
    assert budget.refusal("x" * budget.max_prompt_chars()) is None
    refusal = budget.refusal("x" * 7600)
    assert refusal.startswith("system_prompt is 7600 characters; with the LLM's context of 2048 tokens per call")
    assert f"at most {budget.max_prompt_chars()}" in refusal


def test_a_call_against_a_known_context_gets_the_dialogue_its_prompt_leaves():
    config = CadenceConfig()
    spec = parse_spec({"name": "long", "system_prompt": "x" * 8000}, LIMITS)
    unknown = resolve(spec, config)
    assert unknown.max_dialogue_chars == config.llm.max_dialogue_chars  # no context known: the config's cap
    agent = resolve(spec, config, llm_context_tokens=4096)
    expected = PromptBudget(4096, agent.max_reply_tokens, agent.retrieval.max_tokens).dialogue_chars("x" * 8000, 4000)
    assert agent.max_dialogue_chars == expected < config.llm.max_dialogue_chars
    no_knowledge = resolve(parse_spec({"name": "long", "system_prompt": "x" * 8000, "knowledge": {"enabled": False}},
                                      LIMITS), config, llm_context_tokens=4096)
    assert no_knowledge.max_dialogue_chars > agent.max_dialogue_chars  # no passages: more room for the dialogue


def test_the_server_refuses_an_agent_whose_prompt_does_not_fit_its_llm():
    config = CadenceConfig()
    spec = parse_spec({"name": "long", "system_prompt": "x" * 7600}, LIMITS)
    with pytest.raises(ConfigError, match=r"agent\.system_prompt is 7600 characters; with the LLM's context of 2048"):
        check_against_server(spec, config, llm_context_tokens=2048)
    check_against_server(spec, config, llm_context_tokens=4096)  # the default context holds it
    check_against_server(spec, config)  # context unknown (an engine that does not say): not checked
    relay = parse_spec({"name": "relay", "system_prompt": "x" * 7600, "pipeline": "openai-realtime",
                        "speech_to_speech": {"base_url": "ws://127.0.0.1:9/v1/realtime", "model": "m"}}, LIMITS)
    check_against_server(relay, config, llm_context_tokens=2048)  # its prompt goes to the remote model


def test_an_agent_file_too_long_for_the_context_stops_startup_naming_the_file(tmp_path):
    (tmp_path / "default.yaml").write_text("name: default\nsystem_prompt: " + "word " * 1600 + "\n")
    config = replace(CadenceConfig(), agents=AgentsConfig(dir=str(tmp_path)))
    with pytest.raises(ConfigError, match=r"default\.yaml\.system_prompt is \d+ characters"):
        load_agent_files(config, llm_context_tokens=2048)
    assert "default" in load_agent_files(config, llm_context_tokens=4096)


def test_the_longest_prompt_a_context_admits_still_fits_with_a_full_turn_and_passages():
    """What a call then sends: the agent's prompt at its limit, a dialogue at its share (a
    caller who talks on and on), the passages at their budget: the characters stay within
    the context at CHARS_PER_TOKEN, with the reply's tokens and the template's markup spare."""
    config = CadenceConfig()
    context = 4096
    limit = PromptBudget(context, config.llm.max_reply_tokens, config.retrieval.max_tokens).max_prompt_chars()
    agent = resolve(parse_spec({"name": "long", "system_prompt": "x" * limit}, LIMITS), config,
                    llm_context_tokens=context)
    dialogue = [{"role": "user" if i % 2 == 0 else "assistant", "content": "talk " * 400} for i in range(11)]
    window = prompt_window([{"role": "system", "content": agent.system_prompt}, *dialogue],
                           config.llm.max_history_messages, agent.max_dialogue_chars)
    words = int(config.retrieval.max_tokens / 1.3) - 1  # the passages' budget, by the retriever's own estimate
    passages = [Passage(text="fact " * words, source="notes.md", chunk_id=0, score=1.0)]
    request = with_references(window, passages)
    used_tokens = prompt_chars(request) / CHARS_PER_TOKEN
    assert used_tokens + config.llm.max_reply_tokens <= context, (prompt_chars(request), agent.max_dialogue_chars)


def test_the_llm_engine_says_its_context_in_process_and_from_its_deployment():
    config = CadenceConfig()
    assert build_llm(config).context_tokens == config.llm.context_tokens == 4096  # in-process llama.cpp
    deployment = load_deployment("configs/deployments/cpu-workers.yaml")
    placed = plan(deployment, (), find_binary=lambda name: f"/bin/{name}", resolve_model=lambda model: model)
    endpoint = endpoints_of(placed)["llm"]
    assert endpoint.context_tokens == 4096  # the deployment's context_tokens_per_stream
    assert build_llm(config, replace(endpoint, context_tokens=2048)).context_tokens == 2048
