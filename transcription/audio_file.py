"""Any recording ffmpeg reads, decoded a block at a time (bounded memory, whatever its length).

PyAV (ffmpeg's libraries, installed with pipecat) decodes; its resampler converts to 16 kHz
float32, mono or per channel. A file that stops decoding part way (truncated, corrupt tail)
keeps what decoded and says so (`truncated`); one where nothing decodes is refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from transcription.errors import EmptyAudio, UnreadableAudio

SAMPLE_RATE = 16_000


@dataclass(frozen=True)
class AudioInfo:
    channels: int
    sample_rate: int  # the file's own
    duration_s: float | None  # from the container; None when it does not say


def probe(path: str | Path) -> AudioInfo:
    import av

    try:
        with av.open(str(path)) as container:
            if not container.streams.audio:
                raise UnreadableAudio(f"{Path(path).name}: no audio stream in it")
            stream = container.streams.audio[0]
            duration = None
            if stream.duration is not None and stream.time_base is not None:
                duration = float(stream.duration * stream.time_base)
            elif container.duration is not None:
                duration = container.duration / 1_000_000  # av.time_base: microseconds
            return AudioInfo(channels=stream.codec_context.channels or 1,
                             sample_rate=stream.codec_context.sample_rate or 0, duration_s=duration)
    except UnreadableAudio:
        raise
    except Exception as exc:  # av.error.*: not a container ffmpeg knows, or unreadable
        raise UnreadableAudio(f"{Path(path).name}: not audio ffmpeg can read ({type(exc).__name__}: {exc})") from None


class AudioReader:
    """Iterate for blocks of `block_s` seconds of float32 audio at 16 kHz: shape (n,) when
    `per_channel` is False (channels averaged), else (channels, n) for 1 or 2 channels."""

    def __init__(self, path: str | Path, *, per_channel: bool = False, block_s: float = 10.0) -> None:
        self.path = Path(path)
        self.info = probe(path)
        self.per_channel = per_channel and self.info.channels == 2
        self._block = int(block_s * SAMPLE_RATE)
        self.samples = 0  # decoded so far, per channel
        self.truncated = False  # decoding stopped on an error after some audio

    def __iter__(self) -> Iterator[np.ndarray]:
        import av

        layout = "stereo" if self.per_channel else "mono"
        pending: list[np.ndarray] = []
        held = 0
        try:
            with av.open(str(self.path)) as container:
                stream = container.streams.audio[0]
                resampler = av.AudioResampler(format="fltp", layout=layout, rate=SAMPLE_RATE)
                try:
                    for frame in container.decode(stream):
                        for out in resampler.resample(frame):
                            pending.append(out.to_ndarray())
                            held += pending[-1].shape[1]
                        while held >= self._block:
                            block, pending, held = self._take(pending, held)
                            yield block
                    for out in resampler.resample(None):  # what the resampler still holds
                        pending.append(out.to_ndarray())
                        held += pending[-1].shape[1]
                except (av.error.FFmpegError, ValueError) as exc:
                    if self.samples + held == 0:
                        raise UnreadableAudio(f"{self.path.name}: nothing decodes ({type(exc).__name__}: {exc})") \
                            from None
                    self.truncated = True
        except av.error.FFmpegError as exc:
            raise UnreadableAudio(f"{self.path.name}: not audio ffmpeg can read ({exc})") from None
        if held:
            block = np.concatenate(pending, axis=1)
            self.samples += block.shape[1]
            yield block if self.per_channel else block[0]
        if self.samples == 0:
            raise EmptyAudio(f"{self.path.name}: no audio in it (zero length)")

    def _take(self, pending: list[np.ndarray], held: int) -> tuple[np.ndarray, list[np.ndarray], int]:
        joined = np.concatenate(pending, axis=1)
        block, rest = joined[:, : self._block], joined[:, self._block :]
        self.samples += block.shape[1]
        block = block if self.per_channel else block[0]
        return np.ascontiguousarray(block, dtype=np.float32), [rest] if rest.shape[1] else [], rest.shape[1]


class AudioWindow:
    """Decoded blocks still needed, mono (n,) or per channel (c, n): from sample `start` to
    `end`, the end of what was read. Who reads a file in order keeps only this."""

    def __init__(self) -> None:
        self.start = 0
        self._blocks: list[np.ndarray] = []

    @property
    def end(self) -> int:
        return self.start + sum(block.shape[-1] for block in self._blocks)

    def append(self, block: np.ndarray) -> None:
        self._blocks.append(block)

    def slice(self, start: int, end: int) -> np.ndarray:
        """A copy of samples [start, end) (clipped to what is held)."""
        joined = self._joined()
        return joined[..., max(0, start - self.start): max(0, end - self.start)].copy()

    def drop_before(self, sample: int) -> None:
        if sample <= self.start or not self._blocks:
            return
        joined = self._joined()
        cut = min(sample - self.start, joined.shape[-1])
        self._blocks, self.start = [joined[..., cut:]], self.start + cut

    def _joined(self) -> np.ndarray:
        if len(self._blocks) != 1:
            self._blocks = [np.concatenate(self._blocks, axis=-1)]
        return self._blocks[0]


def spans(path: str | Path, times: list[tuple[float, float]], *, per_channel: bool = False,
          block_s: float = 10.0) -> Iterator[np.ndarray]:
    """The audio of each (start, end) span in seconds, in one pass over the file. Spans must
    be in order and not overlap; only the audio from the current span on is held."""
    reader = AudioReader(path, per_channel=per_channel, block_s=block_s)
    window = AudioWindow()
    window.append(np.zeros((2, 0) if reader.per_channel else 0, np.float32))
    blocks = iter(reader)
    for start, end in times:
        first, last = int(start * SAMPLE_RATE), int(end * SAMPLE_RATE)
        while window.end < last and (block := next(blocks, None)) is not None:
            window.append(block)
        yield window.slice(first, last)
        window.drop_before(last)
