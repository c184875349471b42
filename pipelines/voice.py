"""Assembles one call's voice pipeline:

    caller audio -> transport in -> STT -> user turn (Silero VAD + pause judge) -> retrieval -> LLM -> TTS
                 -> transport out -> assistant context (only what was spoken)

Engines are shared by all calls; everything built here belongs to one call, and follows
the call's agent as it was when the call started.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pipecat.audio.vad.vad_analyzer import VADParams
from pipecat.observers.base_observer import BaseObserver
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair, LLMUserAggregatorParams
from pipecat.transports.base_transport import BaseTransport
from pipecat.turns.user_start import VADUserTurnStartStrategy
from pipecat.turns.user_stop.speech_timeout_user_turn_stop_strategy import SpeechTimeoutUserTurnStopStrategy
from pipecat.turns.user_turn_strategies import UserTurnStrategies

from pipecat.frames.frames import TTSSpeakFrame

from agent.config import CadenceConfig
from models.base import ASREngine, EmbeddingEngine, LLMEngine, TTSEngine, TurnEndEngine
from pipelines.call_agent import CallAgent
from pipelines.eager_turn import EagerSpeechTimeoutStopStrategy
from pipelines.llm import EngineLLMService
from pipelines.pause_judge import PauseJudge
from pipelines.retrieval import RetrievalProcessor, SearchPassages
from pipelines.stt import EngineSTTService
from pipelines.tts import EngineTTSService, OrpheusTTSService
from pipelines.turn_observer import TurnObserver
from pipelines.turn_end import PauseVerdict
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
    embedder: EmbeddingEngine | None = None  # agents' knowledge search; None: no retrieval
    turn_end: TurnEndEngine | None = None  # the voice's end-of-turn judge; None: words alone

    def all(self) -> tuple:
        return tuple(e for e in (self.asr, self.llm, self.tts, self.embedder, self.turn_end) if e is not None)


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
    enable_rtvi: bool = False,
    observers: Sequence[BaseObserver] = (),
) -> VoiceCall:
    """`search` finds passages in the agent's knowledge; None (or retrieval off) skips retrieval.
    `observers` watch the call's frames beside the turn observer (a transport's own events)."""
    by_wanted = config.server.schedule == "wanted-by"
    # Judging pauses needs the words at the pause: the speculative transcript.
    judged = config.turn_end.enabled and agent.speculate_after_secs > 0
    eager = judged and config.turn_end.eager_reply
    longest_pause_s = max(config.turn_end.incomplete_pause_s, agent.vad_stop_secs)
    vad = PauseAwareSileroVAD(
        params=VADParams(
            confidence=config.vad.confidence,
            start_secs=config.vad.start_secs,
            # With a judge, the longest pause; each pause's verdict shortens it.
            stop_secs=longest_pause_s if judged else agent.vad_stop_secs,
            min_volume=config.vad.min_volume,
        ),
        # speculate_after_secs = 0 turns speculation off: a pause that never comes.
        pause_secs=agent.speculate_after_secs if agent.speculate_after_secs > 0 else float("inf"),
        on_pause=lambda: stt.speech_paused(),  # the STT, built below, listens to the VAD
        on_resume=lambda: stt.speech_resumed(),
    )
    judge = PauseJudge(options=config.turn_end, default_pause_s=agent.vad_stop_secs, allow_pause=vad.allow_pause,
                       engine=engines.turn_end, on_verdict=on_pause_verdict) if judged else None
    stt = EngineSTTService(engines.asr, max_segment_seconds=config.limits.max_user_turn_seconds,
                           speculation_lead_s=max(0.0, agent.vad_stop_secs - agent.speculate_after_secs)
                           if by_wanted else None,
                           partial_every_s=config.asr.partial_every_s, on_rejected=on_asr_rejected,
                           on_partial=on_partial, pause_judge=judge, eager_reply=eager)
    context = LLMContext(messages=[{"role": "system", "content": agent.system_prompt}])
    aggregators = LLMContextAggregatorPair(
        context,
        user_params=LLMUserAggregatorParams(
            vad_analyzer=vad,
            # End the turn on VAD silence plus a final transcript, with no further wait:
            # the VAD's silence already is the pause we allow, judged at each pause by the
            # words and the voice (pipecat's default instead adds an end-of-turn model that
            # can wait 3 s on a question it judges unfinished). With an eager reply, the
            # reply starts at the pause and is held until the turn ends.
            user_turn_strategies=UserTurnStrategies(
                start=[VADUserTurnStartStrategy()],
                stop=[EagerSpeechTimeoutStopStrategy(on_outcome=on_eager_reply) if eager
                      else SpeechTimeoutUserTurnStopStrategy(user_speech_timeout=0.0)],
            ),
        ),
    )
    llm = EngineLLMService(
        engines.llm,
        max_reply_tokens=agent.max_reply_tokens,
        max_history_messages=config.llm.max_history_messages,
        system_prompt=agent.system_prompt,
        sampling=agent.sampling,
        max_reply_sentences=agent.max_reply_sentences,
        on_redacted=on_redacted,
    )
    tts = tts_service(engines.tts, config, voice=agent.voice)
    output = transport.output()
    retrieval = []
    if search is not None and agent.retrieval.enabled:
        retrieval = [RetrievalProcessor(search, max_tokens=agent.retrieval.max_tokens,
                                        timeout_s=config.retrieval.timeout_ms / 1000.0, on_miss=on_retrieval_miss,
                                        on_prefetched=(lambda passages: llm.warm_for_passages(context, passages))
                                        if config.retrieval.warm_llm_on_guess else None)]
    pipeline = Pipeline([transport.input(), stt, aggregators.user(), *retrieval, llm, tts, output,
                         aggregators.assistant()])
    observer = TurnObserver(output_transport=output, on_turn_closed=on_turn_closed)
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


def tts_service(engine: TTSEngine, config: CadenceConfig, *, voice: str) -> EngineTTSService:
    """The agent's voice as a pipecat service: Orpheus (GPU) or the CPU voice."""
    by_wanted = config.server.schedule == "wanted-by"
    if config.tts.engine == "orpheus":
        from models.orpheus.prompt import EMOTION_TAGS

        return OrpheusTTSService(engine, voice=voice, model=config.tts.orpheus.model, emotion_tags=EMOTION_TAGS,
                                 schedule_by_playout=by_wanted)
    return EngineTTSService(engine, voice=voice, schedule_by_playout=by_wanted)
