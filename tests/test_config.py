from pathlib import Path

import pytest

from agent.config import CadenceConfig, IceServer, load_config
from agent.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_default_yaml_loads_and_uses_no_public_stun(default_config):
    assert default_config.server.ice_servers == ()
    assert default_config.asr.model.startswith("package:")
    assert default_config == load_config(Path(__file__).parent.parent / "configs" / "default.yaml")


def test_no_file_gives_the_dataclass_defaults():
    assert load_config(None) == CadenceConfig()


def test_ice_servers_for_operators(tmp_path):
    config = load_config(write(tmp_path, """
server:
  ice_servers:
    - urls: ["stun:stun.example.org:3478"]
    - urls: ["turn:turn.example.org:3478"]
      username: u
      credential: p
"""))
    assert config.server.ice_servers == (
        IceServer(urls=("stun:stun.example.org:3478",)),
        IceServer(urls=("turn:turn.example.org:3478",), username="u", credential="p"),
    )


@pytest.mark.parametrize("text, message", [
    ("servr: {}", "config.servr: unknown key; known: agents, asr"),
    ("server: {port: 'eighty'}", "config.server.port: expected int"),
    ("server: {port: 0}", "server.port must be 1..65535"),
    ("vad: {stop_secs: 10}", "vad.stop_secs"),
    ("limits: {max_user_turn_seconds: 45}", "max_user_turn_seconds"),
    ("server: {ice_servers: 'stun:x'}", "expected a list"),
    ("[1, 2]", "must be a mapping"),
    ("server: {port: true}", "expected int"),
    ("deadlines: {llm_first_token_seconds: 0}", "deadlines must be > 0"),
    ("deadlines: {llm_first_token_per_1k_prompt_chars: -1}", "llm_first_token_per_1k_prompt_chars may be 0"),
    ("deadlines: {tts_first_audio_seconds: 1.0}", "fallback_after_seconds must be > 0 and below"),
    ("tts: {max_run_chars: 10}", "tts.max_run_chars must be in [40, 1000]"),
])
def test_bad_config_is_rejected_with_a_clear_message(tmp_path, text, message):
    with pytest.raises(ConfigError, match=None) as info:
        load_config(write(tmp_path, text))
    assert message in str(info.value)


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "nope.yaml")


def test_cli_overrides_apply(tmp_path):
    config = load_config(write(tmp_path, "server: {port: 9000}"), server__port=9100, server__host="0.0.0.0")
    assert (config.server.host, config.server.port) == ("0.0.0.0", 9100)


def test_config_is_frozen():
    with pytest.raises(AttributeError):
        CadenceConfig().server.port = 1  # type: ignore[misc]


def test_each_call_gets_the_configs_own_settings_as_the_pipelines_options(tmp_path):
    from pipelines.options import PauseOptions, VADOptions

    config = load_config(write(tmp_path, """
vad: {confidence: 0.61, start_secs: 0.25, min_volume: 0.55}
turn_end: {enabled: false, eager_reply: false, incomplete_pause_s: 1.2}
server: {schedule: arrival}
limits: {max_user_turn_seconds: 20}
asr: {partial_every_s: 0.5}
deadlines: {asr_seconds: 2.5, asr_per_audio_second: 0.25, llm_first_token_seconds: 7, tts_first_audio_seconds: 4}
llm: {max_history_messages: 8}
retrieval: {timeout_ms: 300, warm_llm_on_guess: true}
"""))
    options = config.call_options()
    assert options.vad == VADOptions(confidence=0.61, start_secs=0.25, min_volume=0.55)
    assert options.pauses == PauseOptions(judged=False, eager_reply=False, limits=config.turn_end)
    assert options.pauses.limits.incomplete_pause_s == 1.2
    assert options.schedule_by_wanted is False and CadenceConfig().call_options().schedule_by_wanted is True
    assert (options.max_user_turn_seconds, options.partial_every_s, options.max_history_messages) == (20, 0.5, 8)
    assert options.transcript_deadline.seconds_for(10.0) == config.deadlines.asr_seconds_for(10.0) == 5.0
    assert (options.llm_stall_limits, options.tts_stall_limits) == (config.deadlines.llm, config.deadlines.tts)
    assert (options.retrieval_timeout_s, options.warm_llm_on_guess) == (0.3, True)
    assert options.orpheus_model is None  # the CPU voice
    orpheus = load_config(write(tmp_path, "tts: {engine: orpheus}")).call_options()
    assert orpheus.orpheus_model == CadenceConfig().tts.orpheus.model


def test_config_agents_and_deployments_share_one_loader_and_its_messages(tmp_path):
    from agent.agents import AgentSpec
    from models.config_loader import build_dataclass
    from workers.deployment import parse_deployment

    with pytest.raises(ConfigError, match=r"^config.servr, config.vda: unknown keys; known: agents, "):
        load_config(write(tmp_path, "servr: {}\nvda: {}\n"))
    with pytest.raises(ConfigError, match=r"^agent.name: expected str, got 5$"):
        build_dataclass(AgentSpec, {"name": 5, "system_prompt": "p"}, "agent")
    with pytest.raises(ConfigError, match=r"^workers.w.threads: expected int, got '2'$"):
        parse_deployment({"name": "d", "workers": {"w": {"engine": "vllm", "role": "llm", "threads": "2"}}}, "d.yaml")
    # A required field names itself, and what it wants where its field says.
    with pytest.raises(ConfigError, match=r"^workers.w.engine: required; one of llama-server, vllm"):
        parse_deployment({"name": "d", "workers": {"w": {"role": "llm"}}}, "d.yaml")
    # Unreadable files say which file and what it was meant to be.
    bad = write(tmp_path, "server: [unclosed\n")
    with pytest.raises(ConfigError, match=f"^{bad}: cannot read config: "):
        load_config(bad)
