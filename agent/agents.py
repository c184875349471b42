"""What an agent is: a developer's definition (`AgentSpec`), validated, and the concrete
`CallAgent` a call runs with once the server's defaults fill what the spec leaves out.

Pure: no I/O. Specs come from YAML files (`agent.agent_registry`) and from the HTTP API;
both go through `parse_spec`, so a bad field reads the same from either ("agent.llm.top_p:
expected a number"). Only `name` and `system_prompt` are required: every other field left
out (or null) means "the server's default", resolved when a call starts, so changing the
server's defaults reaches every agent that did not choose otherwise.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from agent.config import CadenceConfig
from agent.errors import ConfigError
from models.base import Sampling
from models.config_loader import build_dataclass
from pipelines.call_agent import PIPELINES, CallAgent, RetrievalSettings, SpeechToSpeechSettings
from pipelines.prompt_budget import PromptBudget

# URL-safe and stable: the name is the agent's id in URLs, in the store and on the dashboard.
NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
# Voices the Orpheus fine-tune was trained with; a fine-tune of one's own adds names via config.
ORPHEUS_VOICES = ("tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe")


@dataclass(frozen=True)
class VoiceChoice:
    engine: str | None = None  # "piper" or "orpheus"; must be the server's loaded TTS engine
    voice: str | None = None  # a voice that engine offers (see `available_voices`)


@dataclass(frozen=True)
class LLMChoice:
    model: str | None = None  # must name the server's loaded model (llm.model); null = that model
    temperature: float | None = None  # 0..2
    top_p: float | None = None  # (0, 1]
    repeat_penalty: float | None = None  # 1..2
    max_reply_tokens: int | None = None  # hard cap per reply, 1..1024
    max_reply_sentences: int | None = None  # stop after this many sentences; 0 = no sentence cap


@dataclass(frozen=True)
class KnowledgeChoice:
    enabled: bool | None = None  # retrieve passages from this agent's documents for every turn
    top_k: int | None = None  # passages retrieved per turn, 1..20
    max_tokens: int | None = None  # prompt tokens the passages may take together, 50..4000


@dataclass(frozen=True)
class TurnChoice:
    vad_stop_secs: float | None = None  # caller silence that ends a turn, 0.05..3 s
    speculate_after_secs: float | None = None  # silence before a speculative transcript; 0 = off
    idle_timeout_seconds: float | None = None  # hang up after this long with nobody speaking


@dataclass(frozen=True)
class SpeechToSpeechChoice:
    """For `pipeline: openai-realtime`: where the speech-to-speech model is."""

    base_url: str | None = None  # ws(s)://host/v1/realtime (OpenAI's, or any compatible server)
    model: str | None = None  # the model there (a Cadence server: the agent's name)
    # The environment variable holding that server's key (the key itself never goes in an agent).
    api_key_env: str | None = None


@dataclass(frozen=True)
class AgentSpec:
    name: str
    system_prompt: str
    greeting: str | None = None  # spoken when the call connects; null to wait for the caller
    voice: VoiceChoice = VoiceChoice()
    llm: LLMChoice = LLMChoice()
    knowledge: KnowledgeChoice = KnowledgeChoice()
    turn: TurnChoice = TurnChoice()
    # What answers the caller: "cascade" (Whisper -> LLM -> TTS here; the default) or
    # "openai-realtime" (a speech-to-speech model behind OpenAI's Realtime protocol).
    pipeline: str | None = None
    speech_to_speech: SpeechToSpeechChoice = SpeechToSpeechChoice()
    # YAML agents only: documents (paths relative to the YAML file) ingested at start.
    knowledge_files: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def parse_spec(data: Any, limits: "AgentLimits", *, where: str = "agent") -> AgentSpec:
    """A spec from JSON/YAML data; ConfigError names the bad field."""
    if isinstance(data, dict) and isinstance(data.get("knowledge_files"), str):
        data = {**data, "knowledge_files": [data["knowledge_files"]]}
    spec = build_dataclass(AgentSpec, data, where)
    _check_fields(spec, limits, where)
    return spec


@dataclass(frozen=True)
class AgentLimits:
    max_prompt_chars: int
    max_greeting_chars: int


def _check_fields(spec: AgentSpec, limits: AgentLimits, where: str) -> None:
    checks = [
        (NAME_PATTERN.fullmatch(spec.name) is not None,
         "name must be 1-64 characters of a-z, 0-9, '-' or '_', starting with a letter or digit"),
        (bool(spec.system_prompt.strip()), "system_prompt must not be empty"),
        (len(spec.system_prompt) <= limits.max_prompt_chars,
         f"system_prompt is {len(spec.system_prompt)} characters; the limit is {limits.max_prompt_chars}"),
        (spec.greeting is None or len(spec.greeting) <= limits.max_greeting_chars,
         f"greeting is longer than {limits.max_greeting_chars} characters"),
        (_in(spec.llm.temperature, 0.0, 2.0), "llm.temperature must be in [0, 2]"),
        (spec.llm.top_p is None or 0.0 < spec.llm.top_p <= 1.0, "llm.top_p must be in (0, 1]"),
        (_in(spec.llm.repeat_penalty, 1.0, 2.0), "llm.repeat_penalty must be in [1, 2]"),
        (_in(spec.llm.max_reply_tokens, 1, 1024), "llm.max_reply_tokens must be in [1, 1024]"),
        (_in(spec.llm.max_reply_sentences, 0, 20), "llm.max_reply_sentences must be in [0, 20]"),
        (_in(spec.knowledge.top_k, 1, 20), "knowledge.top_k must be in [1, 20]"),
        (_in(spec.knowledge.max_tokens, 50, 4000), "knowledge.max_tokens must be in [50, 4000]"),
        (_in(spec.turn.vad_stop_secs, 0.05, 3.0), "turn.vad_stop_secs must be in [0.05, 3]"),
        (_in(spec.turn.speculate_after_secs, 0.0, 3.0), "turn.speculate_after_secs must be in [0, 3]"),
        (_in(spec.turn.idle_timeout_seconds, 5.0, 3600.0), "turn.idle_timeout_seconds must be in [5, 3600]"),
    ]
    checks += _speech_to_speech_checks(spec)
    for ok, message in checks:
        if not ok:
            raise ConfigError(f"{where}.{message}")


# Only variables named like an API key may be read for a remote: an agent's author must not be
# able to have the server send, say, its own operator keys to a URL of their choosing.
API_KEY_ENV_PATTERN = re.compile(r"[A-Z][A-Z0-9_]{0,62}_API_KEY")


def _speech_to_speech_checks(spec: AgentSpec) -> list[tuple[bool, str]]:
    s2s, remote = spec.speech_to_speech, spec.pipeline == "openai-realtime"
    return [
        (spec.pipeline in (None, *PIPELINES), f"pipeline must be one of {', '.join(PIPELINES)}"),
        (not remote or (s2s.base_url or "").startswith(("ws://", "wss://")),
         "speech_to_speech.base_url must be a ws:// or wss:// URL (e.g. wss://api.openai.com/v1/realtime)"),
        (not remote or bool(s2s.model), "speech_to_speech.model must name the remote model"),
        (s2s.api_key_env is None or (API_KEY_ENV_PATTERN.fullmatch(s2s.api_key_env) is not None
                                     and not s2s.api_key_env.startswith("CADENCE_")),
         "speech_to_speech.api_key_env must be an environment variable named like OPENAI_API_KEY "
         "(capitals, ending in _API_KEY, not CADENCE_*)"),
        (not remote or spec.greeting is None, "greeting is not supported with pipeline openai-realtime yet"),
    ]


def _in(value: float | int | None, low: float, high: float) -> bool:
    return value is None or low <= value <= high


def available_voices(config: CadenceConfig) -> tuple[str, ...]:
    """The voices this server can speak with: one engine is loaded, with its voices."""
    if config.tts.engine == "orpheus":
        return ORPHEUS_VOICES if config.tts.orpheus.voice in ORPHEUS_VOICES else (config.tts.orpheus.voice, *ORPHEUS_VOICES)
    return (config.tts.voice,)  # a Piper voice is one model file: the loaded one


def default_voice(config: CadenceConfig) -> str:
    return config.tts.orpheus.voice if config.tts.engine == "orpheus" else config.tts.voice


def check_against_server(spec: AgentSpec, config: CadenceConfig, where: str = "agent", *,
                         llm_context_tokens: int | None = None) -> None:
    """The spec's voice and model must be ones this server has loaded, and its system prompt
    must leave the dialogue room in the LLM's context (`llm_context_tokens`; None: unknown)."""
    if spec.voice.engine is not None and spec.voice.engine != config.tts.engine:
        raise ConfigError(f"{where}.voice.engine {spec.voice.engine!r} is not loaded on this server; "
                          f"loaded: {config.tts.engine!r}")
    voices = available_voices(config)
    if spec.voice.voice is not None and spec.voice.voice not in voices:
        raise ConfigError(f"{where}.voice.voice {spec.voice.voice!r} is unknown; available: {list(voices)}")
    if spec.llm.model is not None and spec.llm.model != config.llm.model:
        raise ConfigError(f"{where}.llm.model {spec.llm.model!r} is not loaded on this server; "
                          f"loaded: {config.llm.model!r}")
    if llm_context_tokens is not None and spec.pipeline in (None, "cascade"):
        refusal = _prompt_budget(resolve(spec, config), llm_context_tokens).refusal(spec.system_prompt)
        if refusal:
            raise ConfigError(f"{where}.{refusal}")


