"""How long recordings are cut and transcribed; `transcription` in the server's config."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SegmentingOptions:
    """Speech found by Silero VAD (32 ms frames), packed into segments Whisper takes whole."""

    threshold: float = 0.5  # a frame with speech probability above this is speech
    neg_threshold: float = 0.35  # ... and below this, silence (between: as the frame before)
    min_silence_s: float = 0.3  # a pause at least this long ends a stretch of speech
    pad_s: float = 0.2  # kept either side of a stretch, so no word's edge is lost
    max_segment_s: float = 30.0  # Whisper's window: a segment never runs longer
    # A stretch running into the maximum is cut at the quietest frame in its last part
    # (from this fraction of the maximum on), never at a fixed time inside a word.
    cut_search_from: float = 0.5
    min_speech_s: float = 0.1  # shorter stretches are noise

    def __post_init__(self) -> None:
        if not 0 < self.neg_threshold <= self.threshold < 1:
            raise ValueError("segmenting: 0 < neg_threshold <= threshold < 1")
        if not 1.0 <= self.max_segment_s <= 30.0:
            raise ValueError("segmenting: max_segment_s must be in [1, 30] (Whisper's window)")
        if min(self.min_silence_s, self.pad_s, self.min_speech_s) < 0 or not 0 < self.cut_search_from < 1:
            raise ValueError("segmenting: durations >= 0 and 0 < cut_search_from < 1")


@dataclass(frozen=True)
class TranscriptionOptions:
    model: str = "package:whisper-base"  # as asr.model: a packaged model, a folder or a hub id
    language: str | None = "en"  # None: detected per segment
    device: str = "cpu"
    compute_type: str = "int8"
    beam_size: int = 1
    workers: int = 2  # worker processes, each with its own Whisper
    threads_per_worker: int = 1  # CTranslate2 threads in each
    max_audio_seconds: float = 12 * 3600.0  # longer recordings are refused
    # Retries of a segment the hallucination guard rejects: sampling at these temperatures
    # first, then the segment cut in two at its quietest point (down to min_rechunk_s).
    retry_temperatures: tuple[float, ...] = (0.4, 0.8)
    min_rechunk_s: float = 4.0
    segmenting: SegmentingOptions = SegmentingOptions()

    def __post_init__(self) -> None:
        if self.workers < 1 or self.threads_per_worker < 1:
            raise ValueError("transcription: workers and threads_per_worker must be >= 1")
        if self.max_audio_seconds <= 0 or self.min_rechunk_s <= 0:
            raise ValueError("transcription: max_audio_seconds and min_rechunk_s must be > 0")
