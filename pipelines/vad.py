"""Silero VAD that also reports the start of a pause, before the turn is declared over.

The VAD ends a turn only after `stop_secs` of silence. Knowing earlier that the caller
went quiet lets ASR start transcribing while that silence is still being waited out
(see `EngineSTTService.speech_paused`); if the caller goes on, the guess is dropped.

The silence that ends the turn can change while it is being waited out: `allow_pause`
shortens or lengthens it for the current pause (the turn-end policy's verdict,
pipelines/turn_end.py), and every new pause starts from `stop_secs` again. A pause
already longer than the new allowance ends the turn at the next analysed frame.
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
        self._stop_secs = self.params.stop_secs

    def allow_pause(self, seconds: float) -> None:
        """Silence that ends the turn during this pause (from the event loop; the analysis
        thread reads one int, so no lock is needed)."""
        frame_secs = self.num_frames_required() / self.sample_rate
        self._vad_stop_frames = max(1, round(seconds / frame_secs))

    def _reset_pause_allowance(self) -> None:
        self.allow_pause(self._stop_secs)

    def set_params(self, params) -> None:
        super().set_params(params)
        self._stop_secs = params.stop_secs

    async def analyze_audio(self, buffer: bytes) -> VADState:
        # The analysis runs on the VAD's thread; the callbacks run here, on the event loop.
        state = await super().analyze_audio(buffer)
        if state == VADState.SPEAKING and self._paused:
            self._paused = False
            self._reset_pause_allowance()
            self._on_resume()
        elif state == VADState.STOPPING and not self._paused:
            silent_secs = self._vad_stopping_count * self.num_frames_required() / self.sample_rate
            if silent_secs >= self._pause_secs:
                self._paused = True
                self._reset_pause_allowance()  # a verdict from an earlier pause must not end this one
                self._on_pause()
        elif state == VADState.QUIET:
            if self._paused:
                self._reset_pause_allowance()
            self._paused = False
        return state
