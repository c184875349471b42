"""Text-to-speech as pipecat services over our `TTSEngine`.

pipecat's TTSService aggregates the LLM's text into sentences and calls `run_tts` per
sentence, so the first sentence is spoken while the LLM is still writing the second.
Each sentence's TTFB (request to first audio out of the engine) goes out as a
`TTSSentenceTimingFrame`: pipecat's own TTFB metric covers only the first sentence of
a reply, and a slow later sentence is what leaves a hole mid-reply.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import AsyncGenerator, Callable

from pipecat.frames.frames import ErrorFrame, Frame, TTSAudioRawFrame
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TTSService

from models.errors import CadenceError
from models.base import TTSEngine
from models.scheduling import wanted_in
from models.stalls import StallLimits, failure_kind, without_stalls
from pipelines.frames import TTSSentenceTimingFrame
from pipelines.speakable import speakable
from pipelines.text_chunking import FirstPhraseAggregator

log = logging.getLogger(__name__)


# A later sentence is wanted this long before the audio ahead of it runs out: its own
# time to first audio on a busy engine, so the caller hears no gap.
SENTENCE_LEAD_S = 0.5


class ReplyPlayout:
    """How much of a reply's audio is still queued for the caller, so a later sentence can
    say when it is wanted (`models.scheduling`). Pure: times are passed in."""

    def __init__(self) -> None:
        self._reply: str | None = None
        self._first_audio_at: float | None = None
        self._audio_seconds = 0.0  # synthesised so far in this reply

    def wanted_in(self, reply: str, now: float) -> float:
        """Seconds until the sentence about to be synthesised for `reply` is needed."""
        if reply != self._reply:
            self._reply, self._first_audio_at, self._audio_seconds = reply, None, 0.0
        if self._first_audio_at is None:
            return 0.0  # the reply's first audio: wanted now
        ahead = self._audio_seconds - (now - self._first_audio_at)
        return max(0.0, ahead - SENTENCE_LEAD_S)

    def audio(self, reply: str, seconds: float, now: float) -> None:
        if reply != self._reply:
            return
        if self._first_audio_at is None:
            self._first_audio_at = now
        self._audio_seconds += seconds


class EngineTTSService(TTSService):
    def __init__(self, engine: TTSEngine, *, voice: str, model: str | None = None,
                 clock: Callable[[], float] = time.monotonic, schedule_by_playout: bool = True,
                 stall_limits: StallLimits | None = None, on_failed: Callable[[str], None] = lambda kind: None,
                 **kwargs) -> None:
        """`schedule_by_playout`: tell a shared engine when each sentence is wanted; False
        leaves them in arrival order (the A/B baseline of `server.schedule: arrival`).
        `stall_limits`: how long a sentence waits for its first audio and then for each next
        chunk before the rest of it is skipped (deadlines.tts_*); None: no limit.
        `on_failed(kind)`: told of every sentence lost (kind: stalled or error)."""
        super().__init__(
            push_start_frame=True,
            push_stop_frames=True,
            settings=TTSSettings(model=model, voice=voice, language=None),
            **kwargs,
        )
        self._engine = engine
        self._clock = clock
        # pipecat 1.14 has no constructor argument for the aggregator; this replaces the
        # default sentence aggregator with one that also releases a reply's first phrase early.
        self._text_aggregator = FirstPhraseAggregator()
        self._playout = ReplyPlayout()
        self._schedule_by_playout = schedule_by_playout
        self._stall_limits = stall_limits
        self._on_failed = on_failed

    def can_generate_metrics(self) -> bool:
        return True

    def prepare_text(self, text: str) -> str:
        """The text the engine is given for a sentence: words a voice can say (`speakable`).
        Only the engine gets it; the reply's `TTSTextFrame`s and the stored turn keep the
        LLM's text. Voices override what else they cannot say."""
        return speakable(text)

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame, None]:
        await self.start_tts_usage_metrics(text)
        requested = self._clock()
        # A shared engine serves the caller whose audio runs out first: this reply's first
        # sentence now, a later one when the sentences ahead of it have nearly played.
        wanted = wanted_in(self._playout.wanted_in(context_id, requested), clock=self._clock) \
            if self._schedule_by_playout else contextlib.nullcontext()
        with wanted:
            chunks = without_stalls(self._engine.synthesize(self.prepare_text(text)), self._stall_limits,
                                    what="speech synthesis")
        first = True
        try:
            async for frame in self._stream_audio_frames_from_iterator(
                chunks, in_sample_rate=self._engine.sample_rate, context_id=context_id
            ):
                if first:
                    first = False
                    await self.push_frame(TTSSentenceTimingFrame(text=text, ttfb_seconds=self._clock() - requested))
                if isinstance(frame, TTSAudioRawFrame):
                    self._playout.audio(context_id, len(frame.audio) / (2 * frame.sample_rate * frame.num_channels),
                                        self._clock())
                await self.stop_ttfb_metrics()
                yield frame
        except Exception as exc:  # the sentence is lost (its fallback voice too), the reply goes on
            if not isinstance(exc, CadenceError):
                log.exception("speech synthesis failed")
            self._on_failed(failure_kind(exc))
            yield ErrorFrame(error=f"speech synthesis unavailable: {exc}")
        finally:
            await chunks.aclose()  # barge-in lands here: stop synthesising now
            await self.stop_ttfb_metrics()


_ANGLE_TAG = re.compile(r"<[^<>]{0,40}>")
_SPACE_BEFORE_PUNCTUATION = re.compile(r"\s+([.,!?;:])")


class OrpheusTTSService(EngineTTSService):
    """The Orpheus voice (24 kHz): Orpheus' emotion tags (`<laugh>`, `<sigh>`, ...) pass
    through to the model; any other angle-bracket markup an LLM writes (SSML, HTML) is
    dropped, since Orpheus would speak it. Sentences longer than one request (~20 s of
    speech, under Orpheus' ~30 s quality cliff) are split by the engine at clause breaks."""

    def __init__(self, engine: TTSEngine, *, voice: str, model: str, emotion_tags: tuple[str, ...], **kwargs) -> None:
        super().__init__(engine, voice=voice, model=model, **kwargs)
        self._emotion_tags = frozenset(emotion_tags)

    def prepare_text(self, text: str) -> str:
        kept = _ANGLE_TAG.sub(lambda m: m.group(0) if m.group(0) in self._emotion_tags else " ", text)
        # The words between the emotion tags are made speakable; the tags pass as they are.
        spoken = "".join(part if part in self._emotion_tags else speakable(part)
                         for part in re.split(f"({_ANGLE_TAG.pattern})", kept))
        return _SPACE_BEFORE_PUNCTUATION.sub(r"\1", " ".join(spoken.split()))
