"""A recording, start to end: decode -> VAD -> segments -> Whisper in parallel -> guard ->
stitched timeline (-> speakers).

Bounded memory whatever the length: the file is read a block at a time, the audio kept is
the open segment's (<= 30 s) plus the segments handed to workers, and at most
`2 x workers` segments are in flight before reading waits for one to finish.
The blocking parts (decoding, VAD) run in a thread, never on the event loop.

The hallucination guard (guard.py) checks every segment: one it rejects is transcribed again
at each of `retry_temperatures`, then cut in two at the quietest frame of its middle third
(halves of at least `min_rechunk_s`) and each half done the same way; text still rejected after that is kept,
marked `suspect`. Every trigger is counted by reason.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from transcription.audio_file import SAMPLE_RATE, AudioReader, AudioWindow
from transcription.diarization import Diarizer
from transcription.errors import AudioTooLong
from transcription.guard import rejection
from transcription.options import TranscriptionOptions
from transcription.pool import WhisperPool
from transcription.result import Piece, TranscriptionResult
from transcription.segmenter import FRAME_SECONDS, Segment, Segmenter
from transcription.stitch import stitch
from transcription.vad_stream import FRAME_SAMPLES, StreamingSileroVAD

Progress = Callable[[float, float | None], None]  # (audio seconds read, total if known)


class Transcriber:
    def __init__(self, options: TranscriptionOptions, pool: WhisperPool, *,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._options = options
        self._pool = pool
        self._clock = clock

    async def transcribe(self, path: str | Path, *, progress: Progress | None = None,
                         diarizer: Diarizer | None = None, speakers: int | None = None) -> TranscriptionResult:
        """`diarizer`: label who spoke each piece (`speakers`: how many, if known)."""
        started = self._clock()
        reader = AudioReader(path)
        duration = reader.info.duration_s
        if duration is not None and duration > self._options.max_audio_seconds:
            raise AudioTooLong(f"{Path(path).name} is {duration / 3600:.1f} h long; at most "
                               f"{self._options.max_audio_seconds / 3600:.1f} h is transcribed")
        triggers: Counter[str] = Counter()
        results: list[tuple[float, float, list[Piece]]] = []
        in_flight = asyncio.Semaphore(2 * self._pool.workers)
        tasks: list[asyncio.Task] = []
        speech_seconds = 0.0

        async def run(segment: Segment, audio: np.ndarray) -> None:
            try:
                results.extend(await self._segment(segment.start_s, segment.probabilities, audio, triggers))
            finally:
                in_flight.release()

        vad, segmenter, window = StreamingSileroVAD(), Segmenter(self._options.segmenting), AudioWindow()
        blocks = iter(reader)
        try:
            while True:
                step = await asyncio.to_thread(_next_block, blocks, vad)
                if step is None:
                    segments = segmenter.feed(vad.probabilities(np.zeros(0, np.float32), final=True))
                    segments += segmenter.finish()
                else:
                    block, probabilities = step
                    window.append(block)
                    segments = segmenter.feed(probabilities)
                if reader.samples / SAMPLE_RATE > self._options.max_audio_seconds:
                    raise AudioTooLong(f"{Path(path).name} runs past {self._options.max_audio_seconds / 3600:.1f} h, "
                                       "the most transcribed")
                for segment in segments:
                    audio = window.slice(segment.start * FRAME_SAMPLES, segment.end * FRAME_SAMPLES)
                    speech_seconds += len(audio) / SAMPLE_RATE
                    await in_flight.acquire()
                    tasks.append(asyncio.create_task(run(segment, audio)))
                window.drop_before(segmenter.keep_from * FRAME_SAMPLES)
                if progress is not None:
                    progress(reader.samples / SAMPLE_RATE, duration)
                if step is None:
                    break
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        pieces, found, diarization_seconds = stitch(results), None, 0.0
        if diarizer is not None:
            diarizing = self._clock()
            pieces, found = await asyncio.to_thread(diarizer.label, path, pieces, speakers=speakers)
            diarization_seconds = self._clock() - diarizing
        return TranscriptionResult(segments=pieces, audio_seconds=reader.samples / SAMPLE_RATE,
                                   processing_seconds=self._clock() - started, speech_seconds=speech_seconds,
                                   truncated=reader.truncated, guard_triggers=dict(triggers), speakers=found,
                                   diarization_seconds=diarization_seconds)

    async def _segment(self, start_s: float, probabilities: np.ndarray, audio: np.ndarray,
                       triggers: Counter[str]) -> list[tuple[float, float, list[Piece]]]:
        seconds = len(audio) / SAMPLE_RATE
        pieces = await self._pool.transcribe(audio, 0.0)
        reason = rejection(pieces, seconds)
        for temperature in self._options.retry_temperatures:
            if reason is None:
                break
            triggers[reason] += 1
            pieces = await self._pool.transcribe(audio, temperature)
            reason = rejection(pieces, seconds)
        if reason is None:
            return [(start_s, start_s + seconds, pieces)]
        triggers[reason] += 1
        cut = _rechunk_point(probabilities, int(self._options.min_rechunk_s / FRAME_SECONDS))
        if cut is not None:
            triggers["rechunk"] += 1
            cut_sample = min(cut * FRAME_SAMPLES, len(audio))
            halves = await asyncio.gather(
                self._segment(start_s, probabilities[:cut], audio[:cut_sample], triggers),
                self._segment(start_s + cut * FRAME_SECONDS, probabilities[cut:], audio[cut_sample:], triggers))
            return halves[0] + halves[1]
        suspect = [Piece(p.start, p.end, p.text, p.avg_logprob, suspect=True) for p in pieces]
        return [(start_s, start_s + seconds, suspect)]


def _rechunk_point(probabilities: np.ndarray, min_frames: int) -> int | None:
    """Where to cut a rejected segment in two: its quietest frame in the middle third,
    leaving each half at least `min_frames`; None when it is too short to cut."""
    n = len(probabilities)
    low, high = max(n // 3, min_frames), min(2 * n // 3, n - min_frames)
    if high <= low:
        return None
    return low + int(np.argmin(probabilities[low:high]))


def _next_block(blocks, vad: StreamingSileroVAD) -> tuple[np.ndarray, np.ndarray] | None:
    """In a thread: the next decoded block and its frames' speech probabilities."""
    block = next(blocks, None)
    if block is None:
        return None
    return block, vad.probabilities(block)
