"""A speech-to-speech model behind OpenAI's Realtime protocol, as a speech adapter
(pipeline "openai-realtime"): gpt-realtime, any compatible server, or another Cadence's
/v1/realtime (a cascade behind a cascade).

Built on pipecat's own OpenAIRealtimeLLMService, which speaks the protocol and already emits
the adapter vocabulary (reply audio, both sides' words, response start and end). A local
Silero VAD beside it gives what the remote does not: where the caller's speech ended on this
side (TTFS is measured from there, as for the cascade) and a barge-in as soon as the caller
speaks over a reply.
"""

from __future__ import annotations

from pipecat.audio.vad.vad_analyzer import VADParams
from pipecat.frames.frames import Frame, VADUserStoppedSpeakingFrame
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair, LLMUserAggregatorParams
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService

from pipelines.call_agent import CallAgent, SpeechToSpeechSettings
from pipelines.speech_adapter import SpeechStages
from pipelines.frames import CallerSpeechEndFrame
from pipelines.vad import SharedSessionSileroVAD

# pipecat always sends an Authorization header; a keyless server (a Cadence on loopback) ignores it.
NO_KEY = "none"


class SpeechEndMarker(FrameProcessor):
    """Where the caller's speech ended, for adapters without our STT: the VAD's own estimate
    (its decision time less its stop_secs), pushed on as the adapter vocabulary's mark."""

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, VADUserStoppedSpeakingFrame):
            await self.push_frame(CallerSpeechEndFrame(last_voiced_at=frame.timestamp - frame.stop_secs))
        await self.push_frame(frame, direction)


def openai_realtime_stages(remote: SpeechToSpeechSettings, *, agent: CallAgent, api_key: str | None,
                           vad_params: VADParams) -> SpeechStages:
    context = LLMContext(messages=[{"role": "system", "content": agent.system_prompt}])
    service = OpenAIRealtimeLLMService(
        api_key=api_key or NO_KEY,
        base_url=remote.base_url,
        settings=OpenAIRealtimeLLMService.Settings(model=remote.model, system_instruction=agent.system_prompt),
    )
    aggregators = LLMContextAggregatorPair(
        context, user_params=LLMUserAggregatorParams(vad_analyzer=SharedSessionSileroVAD(params=vad_params)))
    return SpeechStages(before_output=(SpeechEndMarker(), aggregators.user(), service),
                        after_output=(aggregators.assistant(),), context=context)
