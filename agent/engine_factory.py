"""Builds the engines a config names: in-process ones from its sections, or clients of the
workers its deployment places (see agent/model_plane.py). Engines are imported lazily: a
deployment that uses a remote LLM never starts a llama-server of its own, and a GPL voice is only
imported if chosen."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace

from agent.config import CadenceConfig
from agent.errors import ConfigError
from agent.model_plane import Endpoint
from models.base import ASREngine, EmbeddingEngine, Engine, LLMEngine, TTSEngine, TurnEndEngine
from pipelines.voice import Engines

log = logging.getLogger(__name__)

# Deployment engines that serve Orpheus as an OpenAI-compatible completions server.
ORPHEUS_TOKEN_SERVERS = ("vllm", "trtllm-serve", "llama-server")


def build_asr(config: CadenceConfig, endpoint: Endpoint | None = None) -> ASREngine:
    if endpoint is not None:
        from models.remote import RemoteASREngine, RemoteOptions

        if not config.asr.worker_fallback:
            return RemoteASREngine(endpoint.urls)
        from models.fallback_asr import FallbackASREngine

        worker = RemoteASREngine(endpoint.urls, options=RemoteOptions(wait_for_worker=False))
        return FallbackASREngine(worker, build_asr(config))
    if config.asr.engine == "faster-whisper":
        from models.whisper_asr import WhisperASREngine

        return WhisperASREngine(config.asr)
    raise ConfigError(f"asr.engine {config.asr.engine!r} is unknown; known: faster-whisper")


def build_llm(config: CadenceConfig, endpoint: Endpoint | None = None) -> LLMEngine:
    if endpoint is not None:
        from models.openai_chat import OpenAIChatLLMEngine, OpenAIChatOptions

        dialect = endpoint.engine if endpoint.engine in ("llama-server", "vllm", "trtllm-serve") else "openai"
        return OpenAIChatLLMEngine(OpenAIChatOptions(
            base_url=endpoint.urls[0], replica_urls=endpoint.urls[1:], model=endpoint.model or "default",
            dialect=dialect, default_sampling=config.llm.default_sampling, use_priority=dialect == "vllm",
            context_tokens=endpoint.context_tokens))
    if config.llm.engine in ("llama-server", "llama-cpp"):  # llama-cpp: the same engine's former name
        from workers.own_llama_server import OwnLlamaServerLLMEngine

        return OwnLlamaServerLLMEngine(config.llm)
    raise ConfigError(f"llm.engine {config.llm.engine!r} is unknown; known: llama-server")


def build_tts(config: CadenceConfig, endpoint: Endpoint | None = None, codec: Endpoint | None = None) -> TTSEngine:
    """`codec`: a SNAC codec worker; the Orpheus voice decodes there instead of in this
    process (its streams then batch with every other agent server's)."""
    codec_urls = codec.urls if codec is not None else ()
    if endpoint is not None and endpoint.engine in ORPHEUS_TOKEN_SERVERS:
        # Orpheus' audio tokens come from that server; SNAC decodes them here or at the
        # codec worker, batched across calls.
        return _orpheus(config, token_source=f"{endpoint.urls[0]}/v1", model=endpoint.model, codec_urls=codec_urls)
    if codec is not None and config.tts.engine != "orpheus":
        raise ConfigError(f"the deployment has a codec worker ({codec.engine}) but the voice is {config.tts.engine}, "
                          "which does not use it: set tts.engine: orpheus, or drop the codec worker")
    if endpoint is not None:
        from models.remote import RemoteTTSEngine

        worker = RemoteTTSEngine(endpoint.urls)
        if not config.tts.worker_fallback:
            return worker
        from models.fallback_voice import FallbackTTSEngine
        from models.piper_tts import PiperTTSEngine

        return FallbackTTSEngine(worker, PiperTTSEngine(config.tts), first_audio_within_s=config.tts.fallback_after_seconds)
    if config.tts.engine == "piper":
        from models.piper_tts import PiperTTSEngine

        return PiperTTSEngine(config.tts)
    if config.tts.engine == "orpheus":
        return _orpheus(config, codec_urls=codec_urls)
    raise ConfigError(f"tts.engine {config.tts.engine!r} is unknown; known: piper, orpheus")


def _orpheus(config: CadenceConfig, *, token_source: str | None = None, model: str | None = None,
             codec_urls: tuple[str, ...] = ()) -> TTSEngine:
    from models.orpheus.build import build_orpheus

    options = config.tts.orpheus
    if token_source is not None:
        options = replace(options, token_source=token_source, model=model or options.model)
    fallback = None
    if options.fallback_to_piper:
        from models.piper_tts import PiperTTSEngine

        fallback = PiperTTSEngine(config.tts)
    return build_orpheus(options, fallback=fallback, codec_urls=codec_urls)


def build_embedder(config: CadenceConfig, endpoint: Endpoint | None = None) -> EmbeddingEngine:
    if endpoint is not None:
        from models.remote import RemoteEmbeddingEngine

        return RemoteEmbeddingEngine(endpoint.urls, config.knowledge.dimensions)
    from models.embedding import build_embedder as build

    return build(config.knowledge.embedding)


def build_turn_end(config: CadenceConfig) -> TurnEndEngine | None:
    """The voice's end-of-turn judge: always in-process (~40 ms on one core, no batching to gain)."""
    if not (config.turn_end.enabled and config.turn_end.voice_model):
        return None
    from models.smart_turn import SmartTurnEngine, SmartTurnOptions

    return SmartTurnEngine(SmartTurnOptions(model=config.turn_end.voice_model))


def build_engines(config: CadenceConfig, endpoints: Mapping[str, Endpoint] | None = None) -> Engines:
    """`endpoints`: role -> the worker serving it; roles not in it run in-process."""
    at = (endpoints or {}).get
    return Engines(asr=build_asr(config, at("asr")), llm=build_llm(config, at("llm")),
                   tts=build_tts(config, at("tts"), at("codec")), embedder=build_embedder(config, at("embedder")),
                   turn_end=build_turn_end(config))


async def close_engines(engines: Engines, *, timeout_s: float = 10.0) -> None:
    """Closes every engine (threads, clients, worker connections); one that fails or hangs is
    logged and does not keep the others open."""
    for engine in engines.all():
        try:
            await asyncio.wait_for(engine.close(), timeout_s)
        except Exception:
            log.exception("closing %s failed", type(engine).__name__)


def load_and_warm(engines: Engines, on_loaded: Callable[[Engine], None] = lambda engine: None) -> None:
    """Blocking: loads every engine and runs one tiny inference on each. `on_loaded` hears of
    each engine as it is ready (on this thread), so a health page can say which one is slow."""
    for engine in engines.all():
        engine.load()
        engine.warm_up()
        on_loaded(engine)
