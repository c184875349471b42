"""Assembles one call: the transport, the agent's speech adapter between its input and output
(pipelines/speech_adapter.py: the cascade, or a speech-to-speech model), the observers that
time each turn and tell its events, and the greeting.

    caller audio -> transport in -> [adapter] -> transport out -> [adapter: what was spoken]

Engines are shared by all calls; everything built here belongs to one call, and follows
the call's agent as it was when the call started.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pipecat.audio.vad.vad_analyzer import VADParams
from pipecat.frames.frames import TTSSpeakFrame
from pipecat.observers.base_observer import BaseObserver
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.transports.base_transport import BaseTransport

from pipelines.call_agent import CallAgent
from pipelines.caller_audio import CallerAudioMeter
from pipelines.cascade import cascade_stages
from pipelines.options import CallOptions
from pipelines.retrieval import SearchPassages
from pipelines.speech_adapter import CallHooks, Engines, SpeechStages
from pipelines.turn_end import PauseVerdict
from pipelines.turn_observer import TurnObserver
from pipelines.turn_timeline import Turn

# The pipeline's input runs at Whisper's rate: feeding it 8 kHz telephone audio unconverted
# yields no transcript at all (see FACTS: pipecat's Twilio example pitfall).
PIPELINE_INPUT_SAMPLE_RATE = 16_000


@dataclass(frozen=True)
class VoiceCall:
    task: PipelineWorker
    observer: TurnObserver
    context: LLMContext


def build_voice_call(
    transport: BaseTransport,
    *,
    engines: Engines,
    options: CallOptions,
    agent: CallAgent,
    output_sample_rate: int,
    on_turn_closed: Callable[[Turn], None],
    search: SearchPassages | None = None,
    on_retrieval_miss: Callable[[str], None] = lambda reason: None,
    on_redacted: Callable[[int], None] = lambda count: None,
    on_asr_rejected: Callable[[str], None] = lambda reason: None,
    on_partial: Callable[[str], None] = lambda text: None,
    on_pause_verdict: Callable[[PauseVerdict], None] = lambda verdict: None,
    on_eager_reply: Callable[[str], None] = lambda outcome: None,
    on_long_turn_cut: Callable[[float], None] = lambda seconds: None,
    on_model_failure: Callable[[str, str], None] = lambda model, kind: None,
    on_caller_audio: Callable[[float], None] | None = None,
    enable_rtvi: bool = False,
    observers: Sequence[BaseObserver] = (),
    remote_api_key: str | None = None,
) -> VoiceCall:
    """`search` finds passages in the agent's knowledge; None (or retrieval off) skips retrieval.
    `observers` watch the call's frames beside the turn observer (a transport's own events).
    `remote_api_key`: the key of the agent's speech-to-speech server, if it uses one.
    `on_caller_audio(seconds)`: for each frame of the caller's audio that reached the pipeline."""
    hooks = CallHooks(on_retrieval_miss=on_retrieval_miss, on_redacted=on_redacted, on_asr_rejected=on_asr_rejected,
                      on_partial=on_partial, on_pause_verdict=on_pause_verdict, on_eager_reply=on_eager_reply,
                      on_long_turn_cut=on_long_turn_cut, on_model_failure=on_model_failure)
    stages = speech_stages(engines=engines, options=options, agent=agent, search=search, hooks=hooks,
                           remote_api_key=remote_api_key)
    context = stages.context
    output = transport.output()
    pipeline = Pipeline([transport.input(), *stages.before_output, output, *stages.after_output])
    observer = TurnObserver(output_transport=output, on_turn_closed=on_turn_closed)
    if on_caller_audio is not None:
        observers = [*observers, CallerAudioMeter(transport.input(), on_caller_audio)]
    task = PipelineWorker(
        pipeline,
        params=PipelineParams(
            audio_in_sample_rate=PIPELINE_INPUT_SAMPLE_RATE,
            audio_out_sample_rate=output_sample_rate,
            enable_metrics=True,
        ),
        observers=[observer, *observers],
        idle_timeout_secs=agent.idle_timeout_seconds,
        enable_rtvi=enable_rtvi,
    )
    if agent.greeting:
        greeting = agent.greeting

        @transport.event_handler("on_client_connected")
        async def _greet(_transport, _client) -> None:
            # Through TTS like any reply: the assistant aggregator keeps what was spoken of it.
            await task.queue_frames([TTSSpeakFrame(greeting)])

    return VoiceCall(task=task, observer=observer, context=context)


def speech_stages(*, engines: Engines, options: CallOptions, agent: CallAgent, search: SearchPassages | None,
                  hooks: CallHooks, remote_api_key: str | None) -> SpeechStages:
    """The agent's adapter: the cascade here, or a speech-to-speech model elsewhere."""
    if agent.pipeline == "openai-realtime" and agent.speech_to_speech is not None:
        from pipelines.openai_realtime import openai_realtime_stages

        vad = VADParams(confidence=options.vad.confidence, start_secs=options.vad.start_secs,
                        stop_secs=agent.vad_stop_secs, min_volume=options.vad.min_volume)
        return openai_realtime_stages(agent.speech_to_speech, agent=agent, api_key=remote_api_key, vad_params=vad)
    return cascade_stages(engines=engines, options=options, agent=agent, search=search, hooks=hooks)
