"""Watches a call's frames and feeds the `TurnTimeline` (frame vocabulary -> turn events).

Frames are pushed once per hop; each is counted once (`first_push`), and only from the
processor that produces it, so a frame seen at five hops is one event.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    EagerEndOfTurnCancelFrame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMTextFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSTextFrame,
)
from pipecat.observers.base_observer import BaseObserver, FramePushed
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

from pipelines.frames import (CallerSpeechEndFrame, TranscriptLostFrame, TTSSentenceTimingFrame, TurnContextFrame,
                              TurnPartTranscriptionFrame)
from pipelines.turn_timeline import Turn, TurnTimeline


class TurnObserver(BaseObserver):
    def __init__(
        self,
        *,
        output_transport: FrameProcessor,
        on_turn_closed: Callable[[Turn], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__()
        self._output = output_transport
        self._clock = clock
        self.timeline = TurnTimeline(on_closed=on_turn_closed)

    async def on_push_frame(self, data: FramePushed) -> None:
        frame = data.frame
        if isinstance(frame, CallerSpeechEndFrame):
            # TTFS starts at the caller's last voiced audio, measured by STT on the audio.
            if data.first_push:
                self.timeline.user_stopped_speaking(frame.last_voiced_at)
            return
        if isinstance(frame, EagerEndOfTurnCancelFrame):
            if data.first_push:
                self.timeline.eager_reply_dropped()
            return
        if isinstance(frame, TranscriptLostFrame):
            if data.first_push:
                self.timeline.transcript_lost(self._clock())
            return
        if isinstance(frame, TTSSentenceTimingFrame):
            if data.first_push:
                self.timeline.sentence_synthesized(frame.ttfb_seconds)
            return
        if not data.first_push and not (data.source is self._output and data.direction == FrameDirection.DOWNSTREAM):
            return
        now = self._clock()
        if isinstance(frame, TurnPartTranscriptionFrame):
            self.timeline.transcript_part(frame.text)
        elif isinstance(frame, TranscriptionFrame):
            self.timeline.transcript(frame.text, now)
        elif isinstance(frame, TurnContextFrame):
            if frame.speculation:  # an eager reply: its turn has not ended yet
                self.timeline.stage_ahead("retrieval", now)
            else:
                self.timeline.stage("retrieval", now)
        elif isinstance(frame, LLMTextFrame) and not isinstance(frame, TTSTextFrame):
            self.timeline.stage("llm_first_token", now)
        elif isinstance(frame, LLMFullResponseEndFrame):
            self.timeline.reply_generated()
        elif isinstance(frame, TTSStartedFrame):
            self.timeline.stage("first_sentence", now)
        elif isinstance(frame, TTSAudioRawFrame):
            self.timeline.stage("tts_first_audio", now)
        elif isinstance(frame, BotStartedSpeakingFrame) and data.source is self._output:
            self.timeline.bot_started_speaking(now)
        elif isinstance(frame, TTSTextFrame) and data.source is self._output:
            # The output transport passes text on as its audio goes out: what was said.
            self.timeline.spoken_text(frame.text)
        elif isinstance(frame, BotStoppedSpeakingFrame) and data.source is self._output:
            self.timeline.bot_stopped_speaking(now)
        elif isinstance(frame, InterruptionFrame):
            self.timeline.interrupted(now)

    def finish(self) -> None:
        self.timeline.finish(self._clock())
