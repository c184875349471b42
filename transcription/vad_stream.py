"""Silero VAD (v6, the ONNX model faster-whisper ships) over a stream of blocks: its
recurrent state and 64-sample context carry from block to block, so a long file gives the
same probabilities as one call on the whole of it, without holding the whole of it."""

from __future__ import annotations

import os

import numpy as np

FRAME_SAMPLES = 512  # 32 ms at 16 kHz: one probability each
_CONTEXT_SAMPLES = 64


class StreamingSileroVAD:
    def __init__(self) -> None:
        import onnxruntime
        from faster_whisper.utils import get_assets_path

        options = onnxruntime.SessionOptions()
        options.inter_op_num_threads = options.intra_op_num_threads = 1
        options.log_severity_level = 4
        self._session = onnxruntime.InferenceSession(os.path.join(get_assets_path(), "silero_vad_v6.onnx"),
                                                     providers=["CPUExecutionProvider"], sess_options=options)
        self._h = np.zeros((1, 1, 128), np.float32)
        self._c = np.zeros((1, 1, 128), np.float32)
        self._context = np.zeros(_CONTEXT_SAMPLES, np.float32)
        self._carry = np.zeros(0, np.float32)  # samples short of a whole frame, kept for the next block

    def probabilities(self, audio: np.ndarray, *, final: bool = False) -> np.ndarray:
        """Speech probability of each whole 512-sample frame completed by `audio`; with
        `final`, the last partial frame too (zero-padded)."""
        audio = np.concatenate([self._carry, np.asarray(audio, np.float32)])
        whole = len(audio) // FRAME_SAMPLES * FRAME_SAMPLES
        if final and whole < len(audio):
            audio = np.pad(audio, (0, FRAME_SAMPLES - (len(audio) - whole)))
            whole = len(audio)
        self._carry = audio[whole:]
        if whole == 0:
            return np.zeros(0, np.float32)
        frames = audio[:whole].reshape(-1, FRAME_SAMPLES)
        contexts = np.vstack([self._context[None, :], frames[:-1, -_CONTEXT_SAMPLES:]])
        self._context = frames[-1, -_CONTEXT_SAMPLES:].copy()
        batch = np.concatenate([contexts, frames], axis=1)
        out, self._h, self._c = self._session.run(None, {"input": batch, "h": self._h, "c": self._c})
        return np.asarray(out, np.float32).reshape(-1)
