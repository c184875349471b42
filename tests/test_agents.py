"""Agent definitions: parsing, validation that names the field, resolution against the
server's defaults, and YAML agent files."""

from dataclasses import replace
from pathlib import Path

import pytest

from agent.agent_registry import load_agent_files
from agent.agents import (AgentLimits, available_voices, check_against_server, merge_patch, parse_spec,
                          resolve)
from agent.config import AgentsConfig, CadenceConfig, LLMConfig
from agent.errors import ConfigError

LIMITS = AgentLimits(max_prompt_chars=200, max_greeting_chars=50)


def test_only_name_and_prompt_are_required_and_the_rest_comes_from_the_server():
    config = CadenceConfig()
    agent = resolve(parse_spec({"name": "front-desk", "system_prompt": "You book appointments."}, LIMITS), config)
    assert agent.name == "front-desk" and agent.greeting is None
    assert agent.sampling.temperature == config.llm.temperature
    assert agent.max_reply_sentences == config.llm.max_reply_sentences
    assert agent.voice == config.tts.voice
    assert agent.retrieval.top_k == config.retrieval.top_k
    assert agent.vad_stop_secs == config.vad.stop_secs


def test_an_agents_choices_win_over_the_defaults():
    spec = parse_spec({"name": "shop", "system_prompt": "p", "greeting": "Hello!",
                       "llm": {"temperature": 0.1, "max_reply_sentences": 3},
                       "knowledge": {"enabled": False, "top_k": 5}, "turn": {"vad_stop_secs": 0.6}}, LIMITS)
    agent = resolve(spec, CadenceConfig())
    assert (agent.greeting, agent.sampling.temperature, agent.max_reply_sentences) == ("Hello!", 0.1, 3)
    assert (agent.retrieval.enabled, agent.retrieval.top_k, agent.vad_stop_secs) == (False, 5, 0.6)


@pytest.mark.parametrize("data, message", [
    ({"system_prompt": "p"}, "agent.name: required"),
    ({"name": "a"}, "agent.system_prompt: required"),
    ({"name": "Bad Name", "system_prompt": "p"}, "agent.name must be"),
    ({"name": "-x", "system_prompt": "p"}, "agent.name must be"),
    ({"name": "a" * 65, "system_prompt": "p"}, "agent.name must be"),
    ({"name": "a", "system_prompt": "   "}, "system_prompt must not be empty"),
    ({"name": "a", "system_prompt": "x" * 201}, "system_prompt is 201 characters; the limit is 200"),
    ({"name": "a", "system_prompt": "p", "greeting": "x" * 51}, "greeting is longer than 50"),
    ({"name": "a", "system_prompt": "p", "colour": "red"}, "agent.colour: unknown key"),
    ({"name": "a", "system_prompt": "p", "llm": {"temprature": 1}}, "agent.llm.temprature: unknown key"),
    ({"name": "a", "system_prompt": "p", "llm": {"temperature": "hot"}}, "agent.llm.temperature"),
    ({"name": "a", "system_prompt": "p", "llm": {"temperature": 3}}, "llm.temperature must be in [0, 2]"),
    ({"name": "a", "system_prompt": "p", "llm": {"top_p": 0}}, "llm.top_p must be in (0, 1]"),
    ({"name": "a", "system_prompt": "p", "llm": {"max_reply_tokens": 0}}, "llm.max_reply_tokens"),
    ({"name": "a", "system_prompt": "p", "knowledge": {"top_k": 99}}, "knowledge.top_k must be in [1, 20]"),
    ({"name": "a", "system_prompt": "p", "turn": {"vad_stop_secs": 9}}, "turn.vad_stop_secs"),
    ({"name": 5, "system_prompt": "p"}, "agent.name: expected str"),
    (["not", "an", "object"], "agent must be a mapping"),
])
def test_bad_definitions_are_refused_naming_the_field(data, message):
    with pytest.raises(ConfigError) as error:
        parse_spec(data, LIMITS)
    assert message in str(error.value)


def test_voice_and_model_must_be_loaded_on_this_server():
    config = CadenceConfig()
    check_against_server(parse_spec({"name": "a", "system_prompt": "p", "voice": {"voice": config.tts.voice}},
                                    LIMITS), config)
    with pytest.raises(ConfigError, match="voice.voice 'nobody' is unknown"):
        check_against_server(parse_spec({"name": "a", "system_prompt": "p", "voice": {"voice": "nobody"}},
                                        LIMITS), config)
    with pytest.raises(ConfigError, match="voice.engine 'orpheus' is not loaded"):
        check_against_server(parse_spec({"name": "a", "system_prompt": "p", "voice": {"engine": "orpheus"}},
                                        LIMITS), config)
    with pytest.raises(ConfigError, match="llm.model 'gpt-9' is not loaded"):
        check_against_server(parse_spec({"name": "a", "system_prompt": "p", "llm": {"model": "gpt-9"}},
                                        LIMITS), config)


def test_orpheus_servers_offer_the_orpheus_voices():
    config = CadenceConfig()
    orpheus = replace(config, tts=replace(config.tts, engine="orpheus"))
    assert "leah" in available_voices(orpheus)
    assert available_voices(config) == (config.tts.voice,)


