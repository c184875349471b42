"""What a voice needs of its SNAC codec, wherever the decoder runs.

Two implementations: `SnacDecodeService` (the decoder in this process, batched across the
calls of this server) and `RemoteSnacCodec` (a codec worker on its own GPU slice, batched
across every agent server's calls). `stream_audio` and the Orpheus engine use either.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class CodecStream(Protocol):
    # The first sample the stream still wants: a head start that played the first frames
    # moves it on, and the exact stream then skips what was already heard.
    next_sample: int


class SnacCodec(Protocol):
    @property
    def delay_samples(self) -> int:
        """How far the exact stream's audio trails the codes that have arrived."""

    @property
    def flush_frames(self) -> float:
        """Frames' worth of zeros a stream's flush runs through the decoder."""

    @property
    def queue_depth(self) -> int:
        """Requests waiting or running."""

    @property
    def batch_size(self) -> int | None:
        """Requests in the last forward pass; None until one ran, or when unknown."""

    async def start(self) -> None:
        """Idempotent; needs the running loop."""

    def warm_up(self) -> None:
        """Blocking: the first caller pays no lazy initialisation."""

    def open_stream(self) -> CodecStream:
        """A new stream; `release` it when it ends or is abandoned."""

    def release(self, stream: CodecStream) -> None:
        ...

    async def decode(self, frames: np.ndarray, first_frame: int, *, stream: CodecStream | None = None) -> np.ndarray:
        """A window of (n, 7) frames decoded on its own, as offline."""

    async def step(self, stream: CodecStream, frames: np.ndarray | None, *, final: bool = False) -> np.ndarray:
        """The stream's newly final audio after `frames` more; `final` (or frames=None) ends it."""

    async def close(self) -> None:
        ...
