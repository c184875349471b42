"""Assembles one call: the transport, the agent's speech adapter between its input and output
(pipelines/speech_adapter.py: the cascade, or a speech-to-speech model), the observers that
time each turn and tell its events, and the greeting.

    caller audio -> transport in -> [adapter] -> transport out -> [adapter: what was spoken]

Engines are shared by all calls; everything built here belongs to one call, and follows
the call's agent as it was when the call started.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipecat.audio.vad.vad_analyzer import VADParams
from pipecat.frames.frames import TTSSpeakFrame
from pipecat.observers.base_observer import BaseObserver
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.transports.base_transport import BaseTransport

from pipelines.call_agent import CallAgent
from pipelines.call_events import CallEvents
from pipelines.caller_audio import CallerAudioMeter
from pipelines.cascade import cascade_stages
from pipelines.options import CallOptions
from pipelines.retrieval import SearchPassages
from pipelines.speech_adapter import Engines, SpeechStages
from pipelines.turn_observer import TurnObserver

# The pipeline's input runs at Whisper's rate: feeding it 8 kHz telephone audio unconverted
# yields no transcript at all (see FACTS: pipecat's Twilio example pitfall).
PIPELINE_INPUT_SAMPLE_RATE = 16_000


@dataclass(frozen=True)
class VoiceCall:
    task: PipelineWorker
    observer: TurnObserver
    context: LLMContext


@dataclass(frozen=True)
class CallerLine:
    """The caller's side of a call: how their audio comes and goes."""

    transport: BaseTransport
    output_sample_rate: int  # the rate the transport sends the caller (8 kHz on a phone)
    enable_rtvi: bool = False  # the client speaks RTVI (pipecat's client protocol)
    observers: Sequence[BaseObserver] = ()  # the transport's own watchers of the call's frames


@dataclass(frozen=True)
class AgentReach:
    """What the call's agent reaches beyond the shared engines."""

    search: SearchPassages | None = None  # finds passages in its knowledge; None (or retrieval off): none
    remote_api_key: str | None = None  # the key of its speech-to-speech server, if it uses one


def build_voice_call(line: CallerLine, *, engines: Engines, options: CallOptions, agent: CallAgent,
                     events: CallEvents, reach: AgentReach = AgentReach()) -> VoiceCall:
    """One call's pipeline, ready to run; `events` hears what happens in it beside the frames."""
    transport = line.transport
    stages = speech_stages(engines=engines, options=options, agent=agent, reach=reach, events=events)
    context = stages.context
    output = transport.output()
    pipeline = Pipeline([transport.input(), *stages.before_output, output, *stages.after_output])
    observer = TurnObserver(output_transport=output, on_turn_closed=events.turn_closed)
    task = PipelineWorker(
        pipeline,
        params=PipelineParams(
            audio_in_sample_rate=PIPELINE_INPUT_SAMPLE_RATE,
            audio_out_sample_rate=line.output_sample_rate,
            enable_metrics=True,
        ),
        observers=[observer, *line.observers, CallerAudioMeter(transport.input(), events.caller_audio)],
        idle_timeout_secs=agent.idle_timeout_seconds,
        enable_rtvi=line.enable_rtvi,
    )
    if agent.greeting:
        greeting = agent.greeting

        @transport.event_handler("on_client_connected")
        async def _greet(_transport, _client) -> None:
            # Through TTS like any reply: the assistant aggregator keeps what was spoken of it.
            await task.queue_frames([TTSSpeakFrame(greeting)])

    return VoiceCall(task=task, observer=observer, context=context)


def speech_stages(*, engines: Engines, options: CallOptions, agent: CallAgent, reach: AgentReach,
                  events: CallEvents) -> SpeechStages:
    """The agent's adapter: the cascade here, or a speech-to-speech model elsewhere."""
    if agent.pipeline == "openai-realtime" and agent.speech_to_speech is not None:
        from pipelines.openai_realtime import openai_realtime_stages

        vad = VADParams(confidence=options.vad.confidence, start_secs=options.vad.start_secs,
                        stop_secs=agent.vad_stop_secs, min_volume=options.vad.min_volume)
        return openai_realtime_stages(agent.speech_to_speech, agent=agent, api_key=reach.remote_api_key, vad_params=vad)
    return cascade_stages(engines=engines, options=options, agent=agent, search=reach.search, events=events)
