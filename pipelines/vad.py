"""Silero VAD that also reports the start of a pause, before the turn is declared over.

The VAD ends a turn only after `stop_secs` of silence. Knowing earlier that the caller
went quiet lets ASR start transcribing while that silence is still being waited out
(see `EngineSTTService.speech_paused`); if the caller goes on, the guess is dropped.
"""

from __future__ import annotations

from collections.abc import Callable

from pipecat.audio.vad.silero import SileroVADAnalyzer
from pipecat.audio.vad.vad_analyzer import VADState


class PauseAwareSileroVAD(SileroVADAnalyzer):
    def __init__(self, *, pause_secs: float, on_pause: Callable[[], None], on_resume: Callable[[], None],
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self._pause_secs = pause_secs
        self._on_pause = on_pause
        self._on_resume = on_resume
        self._paused = False

    async def analyze_audio(self, buffer: bytes) -> VADState:
        # The analysis runs on the VAD's thread; the callbacks run here, on the event loop.
        state = await super().analyze_audio(buffer)
        if state == VADState.SPEAKING and self._paused:
            self._paused = False
            self._on_resume()
        elif state == VADState.STOPPING and not self._paused:
            silent_secs = self._vad_stopping_count * self.num_frames_required() / self.sample_rate
            if silent_secs >= self._pause_secs:
                self._paused = True
                self._on_pause()
        elif state == VADState.QUIET:
            self._paused = False
        return state
