"""A call's conversation as events: what a client of a speech-to-speech protocol needs to hear.

Whatever runs between the transport's input and output (the cascade of VAD, Whisper, the LLM
and the TTS, or one speech-to-speech model) speaks pipecat's frame vocabulary. This observer
reads that vocabulary and tells a `SpeechEventSink` what happened, in the order the caller
experiences it: the reply's audio and words as the output transport sends them, not as the
TTS makes them, so a sink never runs ahead of what was heard.
"""

from __future__ import annotations

from typing import Protocol

from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    InterimTranscriptionFrame,
    InterruptionFrame,
    LLMContextAssistantTimestampFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    OutputAudioRawFrame,
    TranscriptionFrame,
    TTSTextFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.observers.base_observer import BaseObserver, FramePushed
from pipecat.processors.aggregators.llm_response_universal import LLMAssistantAggregator
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor


class SpeechEventSink(Protocol):
    """What a conversation's client is told. Calls come in the caller's order, one at a time."""

    async def speech_started(self) -> None: ...

    async def speech_stopped(self) -> None: ...

    async def user_transcript(self, text: str, *, final: bool) -> None:
        """A partial (`final` False: the words so far, revisable) or the turn's final words."""

    async def reply_started(self) -> None:
        """A reply begins: the model starts writing it (or, for a greeting, speaking it)."""

    async def reply_text_generated(self, text: str) -> None:
        """A piece of the reply as the model writes it (before any audio of it exists)."""

    async def reply_audio(self, pcm16: bytes, sample_rate: int) -> None:
        """Reply audio as the output transport sends it to the caller."""

    async def reply_text_spoken(self, text: str) -> None:
        """Words of the reply whose audio has just been sent."""

    async def reply_finished(self, *, interrupted: bool, audio_ms: float) -> None:
        """The reply is over: spoken to its end, or cut off (barge-in, cancel) once `audio_ms`
        of its audio had been sent."""

    async def reply_stored(self) -> None:
        """The assistant's last reply (whole, or as far as it went) is now in the LLM context."""


class SpeechEventObserver(BaseObserver):
    """Frames -> `SpeechEventSink` calls.

    A reply is over when its LLMFullResponseEndFrame leaves the output transport: pipecat's TTS
    queues that frame behind the reply's audio, and the output transport sends the audio before
    passing the frame on, so by then all of the reply has gone out. Speech that no model wrote
    (a greeting) is over when the audio stops. An interruption ends a reply wherever it is."""

    def __init__(self, sink: SpeechEventSink, *, output_transport: FrameProcessor) -> None:
        super().__init__()
        self._sink = sink
        self._output = output_transport
        self._replying = False  # a reply has begun and is not over
        self._written = False  # the reply in progress comes from the model (not a greeting)
        self._audio_ms = 0.0  # of the reply in progress, sent so far
        self._caller_speaking = False  # as the VAD hears it: speech, then silence long enough to stop

    async def on_push_frame(self, data: FramePushed) -> None:
        frame = data.frame
        if data.source is self._output and data.direction == FrameDirection.DOWNSTREAM:
            await self._on_sent(frame)
            return
        if isinstance(data.source, LLMAssistantAggregator) and data.direction == FrameDirection.DOWNSTREAM:
            # The aggregator passes these on once it has written the reply into the context.
            if isinstance(frame, (LLMContextAssistantTimestampFrame, InterruptionFrame)):
                await self._sink.reply_stored()
            return
        if not data.first_push:
            return
        if isinstance(frame, VADUserStartedSpeakingFrame):
            if not self._caller_speaking:  # a VAD event may be pushed both ways: once per change
                self._caller_speaking = True
                await self._sink.speech_started()
        elif isinstance(frame, VADUserStoppedSpeakingFrame):
            if self._caller_speaking:
                self._caller_speaking = False
                await self._sink.speech_stopped()
        elif isinstance(frame, TranscriptionFrame):
            await self._sink.user_transcript(frame.text, final=True)
        elif isinstance(frame, InterimTranscriptionFrame):
            await self._sink.user_transcript(frame.text, final=False)
        elif isinstance(frame, LLMFullResponseStartFrame):
            await self._begin(written=True)
        elif isinstance(frame, LLMTextFrame) and not isinstance(frame, TTSTextFrame) and self._replying:
            await self._sink.reply_text_generated(frame.text)
        elif isinstance(frame, InterruptionFrame) and self._replying:
            await self._finish(interrupted=True)

    async def _on_sent(self, frame) -> None:
        if isinstance(frame, BotStartedSpeakingFrame):
            if not self._replying:
                await self._begin(written=False)
        elif isinstance(frame, OutputAudioRawFrame) and self._replying:
            self._audio_ms += len(frame.audio) / (2 * frame.num_channels) / frame.sample_rate * 1000.0
            await self._sink.reply_audio(frame.audio, frame.sample_rate)
        elif isinstance(frame, TTSTextFrame) and self._replying:
            await self._sink.reply_text_spoken(frame.text)
        elif isinstance(frame, LLMFullResponseEndFrame) and self._replying and self._written:
            await self._finish(interrupted=False)
        elif isinstance(frame, BotStoppedSpeakingFrame) and self._replying and not self._written:
            await self._finish(interrupted=False)

    async def _begin(self, *, written: bool) -> None:
        if self._replying:  # a new reply before the last one ended: that one is over
            await self._finish(interrupted=False)
        self._replying, self._written, self._audio_ms = True, written, 0.0
        await self._sink.reply_started()

    async def _finish(self, *, interrupted: bool) -> None:
        self._replying = self._written = False
        await self._sink.reply_finished(interrupted=interrupted, audio_ms=self._audio_ms)
