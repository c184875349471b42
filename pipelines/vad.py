"""Silero VAD that also reports the start of a pause, before the turn is declared over.

The VAD ends a turn only after `stop_secs` of silence. Knowing earlier that the caller
went quiet lets ASR start transcribing while that silence is still being waited out
(see `EngineSTTService.speech_paused`); if the caller goes on, the guess is dropped. The VAD
tells a `PauseListener` (the STT) of each pause and its end, on the event loop, as it hears
them: a frame pushed up from the aggregator the VAD runs in would reach the STT later.

The silence that ends the turn can change while it is being waited out: `allow_pause`
shortens or lengthens it for the current pause (the turn-end policy's verdict,
pipelines/turn_end.py), and every new pause starts from `stop_secs` again. A pause
already longer than the new allowance ends the turn at the next analysed frame.

Every call's VAD runs on one ONNX Runtime session per process (`SharedSessionSileroVAD`):
pipecat's analyzer loads a session of its own for each call (the graph optimised again, the
weights copied again, native memory taken and given back per call: tens of milliseconds of
every call's start here). The session holds only the weights; each call keeps its own
recurrent state, and ONNX Runtime runs one session from several threads at once.
"""

from __future__ import annotations

import threading
from importlib import resources
from typing import Protocol

import onnxruntime
from pipecat.audio.vad.silero import SileroOnnxModel, SileroVADAnalyzer
from pipecat.audio.vad.vad_analyzer import VADAnalyzer, VADParams, VADState

_SILERO_MODEL = ("pipecat.audio.vad.data", "silero_vad.onnx")  # the weights pipecat ships
_session_lock = threading.Lock()
_session: onnxruntime.InferenceSession | None = None


def shared_silero_session() -> onnxruntime.InferenceSession:
    """The process's Silero session, loaded on first use (pipelines are built on threads)."""
    global _session
    with _session_lock:
        if _session is None:
            package, name = _SILERO_MODEL
            _session = SileroOnnxModel(str(resources.files(package).joinpath(name)), force_onnx_cpu=True).session
        return _session


class _CallSileroModel(SileroOnnxModel):
    """pipecat's model wrapper (its input checks, context and recurrent state, all per call)
    over the shared session instead of a session of its own."""

    def __init__(self, session: onnxruntime.InferenceSession) -> None:  # not super(): it would load one
        self.session = session
        self.reset_states()
        self.sample_rates = [8000, 16000]


class SharedSessionSileroVAD(SileroVADAnalyzer):
    """pipecat's Silero analyzer, unchanged but for where its session comes from."""

    def __init__(self, *, sample_rate: int | None = None, params: VADParams | None = None) -> None:
        # SileroVADAnalyzer.__init__ would load a session; the rest of what it sets is here
        # (tests/test_vad.py checks both set the same attributes, so a pipecat update that adds
        # one fails there rather than in a call).
        VADAnalyzer.__init__(self, sample_rate=sample_rate, params=params)
        self._model = _CallSileroModel(shared_silero_session())
        self._windows_since_reset = 0
        self._low_confidence_windows = 0


class PauseListener(Protocol):
    """Told by the VAD when the caller goes quiet mid-turn, and when they go on."""

    def speech_paused(self) -> None: ...

    def speech_resumed(self) -> None: ...


class PauseAwareSileroVAD(SharedSessionSileroVAD):
    def __init__(self, *, pause_secs: float, **kwargs) -> None:
        """`pause_secs`: silence after which the caller counts as paused (inf: never)."""
        super().__init__(**kwargs)
        self._pause_secs = pause_secs
        self._listener: PauseListener | None = None
        self._paused = False
        self._stop_secs = self.params.stop_secs

    def report_pauses_to(self, listener: PauseListener) -> None:
        """`listener` hears of every pause from now on. Set once the listener is built: the STT
        is built after the VAD, as its pause judge sets the VAD's allowance (`allow_pause`)."""
        self._listener = listener

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
        # The analysis runs on the VAD's thread; the listener is told here, on the event loop.
        state = await super().analyze_audio(buffer)
        if state == VADState.SPEAKING and self._paused:
            self._paused = False
            self._reset_pause_allowance()
            if self._listener is not None:
                self._listener.speech_resumed()
        elif state == VADState.STOPPING and not self._paused:
            silent_secs = self._vad_stopping_count * self.num_frames_required() / self.sample_rate
            if silent_secs >= self._pause_secs:
                self._paused = True
                self._reset_pause_allowance()  # a verdict from an earlier pause must not end this one
                if self._listener is not None:
                    self._listener.speech_paused()
        elif state == VADState.QUIET:
            if self._paused:
                self._reset_pause_allowance()
            self._paused = False
        return state
