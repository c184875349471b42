"""Smart Turn v3: does the caller's voice sound finished? An ONNX classifier on ONNX Runtime.

Smart Turn (pipecat-ai/smart-turn) reads the last 8 s of a turn as Whisper log-mel
features and gives the probability that the speaker has finished: falling pitch, a
completed phrase, no hanging "and". It runs in ~40 ms on one CPU core, so it can judge a
pause while the VAD is still waiting one out, instead of adding its own wait as pipecat's
stock pipeline does.

What it hears is prosody. Speech synthesisers end every fragment with a sentence's falling
tone, so on synthetic callers its verdicts are noise; the turn-end policy
(pipelines/turn_end.py) weighs it with the words before it shortens a pause.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from models.assets import resolve_local
from models.base import TurnEndEngine
from models.errors import ModelAssetError
from models.runner import ModelRunner, RunnerLoad

log = logging.getLogger(__name__)

MODEL_SAMPLE_RATE = 16_000
WINDOW_SECONDS = 8  # the model was trained on the last 8 s of a turn, zero-padded in front
_PCM16_FULL_SCALE = 32768.0


@dataclass(frozen=True)
class SmartTurnOptions:
    model: str = "package:smart-turn-v3.2"  # package:<name> or a local .onnx path
    threads: int = 1  # ONNX Runtime intra-op threads: one core leaves the rest to Whisper and the LLM


class SmartTurnEngine(RunnerLoad, TurnEndEngine):
    def __init__(self, options: SmartTurnOptions, *, max_waiting: int = 16) -> None:
        self._options = options
        self._session = None
        self._features = None
        self._runner = ModelRunner("turn-end", max_waiting=max_waiting)

    def load(self) -> None:
        import onnxruntime as ort
        # pipecat's numpy port of Whisper's feature extractor: the features the model was trained on.
        from pipecat.audio.turn.smart_turn._whisper_features import compute_whisper_log_mel_features

        path = resolve_local(self._options.model)
        if path is None or path.suffix != ".onnx":
            raise ModelAssetError(f"turn_end.model {self._options.model!r} must be a package:<name> or a .onnx path")
        session_options = ort.SessionOptions()
        session_options.intra_op_num_threads = self._options.threads
        session_options.inter_op_num_threads = 1
        session_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        log.info("loading smart turn model %s", path)
        self._session = ort.InferenceSession(str(path), sess_options=session_options,
                                             providers=["CPUExecutionProvider"])
        self._features = compute_whisper_log_mel_features

    def warm_up(self) -> None:
        self._predict(np.zeros(MODEL_SAMPLE_RATE, dtype=np.int16).tobytes())

    async def probability_complete(self, pcm16: bytes) -> float:
        return await self._runner.run(lambda: self._predict(pcm16))

    def _predict(self, pcm16: bytes) -> float:
        if self._session is None:
            raise ModelAssetError("smart turn model used before load()")
        audio = last_window(np.frombuffer(pcm16, dtype=np.int16).astype(np.float32) / _PCM16_FULL_SCALE)
        features = self._features(audio, do_normalize=True)[np.newaxis]
        (probabilities,) = self._session.run(None, {"input_features": features})
        return float(np.asarray(probabilities).reshape(-1)[0])

    async def close(self) -> None:
        self._runner.shutdown()
        self._session = None


def last_window(audio: np.ndarray) -> np.ndarray:
    """The model's input: the last WINDOW_SECONDS of `audio`, zero-padded in front when shorter."""
    size = WINDOW_SECONDS * MODEL_SAMPLE_RATE
    if len(audio) >= size:
        return audio[-size:]
    return np.pad(audio, (size - len(audio), 0))
