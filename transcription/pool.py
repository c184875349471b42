"""Whisper in worker processes: segments of one recording transcribed side by side.

Each process loads its own Whisper once and takes one segment at a time; with N processes
of one thread each, N segments run at once (roughly N times the speed, up to the cores).
Processes are spawned, not forked: CTranslate2's and ONNX Runtime's threads do not survive
a fork. Decoding is deterministic (greedy at temperature 0), so a segment's text does not
depend on which process took it: parallel and sequential runs agree.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np

from transcription.errors import TranscriberClosed
from transcription.options import TranscriptionOptions
from transcription.result import Piece

_model: Any = None  # the Whisper of this worker process
_options: TranscriptionOptions | None = None


def _load(options: TranscriptionOptions) -> None:
    global _model, _options
    from faster_whisper import WhisperModel

    from models.assets import resolve_local

    local = resolve_local(options.model)
    _model = WhisperModel(str(local) if local else options.model, device=options.device,
                          compute_type=options.compute_type, cpu_threads=options.threads_per_worker, num_workers=1)
    _options = options


def _transcribe(audio: np.ndarray, temperature: float) -> list[Piece]:
    assert _model is not None and _options is not None, "worker not initialised"
    pieces, _info = _model.transcribe(
        audio, language=_options.language, beam_size=_options.beam_size, temperature=temperature,
        condition_on_previous_text=False, vad_filter=False, without_timestamps=False)
    return [Piece(float(p.start), float(p.end), p.text.strip(), float(p.avg_logprob)) for p in pieces]


def _ready() -> bool:
    return _model is not None


class WhisperPool:
    def __init__(self, options: TranscriptionOptions, *, workers: int | None = None) -> None:
        self.workers = workers or options.workers
        self._executor = ProcessPoolExecutor(max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_load, initargs=(options,))
        self._closed = False

    def warm_up(self) -> None:
        """Blocking: every process started and its Whisper loaded (a bench times work, not loading)."""
        futures = [self._executor.submit(_transcribe, np.zeros(16_000, np.float32), 0.0) for _ in range(self.workers)]
        for future in futures:
            future.result()

    async def transcribe(self, audio: np.ndarray, temperature: float = 0.0) -> list[Piece]:
        """Pieces with times from the start of `audio` (float32 at 16 kHz)."""
        if self._closed:
            raise TranscriberClosed("the transcription workers are shut down")
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, _transcribe, audio, temperature)
        except BrokenProcessPool as exc:
            raise TranscriberClosed(f"a transcription worker process died ({exc}); retry the file") from None

    def close(self) -> None:
        self._closed = True
        self._executor.shutdown(wait=True, cancel_futures=True)
