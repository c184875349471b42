"""A voice with a second voice behind it: a sentence the first cannot say in time is said by
the second, so a caller hears the reply (in the CPU voice) instead of a hole.

Used for Orpheus (the CPU voice covers a GPU voice's failures) and for a voice served by a
worker (a TTS worker that died or is stuck is covered by the CPU voice in this process).
Only a sentence with no audio yet moves to the second voice: one the caller has begun to
hear would start over.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

import numpy as np
import soxr

from models.base import TTSEngine
from models.fallback import WithFallback
from models.stalls import StallLimits, without_stalls

log = logging.getLogger(__name__)


class FallbackTTSEngine(WithFallback[TTSEngine], TTSEngine):
    """The primary voice; a sentence it fails, or gives no audio for within
    `first_audio_within_s`, is said by the fallback voice, given `fallback_text(text)` (what
    it can say of a sentence written for the primary)."""

    def __init__(self, primary: TTSEngine, fallback: TTSEngine, *, first_audio_within_s: float | None = None,
                 fallback_text: Callable[[str], str] = lambda text: text) -> None:
        super().__init__(primary, fallback)
        # Once audio came, the primary has the sentence: the service's own deadlines cover a
        # stall after that (pipelines/tts.py).
        self._limits = StallLimits(first_audio_within_s) if first_audio_within_s else None
        self._fallback_text = fallback_text

    @property
    def sample_rate(self) -> int:  # a worker's is known once it is loaded
        return self._primary.sample_rate

    async def synthesize(self, text: str) -> AsyncIterator[bytes]:
        started = False
        try:
            async for chunk in without_stalls(self._primary.synthesize(text), self._limits, what="primary voice"):
                started = True
                yield chunk
            return
        except Exception as exc:  # whatever failed it, the sentence is said by the other voice
            if started:
                raise
            self.fallbacks += 1
            log.warning("primary voice failed (%s: %s); this sentence falls back to the CPU voice",
                        exc.__class__.__name__, exc)
        # The voices may run at different rates; one streaming resampler keeps chunk edges seamless.
        resampler = soxr.ResampleStream(self._fallback.sample_rate, self.sample_rate, 1, dtype="int16")
        async for chunk in self._fallback.synthesize(self._fallback_text(text)):
            yield resampler.resample_chunk(np.frombuffer(chunk, dtype=np.int16)).tobytes()
        yield resampler.resample_chunk(np.zeros(0, dtype=np.int16), last=True).tobytes()