def test_merge_patch_merges_objects_and_null_returns_to_the_default():
    stored = {"name": "a", "system_prompt": "p", "llm": {"temperature": 0.2, "top_p": 0.5}, "greeting": "hi"}
    patched = merge_patch(stored, {"llm": {"temperature": None, "max_reply_sentences": 1}, "greeting": None})
    assert patched == {"name": "a", "system_prompt": "p", "llm": {"top_p": 0.5, "max_reply_sentences": 1}}


def _agents_dir(tmp_path: Path, files: dict[str, str]) -> CadenceConfig:
    folder = tmp_path / "agents"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    return replace(CadenceConfig(), agents=AgentsConfig(dir=str(folder), default="default"))


def test_yaml_agents_load_with_their_knowledge_files(tmp_path):
    config = _agents_dir(tmp_path, {
        "default.yaml": "name: default\nsystem_prompt: Hi.\n",
        "clinic.yaml": "name: clinic\nsystem_prompt: You help callers.\nknowledge_files: ['../docs/*.md']\n",
    })
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "hours.md").write_text("# Hours\nOpen 9 to 5.\n")
    agents = load_agent_files(config)
    assert sorted(agents) == ["clinic", "default"]
    assert [p.name for p in agents["clinic"].knowledge_paths()] == ["hours.md"]


@pytest.mark.parametrize("files, message", [
    ({"default.yaml": "name: default\nsystem_prompt: Hi.\n", "bad.yaml": "name: bad\nsystem_prompt: p\nllm: {top_p: 7}\n"},
     "bad.yaml.llm.top_p must be in (0, 1]"),
    ({"default.yaml": "name: default\nsystem_prompt: Hi.\n", "bad.yaml": "name: [unclosed\n"}, "bad.yaml: cannot read agent"),
    ({"default.yaml": "name: default\nsystem_prompt: Hi.\n", "twin.yaml": "name: default\nsystem_prompt: p\n"},
     "agent 'default' is already defined"),
    ({"other.yaml": "name: other\nsystem_prompt: Hi.\n"}, "agents.default 'default' has no file"),
    ({"default.yaml": "name: default\nsystem_prompt: p\nknowledge_files: [missing.md]\n"},
     "knowledge_files entry 'missing.md' matches no file"),
    ({"default.yaml": "name: default\nsystem_prompt: p\nvoice: {voice: nobody}\n"}, "voice.voice 'nobody' is unknown"),
])
def test_a_bad_agent_file_stops_startup_naming_the_file_and_field(tmp_path, files, message):
    with pytest.raises(ConfigError) as error:
        load_agent_files(_agents_dir(tmp_path, files))
    assert message in str(error.value)


def test_the_shipped_agents_load(default_config):
    agents = load_agent_files(default_config)
    assert default_config.agents.default in agents
    assert agents["default"].knowledge_paths(), "the default agent ships its clinic knowledge"


def test_llm_defaults_cap_replies_at_two_sentences():
    assert LLMConfig().max_reply_sentences == 2


REMOTE = {"base_url": "wss://api.openai.com/v1/realtime", "model": "gpt-realtime", "api_key_env": "OPENAI_API_KEY"}


def test_a_speech_to_speech_agent_names_its_remote_and_the_variable_with_its_key():
    agent = resolve(parse_spec({"name": "s2s", "system_prompt": "p", "pipeline": "openai-realtime",
                                "speech_to_speech": REMOTE}, LIMITS), CadenceConfig())
    assert agent.pipeline == "openai-realtime"
    assert (agent.speech_to_speech.base_url, agent.speech_to_speech.model,
            agent.speech_to_speech.api_key_env) == (REMOTE["base_url"], "gpt-realtime", "OPENAI_API_KEY")
    cascade = resolve(parse_spec({"name": "c", "system_prompt": "p", "speech_to_speech": REMOTE}, LIMITS),
                      CadenceConfig())
    assert cascade.pipeline == "cascade" and cascade.speech_to_speech is None


@pytest.mark.parametrize("change, message", [
    ({"pipeline": "telepathy"}, "pipeline must be one of cascade, openai-realtime"),
    ({"speech_to_speech": {**REMOTE, "base_url": "https://api.openai.com/v1/realtime"}}, "ws:// or wss://"),
    ({"speech_to_speech": {**REMOTE, "model": None}}, "speech_to_speech.model"),
    # An agent's author must not have the server send its own secrets to a URL of their choosing.
    ({"speech_to_speech": {**REMOTE, "api_key_env": "CADENCE_API_KEYS"}}, "api_key_env"),
    ({"speech_to_speech": {**REMOTE, "api_key_env": "CADENCE_REMOTE_API_KEY"}}, "api_key_env"),
    ({"speech_to_speech": {**REMOTE, "api_key_env": "TWILIO_AUTH_TOKEN"}}, "api_key_env"),
    ({"greeting": "Hi!"}, "greeting is not supported"),
])
def test_bad_speech_to_speech_agents_are_refused(change, message):
    data = {"name": "s2s", "system_prompt": "p", "pipeline": "openai-realtime", "speech_to_speech": REMOTE, **change}
    with pytest.raises(ConfigError, match=message):
        parse_spec(data, LIMITS)
