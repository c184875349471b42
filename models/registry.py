"""Builds the engines a config names. Engines are imported lazily: a deployment that
uses a remote LLM never imports llama.cpp, and a GPL voice is only imported if chosen."""

from __future__ import annotations

from agent.config import CadenceConfig
from agent.errors import ConfigError
from models.base import ASREngine, EmbeddingEngine, LLMEngine, TTSEngine
from pipelines.voice import Engines


def build_asr(config: CadenceConfig) -> ASREngine:
    if config.asr.engine == "faster-whisper":
        from models.whisper_asr import WhisperASREngine

        return WhisperASREngine(config.asr)
    raise ConfigError(f"asr.engine {config.asr.engine!r} is unknown; known: faster-whisper")


def build_llm(config: CadenceConfig) -> LLMEngine:
    if config.llm.engine == "llama-cpp":
        from models.llama_cpp_llm import LlamaCppLLMEngine

        return LlamaCppLLMEngine(config.llm)
    raise ConfigError(f"llm.engine {config.llm.engine!r} is unknown; known: llama-cpp")


def build_tts(config: CadenceConfig) -> TTSEngine:
    if config.tts.engine == "piper":
        from models.piper_tts import PiperTTSEngine

        return PiperTTSEngine(config.tts)
    if config.tts.engine == "orpheus":
        from models.orpheus.build import build_orpheus

        fallback = None
        if config.tts.orpheus.fallback_to_piper:
            from models.piper_tts import PiperTTSEngine

            fallback = PiperTTSEngine(config.tts)
        return build_orpheus(config.tts.orpheus, fallback=fallback)
    raise ConfigError(f"tts.engine {config.tts.engine!r} is unknown; known: piper, orpheus")


def build_embedder(config: CadenceConfig) -> EmbeddingEngine:
    from models.embedding import build_embedder as build

    return build(config.knowledge.embedding)


def build_engines(config: CadenceConfig) -> Engines:
    return Engines(asr=build_asr(config), llm=build_llm(config), tts=build_tts(config),
                   embedder=build_embedder(config))


def load_and_warm(engines: Engines) -> None:
    """Blocking: loads every engine and runs one tiny inference on each."""
    for engine in engines.all():
        engine.load()
        engine.warm_up()
