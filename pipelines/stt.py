"""Speech-to-text as a pipecat service over our `ASREngine`.

The segment handed to the engine is the caller's turn as cut by the VAD. It already ends
in `stop_secs` of real silence, so no synthetic padding is added (pipecat's default
pads another 0.5 s, which Whisper then has to encode).
"""

from __future__ import annotations

import gzip
import logging
from collections.abc import AsyncGenerator

from pipecat.frames.frames import ErrorFrame, Frame, TranscriptionFrame
from pipecat.services.settings import STTSettings
from pipecat.services.stt_service import SegmentedSTTService
from pipecat.utils.time import time_now_iso8601

from agent.errors import CadenceError
from models.base import ASREngine, Transcript

log = logging.getLogger(__name__)

# Whisper's own hallucination guard: text that gzips this well is a repetition loop.
MAX_COMPRESSION_RATIO = 2.4
# Above this mean no-speech probability, short text is most likely noise read as words.
MAX_NO_SPEECH_PROBABILITY = 0.6
_PCM16_BYTES = 2


def compression_ratio(text: str) -> float:
    raw = text.encode("utf-8")
    return len(raw) / len(gzip.compress(raw)) if raw else 0.0


def is_plausible(transcript: Transcript) -> bool:
    """False for empty text, repetition loops and text over what was likely silence."""
    text = transcript.text.strip()
    if not text:
        return False
    if compression_ratio(text) > MAX_COMPRESSION_RATIO:
        return False
    if transcript.no_speech_probability is not None and transcript.no_speech_probability > MAX_NO_SPEECH_PROBABILITY:
        return len(text.split()) > 3  # long text is rarely invented from silence
    return True


class EngineSTTService(SegmentedSTTService):
    def __init__(self, engine: ASREngine, *, max_segment_seconds: float, **kwargs) -> None:
        super().__init__(
            sample_rate=engine.sample_rate,
            trailing_silence_secs=0.0,
            settings=STTSettings(model=None, language=None),
            **kwargs,
        )
        self._engine = engine
        self._max_segment_bytes = int(max_segment_seconds * engine.sample_rate) * _PCM16_BYTES

    @property
    def wants_wav_segments(self) -> bool:
        return False  # the engine reads raw 16-bit PCM

    def can_generate_metrics(self) -> bool:
        return True

    async def run_stt(self, audio: bytes) -> AsyncGenerator[Frame | None, None]:
        if len(audio) > self._max_segment_bytes:
            # Whisper sees 30 s at most; keep the end of the turn, which the reply is about.
            log.warning("caller turn of %.1f s cut to its last %.1f s", len(audio) / 2 / self.sample_rate,
                        self._max_segment_bytes / 2 / self.sample_rate)
            audio = audio[-self._max_segment_bytes :]
        await self.start_processing_metrics()
        try:
            transcript = await self._engine.transcribe(audio)
        except CadenceError as exc:
            yield ErrorFrame(error=f"speech recognition unavailable: {exc}")
            return
        finally:
            await self.stop_processing_metrics()
        if not is_plausible(transcript):
            log.debug("dropped implausible transcript (%d chars)", len(transcript.text))
            return
        yield TranscriptionFrame(transcript.text, self._user_id, time_now_iso8601(), finalized=True)
