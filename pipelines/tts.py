"""Text-to-speech as a pipecat service over our `TTSEngine`.

pipecat's TTSService aggregates the LLM's text into sentences and calls `run_tts` per
sentence, so the first sentence is spoken while the LLM is still writing the second.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from pipecat.frames.frames import ErrorFrame, Frame
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TTSService

from agent.errors import CadenceError
from models.base import TTSEngine
from pipelines.text_chunking import FirstPhraseAggregator


class EngineTTSService(TTSService):
    def __init__(self, engine: TTSEngine, *, voice: str, **kwargs) -> None:
        super().__init__(
            push_start_frame=True,
            push_stop_frames=True,
            settings=TTSSettings(model=None, voice=voice, language=None),
            **kwargs,
        )
        self._engine = engine
        # pipecat 1.14 has no constructor argument for the aggregator; this replaces the
        # default sentence aggregator with one that also releases a reply's first phrase early.
        self._text_aggregator = FirstPhraseAggregator()

    def can_generate_metrics(self) -> bool:
        return True

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame, None]:
        await self.start_tts_usage_metrics(text)
        chunks = self._engine.synthesize(text)
        try:
            async for frame in self._stream_audio_frames_from_iterator(
                chunks, in_sample_rate=self._engine.sample_rate, context_id=context_id
            ):
                await self.stop_ttfb_metrics()
                yield frame
        except CadenceError as exc:
            yield ErrorFrame(error=f"speech synthesis unavailable: {exc}")
        finally:
            await chunks.aclose()  # barge-in lands here: stop synthesising now
            await self.stop_ttfb_metrics()