def _prompt_budget(agent: CallAgent, llm_context_tokens: int) -> PromptBudget:
    return PromptBudget(context_tokens=llm_context_tokens, reply_tokens=agent.max_reply_tokens,
                        passage_tokens=agent.retrieval.max_tokens if agent.retrieval.enabled else 0)


def resolve(spec: AgentSpec, config: CadenceConfig, *, llm_context_tokens: int | None = None) -> CallAgent:
    """The agent a call runs with: the spec's choices, the server's defaults elsewhere. Its
    dialogue gets what its prompt leaves of `llm_context_tokens` (None: llm.max_dialogue_chars)."""
    llm, turn, knowledge = spec.llm, spec.turn, spec.knowledge
    defaults = config.retrieval
    agent = CallAgent(
        name=spec.name,
        system_prompt=spec.system_prompt,
        greeting=spec.greeting,
        tts_engine=config.tts.engine,
        voice=_pick(spec.voice.voice, default_voice(config)),
        llm_model=config.llm.model,
        sampling=Sampling(temperature=_pick(llm.temperature, config.llm.temperature),
                          top_p=_pick(llm.top_p, config.llm.top_p),
                          repeat_penalty=_pick(llm.repeat_penalty, config.llm.repeat_penalty)),
        max_reply_tokens=_pick(llm.max_reply_tokens, config.llm.max_reply_tokens),
        max_reply_sentences=_pick(llm.max_reply_sentences, config.llm.max_reply_sentences),
        retrieval=RetrievalSettings(enabled=_pick(knowledge.enabled, defaults.enabled),
                            top_k=_pick(knowledge.top_k, defaults.top_k),
                            max_tokens=_pick(knowledge.max_tokens, defaults.max_tokens)),
        vad_stop_secs=_pick(turn.vad_stop_secs, config.vad.stop_secs),
        speculate_after_secs=_pick(turn.speculate_after_secs, config.asr.speculate_after_secs),
        idle_timeout_seconds=_pick(turn.idle_timeout_seconds, config.limits.idle_timeout_seconds),
        max_dialogue_chars=config.llm.max_dialogue_chars,
        pipeline=_pick(spec.pipeline, "cascade"),
        speech_to_speech=SpeechToSpeechSettings(base_url=spec.speech_to_speech.base_url or "",
                                                model=spec.speech_to_speech.model or "",
                                                api_key_env=spec.speech_to_speech.api_key_env)
        if spec.pipeline == "openai-realtime" else None,
    )
    if llm_context_tokens is None:
        return agent
    budget = _prompt_budget(agent, llm_context_tokens)
    return dataclasses.replace(agent, max_dialogue_chars=budget.dialogue_chars(agent.system_prompt,
                                                                               config.llm.max_dialogue_chars))


def _pick(value, default):
    return default if value is None else value


def merge_patch(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """JSON Merge Patch (RFC 7386): objects merge, null removes a key (-> server default)."""
    result = dict(target)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merge_patch(result[key], value)
        else:
            result[key] = value
    return result


def compact(data: dict[str, Any]) -> dict[str, Any]:
    """The spec as its author wrote it: defaults (nulls, empty sections) left out."""
    out = {}
    for key, value in data.items():
        if isinstance(value, dict):
            value = compact(value)
        if value in (None, {}, (), []):
            continue
        out[key] = value
    return out
