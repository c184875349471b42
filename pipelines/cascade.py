"""The cascade, behind the speech adapter interface (pipelines/speech_adapter.py):

    caller audio -> STT -> user turn (Silero VAD + pause judge) -> retrieval -> LLM -> TTS
    -> [the transport's output] -> assistant context (only what was spoken)

Engines are shared by all calls; every processor built here belongs to one call.
"""

from __future__ import annotations

from collections.abc import Callable

from pipecat.audio.vad.vad_analyzer import VADParams
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair, LLMUserAggregatorParams
from pipecat.turns.user_start import VADUserTurnStartStrategy
from pipecat.turns.user_stop.speech_timeout_user_turn_stop_strategy import SpeechTimeoutUserTurnStopStrategy
from pipecat.turns.user_turn_strategies import UserTurnStrategies

from pipelines.call_agent import CallAgent
from pipelines.dialogue_context import DialogueContext
from pipelines.eager_turn import EagerSpeechTimeoutStopStrategy
from pipelines.llm import EngineLLMService
from pipelines.options import CallOptions
from pipelines.pause_judge import PauseJudge
from pipelines.retrieval import RetrievalProcessor, SearchPassages
from pipelines.speech_adapter import CallHooks, Engines, SpeechStages
from pipelines.stt import EngineSTTService
from pipelines.tts import EngineTTSService, OrpheusTTSService
from models.base import TTSEngine
from pipelines.vad import PauseAwareSileroVAD


def cascade_stages(*, engines: Engines, options: CallOptions, agent: CallAgent, search: SearchPassages | None,
                   hooks: CallHooks) -> SpeechStages:
    """`search` finds passages in the agent's knowledge; None (or retrieval off) skips retrieval."""
    by_wanted = options.schedule_by_wanted
    # Judging pauses needs the words at the pause: the speculative transcript.
    judged = options.pauses.judged and agent.speculate_after_secs > 0
    eager = judged and options.pauses.eager_reply
    longest_pause_s = max(options.pauses.limits.incomplete_pause_s, agent.vad_stop_secs)
    vad = PauseAwareSileroVAD(
        params=VADParams(
            confidence=options.vad.confidence,
            start_secs=options.vad.start_secs,
            # With a judge, the longest pause; each pause's verdict shortens it.
            stop_secs=longest_pause_s if judged else agent.vad_stop_secs,
            min_volume=options.vad.min_volume,
        ),
        # speculate_after_secs = 0 turns speculation off: a pause that never comes.
        pause_secs=agent.speculate_after_secs if agent.speculate_after_secs > 0 else float("inf"),
        on_pause=lambda: stt.speech_paused(),  # the STT, built below, listens to the VAD
        on_resume=lambda: stt.speech_resumed(),
    )
    judge = PauseJudge(options=options.pauses.limits, default_pause_s=agent.vad_stop_secs, allow_pause=vad.allow_pause,
                       engine=engines.turn_end, on_verdict=hooks.on_pause_verdict) if judged else None
    stt = EngineSTTService(engines.asr, max_segment_seconds=options.max_user_turn_seconds,
                           speculation_lead_s=max(0.0, agent.vad_stop_secs - agent.speculate_after_secs)
                           if by_wanted else None,
                           partial_every_s=options.partial_every_s, on_rejected=hooks.on_asr_rejected,
                           on_long_turn_cut=hooks.on_long_turn_cut,
                           on_partial=hooks.on_partial, pause_judge=judge, eager_reply=eager,
                           transcript_deadline_s=options.transcript_deadline.seconds_for,
                           on_lost=lambda kind: hooks.on_model_failure("asr", kind))
    # Bounded to the dialogue the prompt window can still reach (pipelines/dialogue_context.py).
    context = DialogueContext(messages=[{"role": "system", "content": agent.system_prompt}],
                              max_history_messages=options.max_history_messages)
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
                stop=[EagerSpeechTimeoutStopStrategy(on_outcome=hooks.on_eager_reply) if eager
                      else SpeechTimeoutUserTurnStopStrategy(user_speech_timeout=0.0)],
            ),
        ),
    )
    llm = EngineLLMService(
        engines.llm,
        max_reply_tokens=agent.max_reply_tokens,
        max_history_messages=options.max_history_messages,
        max_dialogue_chars=agent.max_dialogue_chars,
        system_prompt=agent.system_prompt,
        sampling=agent.sampling,
        max_reply_sentences=agent.max_reply_sentences,
        on_redacted=hooks.on_redacted,
        stall_limits=options.llm_stall_limits,
        on_failed=lambda kind: hooks.on_model_failure("llm", kind),
    )
    tts = tts_service(engines.tts, options, voice=agent.voice, on_failed=lambda kind: hooks.on_model_failure("tts", kind))
    retrieval = []
    if search is not None and agent.retrieval.enabled:
        retrieval = [RetrievalProcessor(search, max_tokens=agent.retrieval.max_tokens,
                                        timeout_s=options.retrieval_timeout_s, on_miss=hooks.on_retrieval_miss,
                                        on_prefetched=(lambda passages: llm.warm_for_passages(context, passages))
                                        if options.warm_llm_on_guess else None)]
    return SpeechStages(before_output=(stt, aggregators.user(), *retrieval, llm, tts),
                        after_output=(aggregators.assistant(),), context=context)


def tts_service(engine: TTSEngine, options: CallOptions, *, voice: str,
                on_failed: Callable[[str], None] = lambda kind: None) -> EngineTTSService:
    """The agent's voice as a pipecat service: Orpheus (GPU) or the CPU voice."""
    by_wanted = options.schedule_by_wanted
    if options.orpheus_model is not None:
        from models.orpheus.prompt import EMOTION_TAGS

        return OrpheusTTSService(engine, voice=voice, model=options.orpheus_model, emotion_tags=EMOTION_TAGS,
                                 schedule_by_playout=by_wanted, stall_limits=options.tts_stall_limits, on_failed=on_failed)
    return EngineTTSService(engine, voice=voice, schedule_by_playout=by_wanted, stall_limits=options.tts_stall_limits,
                            on_failed=on_failed)
