"""Audio between a Realtime client's formats and the pipeline's PCM16: plain, synchronous,
stateful per direction (no clicks at chunk edges), flushed at the end of a reply.

soxr's stream resampler at pipecat's default quality (VHQ) holds back 40-120 ms of audio and
releases it in bursts (24 -> 8 kHz: nothing for the first 120 ms of a reply, then 1100 samples
at once), and what it holds at a reply's end is lost. "MQ" keeps speech intact at these rates
with no hold-back at 24 -> 16 kHz and one 40 ms step at 24 -> 8 kHz; a flush returns the rest.
"""

from __future__ import annotations

import audioop  # noqa: deprecated in 3.13; pipecat relies on it (or audioop-lts) as well

import numpy as np
import soxr

from agent.transports.realtime_protocol import AudioFormat

PROTOCOL_RATE: dict[str, int] = {"pcm16": 24_000, "pcmu": 8_000}
QUALITY = "MQ"


class _Resampler:
    def __init__(self, in_rate: int, out_rate: int) -> None:
        self.in_rate, self.out_rate = in_rate, out_rate
        self._stream = soxr.ResampleStream(in_rate, out_rate, 1, dtype="int16", quality=QUALITY) \
            if in_rate != out_rate else None

    def feed(self, pcm16: bytes, *, last: bool = False) -> bytes:
        if self._stream is None:
            return pcm16
        samples = np.frombuffer(pcm16, dtype="<i2")
        return self._stream.resample_chunk(samples, last=last).astype("<i2").tobytes()


def _to_pcm16(audio: bytes, audio_format: AudioFormat) -> bytes:
    return audioop.ulaw2lin(audio, 2) if audio_format == "pcmu" else audio


class InboundAudio:
    """A client's audio in its format -> PCM16 at the pipeline's input rate."""

    def __init__(self, pipeline_rate: int) -> None:
        self.pipeline_rate = pipeline_rate
        self._resampler: _Resampler | None = None

    def convert(self, audio: bytes, audio_format: AudioFormat) -> bytes:
        rate = PROTOCOL_RATE[audio_format]
        if self._resampler is None or self._resampler.in_rate != rate or self._resampler.out_rate != self.pipeline_rate:
            self._resampler = _Resampler(rate, self.pipeline_rate)  # a format change starts afresh
        return self._resampler.feed(_to_pcm16(audio, audio_format))


class OutboundAudio:
    """The pipeline's reply audio -> the client's format. `flush` at each reply's end."""

    def __init__(self) -> None:
        self._resampler: _Resampler | None = None
        self._format: AudioFormat = "pcm16"

    def convert(self, pcm16: bytes, sample_rate: int, audio_format: AudioFormat) -> bytes:
        rate = PROTOCOL_RATE[audio_format]
        if self._resampler is None or (self._resampler.in_rate, self._resampler.out_rate) != (sample_rate, rate):
            self._resampler = _Resampler(sample_rate, rate)
        self._format = audio_format
        return self._encode(self._resampler.feed(pcm16))

    def flush(self) -> bytes:
        """What the resampler still holds of the reply; the next reply starts clean."""
        if self._resampler is None:
            return b""
        rest, self._resampler = self._resampler.feed(b"", last=True), None
        return self._encode(rest)

    def _encode(self, pcm16: bytes) -> bytes:
        return audioop.lin2ulaw(pcm16, 2) if self._format == "pcmu" and pcm16 else pcm16
