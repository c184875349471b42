"""Whisper ASR on CTranslate2 (faster-whisper): the embedded CPU default.

Short live turns, so decoding is greedy with timestamps off: on 2 cores beam search
roughly doubles decode time for little accuracy on 2-6 s utterances. The previous
turn's text may be passed as `prompt` to keep names and spelling consistent.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from agent.config import ASRConfig
from models.assets import resolve_local
from models.base import ASREngine, Transcript
from models.runner import ModelRunner

log = logging.getLogger(__name__)

_PCM16_FULL_SCALE = 32768.0


def pcm16_to_float32(pcm16: bytes) -> np.ndarray:
    return np.frombuffer(pcm16, dtype=np.int16).astype(np.float32) / _PCM16_FULL_SCALE


class WhisperASREngine(ASREngine):
    sample_rate = 16_000

    def __init__(self, config: ASRConfig, *, max_waiting: int = 16) -> None:
        self._config = config
        self._model = None
        self._runner = ModelRunner("asr", max_waiting=max_waiting)

    @property
    def queue_depth(self) -> int:
        return self._runner.depth

    def load(self) -> None:
        from faster_whisper import WhisperModel

        local = resolve_local(self._config.model)
        source = str(local) if local is not None else self._config.model  # size name / HF id
        log.info("loading whisper from %s (%s, %s)", source, self._config.device, self._config.compute_type)
        self._model = WhisperModel(
            source,
            device=self._config.device,
            compute_type=self._config.compute_type,
            cpu_threads=self._config.cpu_threads,
            local_files_only=local is not None,
        )

    def warm_up(self) -> None:
        self._transcribe_blocking(bytes(self.sample_rate), None)  # 0.5 s of silence

    async def transcribe(self, pcm16: bytes, *, prompt: str | None = None) -> Transcript:
        return await self._runner.run(lambda: self._transcribe_blocking(pcm16, prompt))

    def _transcribe_blocking(self, pcm16: bytes, prompt: str | None) -> Transcript:
        if self._model is None:
            raise RuntimeError("WhisperASREngine.load() was not called")
        audio = pcm16_to_float32(pcm16)
        started = time.perf_counter()
        segments, info = self._model.transcribe(
            audio,
            language=self._config.language,
            beam_size=self._config.beam_size,
            initial_prompt=prompt or None,
            without_timestamps=True,
            condition_on_previous_text=False,
            vad_filter=False,  # the pipeline's Silero VAD already cut the utterance
        )
        segments = list(segments)  # the generator does the decoding
        text = " ".join(s.text.strip() for s in segments).strip()
        no_speech = float(np.mean([s.no_speech_prob for s in segments])) if segments else None
        return Transcript(
            text=text,
            audio_seconds=len(audio) / self.sample_rate,
            compute_seconds=time.perf_counter() - started,
            language=info.language,
            no_speech_probability=no_speech,
        )

    async def close(self) -> None:
        self._runner.shutdown()
        self._model = None
