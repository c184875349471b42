"""Assembles one call's voice pipeline:

    caller audio -> transport in -> STT -> user turn (Silero VAD) -> LLM -> TTS
                 -> transport out -> assistant context (only what was spoken)

Engines are shared by all calls; everything built here belongs to one call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipecat.audio.vad.vad_analyzer import VADParams
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair, LLMUserAggregatorParams
from pipecat.transports.base_transport import BaseTransport
from pipecat.turns.user_start import VADUserTurnStartStrategy
from pipecat.turns.user_stop.speech_timeout_user_turn_stop_strategy import SpeechTimeoutUserTurnStopStrategy
from pipecat.turns.user_turn_strategies import UserTurnStrategies

from agent.config import CadenceConfig
from models.base import ASREngine, LLMEngine, TTSEngine
from pipelines.llm import EngineLLMService
from pipelines.stt import EngineSTTService
from pipelines.tts import EngineTTSService, OrpheusTTSService
from pipelines.turn_observer import TurnObserver
from pipelines.turn_timeline import Turn
from pipelines.vad import PauseAwareSileroVAD

# The pipeline's input runs at Whisper's rate: feeding it 8 kHz telephone audio unconverted
# yields no transcript at all (see FACTS: pipecat's Twilio example pitfall).
PIPELINE_INPUT_SAMPLE_RATE = 16_000


@dataclass(frozen=True)
class Engines:
    asr: ASREngine
    llm: LLMEngine
    tts: TTSEngine


@dataclass(frozen=True)
class VoiceCall:
    task: PipelineWorker
    observer: TurnObserver
    context: LLMContext


def build_voice_call(
    transport: BaseTransport,
    *,
    engines: Engines,
    config: CadenceConfig,
    output_sample_rate: int,
    on_turn_closed: Callable[[Turn], None],
    enable_rtvi: bool = False,
) -> VoiceCall:
    stt = EngineSTTService(engines.asr, max_segment_seconds=config.limits.max_user_turn_seconds)
    vad = PauseAwareSileroVAD(
        params=VADParams(
            confidence=config.vad.confidence,
            start_secs=config.vad.start_secs,
            stop_secs=config.vad.stop_secs,
            min_volume=config.vad.min_volume,
        ),
        # speculate_after_secs = 0 turns speculation off: a pause that never comes.
        pause_secs=config.asr.speculate_after_secs if config.asr.speculate_after_secs > 0 else float("inf"),
        on_pause=stt.speech_paused,
        on_resume=stt.speech_resumed,
    )
    context = LLMContext(messages=[{"role": "system", "content": config.agent.system_prompt}])
    aggregators = LLMContextAggregatorPair(
        context,
        user_params=LLMUserAggregatorParams(
            vad_analyzer=vad,
            # End the turn on VAD silence plus a final transcript, with no further wait:
            # the VAD's stop_secs already is the pause we allow (pipecat's default adds
            # an end-of-turn model that can wait 3 s on a question it judges unfinished).
            user_turn_strategies=UserTurnStrategies(
                start=[VADUserTurnStartStrategy()],
                stop=[SpeechTimeoutUserTurnStopStrategy(user_speech_timeout=0.0)],
            ),
        ),
    )
    llm = EngineLLMService(
        engines.llm,
        max_reply_tokens=config.llm.max_reply_tokens,
        max_history_messages=config.llm.max_history_messages,
    )
    tts = tts_service(engines.tts, config)
    output = transport.output()
    pipeline = Pipeline([transport.input(), stt, aggregators.user(), llm, tts, output, aggregators.assistant()])
    observer = TurnObserver(output_transport=output, on_turn_closed=on_turn_closed)
    task = PipelineWorker(
        pipeline,
        params=PipelineParams(
            audio_in_sample_rate=PIPELINE_INPUT_SAMPLE_RATE,
            audio_out_sample_rate=output_sample_rate,
            enable_metrics=True,
        ),
        observers=[observer],
        idle_timeout_secs=config.limits.idle_timeout_seconds,
        enable_rtvi=enable_rtvi,
    )
    return VoiceCall(task=task, observer=observer, context=context)


def tts_service(engine: TTSEngine, config: CadenceConfig) -> EngineTTSService:
    """The agent's voice as a pipecat service: Orpheus (GPU) or the CPU voice."""
    if config.tts.engine == "orpheus":
        from models.orpheus.prompt import EMOTION_TAGS

        orpheus = config.tts.orpheus
        return OrpheusTTSService(engine, voice=orpheus.voice, model=orpheus.model, emotion_tags=EMOTION_TAGS)
    return EngineTTSService(engine, voice=config.tts.voice)
