"""Whisper ASR shared by every call: turns that arrive together are encoded and decoded as one batch.

This is the in-process engine's trimmed-window fast path (models/whisper_asr.py) run on a
batch: CTranslate2's `Whisper.generate` takes a batch of mel windows and a prompt per item.
Where the batch differs from one turn alone, honestly:
  - Every turn is encoded on the batch's window: the longest turn plus the padding. A short
    turn beside a long one gets more trailing silence than alone (Whisper's standard path
    pads every turn to 30 s, so this moves it towards the standard, not away).
  - CTranslate2 needs <|startoftranscript|> at the same position in every item, so a batch
    is decoded in groups of equal prompt length (one group when no turn has a prompt, which
    is how the pipeline calls today).
  - The token budget is per group, the largest of its turns'; a short turn beside a long one
    may run longer before a loop is cut, and the same loop check rejects it afterwards.
A result that looks wrong is redone on its own, as in-process: a sampled retry on the turn's
own window, then faster-whisper's full 30 s window. A turn too long for the trimmed window
(or `encoder_padding_seconds: 0`) goes to the full window directly, one at a time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from models.base import ASREngine, Transcript
from models.whisper_asr import (
    MAX_DECODE_TOKENS,
    MEL_FRAMES_PER_SECOND,
    RETRY_TEMPERATURE,
    WHISPER_WINDOW_SECONDS,
    FastResult,
    WhisperOptions,
    decode_token_budget,
    load_whisper,
    looks_right,
    pcm16_to_float32,
)
from workers.batcher import BatchedEngineLoad, BatchPolicy, DynamicBatcher

log = logging.getLogger(__name__)

# A turn's audio is ready when its caller stops speaking; 10 ms to gather other calls' turns
# is small beside the ~0.2 s decode, and a GPU decodes 8 turns in about the time of one.
DEFAULT_POLICY = BatchPolicy(max_batch=8, timeout_s=0.010, max_pending=32)
_WARM_UP_SECONDS = 0.5


@dataclass(frozen=True)
class _Turn:
    pcm16: bytes  # 16-bit mono PCM at 16 kHz
    prompt: str | None  # earlier text that conditions the decoder


class BatchedWhisperASR(BatchedEngineLoad, ASREngine):
    sample_rate = 16_000

    def __init__(self, options: WhisperOptions, policy: BatchPolicy = DEFAULT_POLICY, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> None:
        self._options = options
        self._model: Any = None
        self._tokenizer: Any = None
        self._batcher: DynamicBatcher[_Turn, Transcript] = DynamicBatcher(
            self._run_batch, **asdict(policy), name="asr", clock=clock, sleep=sleep)
        self.fast_path_retries = 0  # trimmed-window results redone by sampling
        self.fast_path_fallbacks = 0  # trimmed-window results redone on the full window

    def load(self) -> None:
        self._model, self._tokenizer = load_whisper(self._options)

    def warm_up(self) -> None:
        self._run_batch([_Turn(bytes(int(self.sample_rate * _WARM_UP_SECONDS) * 2), None)])

    async def transcribe(self, pcm16: bytes, *, prompt: str | None = None) -> Transcript:
        return await self._batcher.submit(_Turn(pcm16, prompt))

    def _run_batch(self, turns: list[_Turn]) -> list[Transcript]:
        """On the batcher's thread. compute_seconds is the batch's wall time until each result."""
        if self._model is None:
            raise RuntimeError("BatchedWhisperASR.load() was not called")
        started = time.perf_counter()
        audios = [pcm16_to_float32(turn.pcm16) for turn in turns]
        padding = self._options.encoder_padding_seconds
        trimmed = [i for i, audio in enumerate(audios)
                   if padding > 0 and self._seconds(audio) + padding < WHISPER_WINDOW_SECONDS]
        fast = dict(zip(trimmed, self._decode_trimmed([audios[i] for i in trimmed],
                                                      [turns[i].prompt for i in trimmed]))) if trimmed else {}
        transcripts = []
        for i, (turn, audio) in enumerate(zip(turns, audios)):
            text, no_speech = self._accept_or_redo(fast.get(i), audio, turn.prompt)
            transcripts.append(Transcript(text=text, audio_seconds=self._seconds(audio),
                                          compute_seconds=time.perf_counter() - started,
                                          language=self._options.language, no_speech_probability=no_speech))
        return transcripts

    def _accept_or_redo(self, fast: FastResult | None, audio: np.ndarray,
                        prompt: str | None) -> tuple[str, float | None]:
        """The in-process engine's checks, on one turn: retry by sampling, then the full window."""
        if fast is not None and not looks_right(fast) and fast.text:
            self.fast_path_retries += 1
            fast = self._decode_trimmed([audio], [prompt], temperature=RETRY_TEMPERATURE)[0]
        if fast is not None and not looks_right(fast):
            self.fast_path_fallbacks += 1
            fast = None
        if fast is not None:
            return fast.text, fast.no_speech_probability
        return self._decode_full_window(audio, prompt)

    def _decode_trimmed(self, audios: list[np.ndarray], prompts: list[str | None],
                        temperature: float = 0.0) -> list[FastResult]:
        import ctranslate2
        from faster_whisper.transcribe import get_suppressed_tokens

        seconds = [self._seconds(audio) for audio in audios]
        frames = int((max(seconds) + self._options.encoder_padding_seconds) * MEL_FRAMES_PER_SECOND)
        extractor = self._model.feature_extractor
        mels = np.stack([extractor(audio, padding=extractor.n_samples)[:, :frames] for audio in audios])
        prompt_tokens = [self._prompt_tokens(prompt) for prompt in prompts]
        groups: dict[int, list[int]] = {}
        for i, tokens in enumerate(prompt_tokens):
            groups.setdefault(len(tokens), []).append(i)
        results: list[FastResult | None] = [None] * len(audios)
        for length, members in groups.items():
            features = ctranslate2.StorageView.from_array(np.ascontiguousarray(mels[members], dtype=np.float32))
            decoded = self._model.model.generate(
                features, [prompt_tokens[i] for i in members],
                beam_size=1 if temperature > 0 else self._options.beam_size,
                max_length=length + max(decode_token_budget(seconds[i]) for i in members),  # includes the prompt
                return_scores=True, return_no_speech_prob=True, suppress_blank=True,
                suppress_tokens=get_suppressed_tokens(self._tokenizer, (-1,)),
                # topk 0 samples from the whole distribution; topk 1 (the default) is greedy.
                sampling_topk=0 if temperature > 0 else 1, sampling_temperature=temperature or 1.0,
            )
            for i, result in zip(members, decoded):
                ids = [t for t in result.sequences_ids[0] if t < self._tokenizer.eot]
                results[i] = FastResult(self._tokenizer.decode(ids).strip(), float(result.scores[0]),
                                         float(result.no_speech_prob))
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]

    def _prompt_tokens(self, prompt: str | None) -> list[int]:
        tokenizer = self._tokenizer
        tokens: list[int] = []
        if prompt:
            tokens = [tokenizer.sot_prev] + tokenizer.encode(" " + prompt.strip())[-(MAX_DECODE_TOKENS - 1):]
        return tokens + list(tokenizer.sot_sequence) + [tokenizer.no_timestamps]

    def _decode_full_window(self, audio: np.ndarray, prompt: str | None) -> tuple[str, float | None]:
        segments, _info = self._model.transcribe(
            audio, language=self._options.language, beam_size=self._options.beam_size,
            initial_prompt=prompt or None, without_timestamps=True, condition_on_previous_text=False,
            vad_filter=False,  # the pipeline's Silero VAD already cut the utterance
        )
        segments = list(segments)  # the generator does the decoding
        text = " ".join(s.text.strip() for s in segments).strip()
        no_speech = float(np.mean([s.no_speech_prob for s in segments])) if segments else None
        return text, no_speech

    def _seconds(self, audio: np.ndarray) -> float:
        return len(audio) / self.sample_rate

    async def close(self) -> None:
        await self._batcher.close()
        self._model = None
