"""Speech-to-text as a pipecat service over our `ASREngine`.

The segment handed to the engine is the caller's turn as cut by the VAD. It already ends
in `stop_secs` of real silence, so no synthetic padding is added (pipecat's default
pads another 0.5 s, which Whisper then has to encode).

Speculative transcription: when the VAD reports that the caller paused (`speech_paused`),
the audio so far is transcribed at once, while the VAD is still waiting out `stop_secs`
to be sure the turn is over. If the turn does end with no more speech, that transcript is
used and the wait cost no ASR time; if the caller goes on, it is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from pipecat.frames.frames import (
    ErrorFrame,
    Frame,
    InputAudioRawFrame,
    SystemFrame,
    TranscriptionFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.settings import STTSettings
from pipecat.services.stt_service import SegmentedSTTService
from pipecat.utils.time import time_now_iso8601

from models.errors import CadenceError
from models.scheduling import wanted_in
from models.base import ASREngine, Transcript
from models.hallucination import MAX_COMPRESSION_RATIO, compression_ratio
from pipelines.retrieval import SpeculativeTranscriptFrame
from pipelines.speech_end import silent_tail_seconds

log = logging.getLogger(__name__)

# Above this mean no-speech probability, short text is most likely noise read as words.
MAX_NO_SPEECH_PROBABILITY = 0.6
_PCM16_BYTES = 2


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


@dataclass
class CallerSpeechEndFrame(SystemFrame):
    """The caller's turn ended; `last_voiced_at` is the wall-clock time of its last voiced audio."""

    last_voiced_at: float = 0.0


@dataclass
class _Speculation:
    audio_bytes: int  # how much of the turn's audio the speculative transcript covers
    task: asyncio.Task


class EngineSTTService(SegmentedSTTService):
    def __init__(self, engine: ASREngine, *, max_segment_seconds: float, clock=time.time,
                 speculation_lead_s: float | None = 0.0, **kwargs) -> None:
        """`speculation_lead_s`: when a guess made at a pause is wanted (the turn's end);
        None leaves guesses in arrival order with every other request."""
        super().__init__(
            sample_rate=engine.sample_rate,
            trailing_silence_secs=0.0,
            settings=STTSettings(model=None, language=None),
            **kwargs,
        )
        self._engine = engine
        self._max_segment_bytes = int(max_segment_seconds * engine.sample_rate) * _PCM16_BYTES
        self._clock = clock
        self._last_audio_at = 0.0  # when the newest buffered audio arrived
        self._speculation_lead_s = speculation_lead_s  # from a pause to the turn's end: VAD stop - speculation start
        self._speculation: _Speculation | None = None
        self.speculations_used = 0
        self.speculations_dropped = 0

    def speech_paused(self) -> None:
        """The caller went quiet mid-turn: start transcribing what we have."""
        if self._speculation is not None or not self._user_speaking or not self._audio_buffer:
            return
        audio = bytes(self._audio_buffer)
        task = self.create_task(self._speculate(self._fit(audio)), name="speculative-asr")
        # A dropped guess may have failed (engine busy); mark its error seen so asyncio does not
        # report it. A guess that is used re-raises its error where it is awaited.
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        self._speculation = _Speculation(audio_bytes=len(audio), task=task)

    async def _speculate(self, audio: bytes) -> Transcript:
        # Wanted when the pause would end the turn: a final transcript (another call's turn
        # that has ended) goes first if both wait for the engine.
        lead = self._speculation_lead_s
        with wanted_in(lead) if lead is not None else contextlib.nullcontext():
            transcript = await self._engine.transcribe(audio)
        if is_plausible(transcript):
            # Retrieval starts on the guess now, so its passages are ready when the turn ends.
            await self.push_frame(SpeculativeTranscriptFrame(text=transcript.text))
        return transcript

    def speech_resumed(self) -> None:
        """The caller went on talking: the speculative transcript is missing words."""
        self._drop_speculation()

    def _drop_speculation(self) -> None:
        if self._speculation is not None:
            self.speculations_dropped += 1
            self._speculation.task.cancel()  # the model thread finishes its run; the result is ignored
            self._speculation = None

    async def _handle_user_started_speaking(self, frame) -> None:
        self._drop_speculation()
        await super()._handle_user_started_speaking(frame)

    async def process_audio_frame(self, frame: InputAudioRawFrame, direction: FrameDirection) -> None:
        await super().process_audio_frame(frame, direction)
        self._last_audio_at = self._clock()  # STT is the first stage after the transport: ~arrival time

    async def _handle_user_stopped_speaking(self, frame: VADUserStoppedSpeakingFrame) -> None:
        await self.push_frame(CallerSpeechEndFrame(last_voiced_at=self._last_voiced_at(frame)))
        await super()._handle_user_stopped_speaking(frame)

    def _last_voiced_at(self, frame: VADUserStoppedSpeakingFrame) -> float:
        tail = silent_tail_seconds(bytes(self._audio_buffer), self.sample_rate) if self._audio_buffer else None
        if tail is None:  # nothing voiced in the buffer: fall back on the VAD's own estimate
            return frame.timestamp - frame.stop_secs
        return self._last_audio_at - tail

    async def cleanup(self) -> None:
        self._drop_speculation()
        await super().cleanup()

    def _fit(self, audio: bytes) -> bytes:
        if len(audio) > self._max_segment_bytes:
            # Whisper sees 30 s at most; keep the end of the turn, which the reply is about.
            log.warning("caller turn of %.1f s cut to its last %.1f s", len(audio) / 2 / self.sample_rate,
                        self._max_segment_bytes / 2 / self.sample_rate)
            return audio[-self._max_segment_bytes :]
        return audio

    async def _transcribe(self, audio: bytes) -> Transcript:
        speculation, self._speculation = self._speculation, None
        # Usable only if the turn's audio is what it saw plus silence: the VAD heard no
        # speech since the pause (else `speech_resumed` would have dropped it).
        if speculation is not None and len(audio) >= speculation.audio_bytes:
            try:
                transcript = await speculation.task
                self.speculations_used += 1
                log.debug("speculative transcript used (%d used, %d dropped so far)",
                          self.speculations_used, self.speculations_dropped)
                return transcript
            except asyncio.CancelledError:
                if asyncio.current_task().cancelling():
                    raise
        log.debug("no speculative transcript for this turn (%d used, %d dropped so far)",
                  self.speculations_used, self.speculations_dropped)
        return await self._engine.transcribe(self._fit(audio))

    @property
    def wants_wav_segments(self) -> bool:
        return False  # the engine reads raw 16-bit PCM

    def can_generate_metrics(self) -> bool:
        return True

    async def run_stt(self, audio: bytes) -> AsyncGenerator[Frame | None, None]:
        await self.start_processing_metrics()
        try:
            transcript = await self._transcribe(audio)
        except CadenceError as exc:
            yield ErrorFrame(error=f"speech recognition unavailable: {exc}")
            return
        finally:
            await self.stop_processing_metrics()
        if not is_plausible(transcript):
            log.debug("dropped implausible transcript (%d chars)", len(transcript.text))
            return
        yield TranscriptionFrame(transcript.text, self._user_id, time_now_iso8601(), finalized=True)
