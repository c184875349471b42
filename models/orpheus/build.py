"""Builds the Orpheus voice a config names, and the fallback that covers its failures."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from models.errors import ConfigError
from models.base import TTSEngine
from models.orpheus.codec import SnacCodec
from models.orpheus.decode_service import DecodeServiceConfig, SnacDecodeService
from models.orpheus.engine import OrpheusTTSEngine
from models.orpheus.options import OrpheusOptions
from models.orpheus.prompt import EMOTION_TAGS
from models.orpheus.snac_decoder import load_snac
from models.orpheus.token_source import OpenAICompletionsTokenSource, OrpheusSampling
from models.fallback_voice import FallbackTTSEngine

log = logging.getLogger(__name__)
BEGIN_OF_TEXT = 128000


def byte_tokenizer(text: str) -> list[int]:
    """The in-process source's tokenizer: Llama 3's BOS, then UTF-8 bytes (ids < 256)."""
    return [BEGIN_OF_TEXT, *text.encode("utf-8")]


def byte_detokenizer(ids: list[int]) -> str:
    return bytes(ids).decode("utf-8", errors="replace")


def hub_tokenizer(name: str) -> tuple[Callable[[str], list[int]], Callable[[list[int]], str]]:
    """(encode, decode) of Orpheus' tokenizer from the hub or a folder."""
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise ConfigError(f"tts.orpheus.tokenizer {name!r} needs transformers (pip install transformers)") from exc
    tokenizer = AutoTokenizer.from_pretrained(name)
    return (lambda text: tokenizer(text).input_ids), (lambda ids: tokenizer.decode(ids))


def build_orpheus(config: OrpheusOptions, *, fallback: TTSEngine | None = None,
                  codec_urls: Sequence[str] = ()) -> TTSEngine:
    """`codec_urls`: the codec worker's replicas (a deployment's codec worker); they win
    over `config.codec`."""
    tokenize, decode = (byte_tokenizer, byte_detokenizer) if config.tokenizer == "bytes" \
        else hub_tokenizer(config.tokenizer)
    if config.token_source == "in-process":
        from models.orpheus.tiny_llama import InProcessTokenSource

        source = InProcessTokenSource()
    elif config.token_source.startswith(("http://", "https://")):
        source = OpenAICompletionsTokenSource(config.token_source, config.model, prompt_format=config.prompt_format,
                                              decode=decode)
    else:
        raise ConfigError(f"tts.orpheus.token_source {config.token_source!r}: use in-process or an http(s) URL")
    engine = OrpheusTTSEngine(
        voice=config.voice, tokenize=tokenize, token_source=source,
        codec=codec_builder(config, codec_urls),
        sampling=OrpheusSampling(temperature=config.temperature, top_p=config.top_p,
                                 repetition_penalty=config.repetition_penalty, max_tokens=config.max_tokens),
    )
    return engine if fallback is None else FallbackTTSEngine(engine, fallback, fallback_text=without_emotion_tags,
                                                             first_audio_within_s=config.fallback_after_seconds)


def codec_builder(config: OrpheusOptions, urls: Sequence[str] = ()) -> Callable[[], SnacCodec]:
    """What the engine's load() calls: the decoder here, or a client of the codec worker."""
    if not urls and config.codec != "in-process":
        if not config.codec.startswith(("http://", "https://")):
            raise ConfigError(f"tts.orpheus.codec {config.codec!r}: use in-process or a codec worker's http(s) URL")
        urls = (config.codec,)
    if urls:
        from models.orpheus.remote_codec import RemoteSnacCodec

        return lambda: RemoteSnacCodec(urls).load()
    service = DecodeServiceConfig(max_batch=config.max_batch, batch_timeout_ms=config.batch_timeout_ms,
                                  compile=config.compile)
    return lambda: SnacDecodeService(load_snac(None if config.snac == "random" else config.snac,
                                               device=config.device), service)


def without_emotion_tags(text: str) -> str:
    """What the CPU voice can say of an Orpheus sentence: it would read `<laugh>` out loud."""
    for tag in EMOTION_TAGS:
        text = text.replace(tag, " ")
    return " ".join(text.split())
