"""The cascade, behind the speech adapter interface (pipelines/speech_adapter.py):

    caller audio -> STT -> user turn (Silero VAD + pause judge) -> retrieval -> LLM -> TTS
    -> [the transport's output] -> assistant context (only what was spoken)

Beside the frames, the caller's pauses link three stages: the VAD (inside the user turn's
aggregator, after the STT) hears each pause and tells the STT (`PauseListener`), which
transcribes the turn so far at once and has the pause judge decide how long this pause may
be; the judge tells the VAD (`PauseAllowance`). Everything else goes by frames
(pipelines/frames.py). What the server counts of a call goes to its `CallEvents`.

Engines are shared by all calls; every processor built here belongs to one call.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from pipecat.audio.vad.vad_analyzer import VADParams
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair, LLMUserAggregatorParams
from pipecat.turns.user_start import VADUserTurnStartStrategy
from pipecat.turns.user_stop.speech_timeout_user_turn_stop_strategy import SpeechTimeoutUserTurnStopStrategy
from pipecat.turns.user_turn_strategies import UserTurnStrategies

from models.base import TTSEngine
from pipelines.call_agent import CallAgent
from pipelines.call_events import CallEvents
from pipelines.dialogue_context import DialogueContext
from pipelines.eager_turn import EagerSpeechTimeoutStopStrategy
from pipelines.llm import EngineLLMService
from pipelines.options import CallOptions
from pipelines.pause_judge import PauseJudge
from pipelines.retrieval import RetrievalProcessor, SearchPassages
from pipelines.speech_adapter import Engines, SpeechStages
from pipelines.stt import EngineSTTService
from pipelines.tts import EngineTTSService, OrpheusTTSService
from pipelines.vad import PauseAwareSileroVAD


def cascade_stages(*, engines: Engines, options: CallOptions, agent: CallAgent, search: SearchPassages | None,
                   events: CallEvents) -> SpeechStages:
    """`search` finds passages in the agent's knowledge; None (or retrieval off) skips retrieval."""
    # Judging pauses needs the words at the pause: the speculative transcript.
    judged = options.pauses.judged and agent.speculate_after_secs > 0
    eager = judged and options.pauses.eager_reply
    vad = _vad(options, agent, judged=judged)
    stt = _stt(engines, options, agent, events, vad=vad, judged=judged, eager=eager)
    vad.report_pauses_to(stt)
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
                stop=[EagerSpeechTimeoutStopStrategy(on_outcome=events.eager_reply) if eager
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
        on_redacted=events.redacted,
        stall_limits=options.llm_stall_limits,
        on_failed=partial(events.model_failed, "llm"),
    )
    tts = tts_service(engines.tts, options, voice=agent.voice, on_failed=partial(events.model_failed, "tts"))
    retrieval = []
    if search is not None and agent.retrieval.enabled:
        # Passages found early go on to the LLM (PrefetchedPassagesFrame) with the call's context.
        retrieval = [RetrievalProcessor(search, max_tokens=agent.retrieval.max_tokens,
                                        timeout_s=options.retrieval_timeout_s, on_miss=events.retrieval_missed,
                                        warm_llm_with=context if options.warm_llm_on_guess else None)]
    return SpeechStages(before_output=(stt, aggregators.user(), *retrieval, llm, tts),
                        after_output=(aggregators.assistant(),), context=context)


def _vad(options: CallOptions, agent: CallAgent, *, judged: bool) -> PauseAwareSileroVAD:
    longest_pause_s = max(options.pauses.limits.incomplete_pause_s, agent.vad_stop_secs)
    return PauseAwareSileroVAD(
        params=VADParams(
            confidence=options.vad.confidence,
            start_secs=options.vad.start_secs,
            # With a judge, the longest pause; each pause's verdict shortens it.
            stop_secs=longest_pause_s if judged else agent.vad_stop_secs,
            min_volume=options.vad.min_volume,
        ),
        # speculate_after_secs = 0 turns speculation off: a pause that never comes.
        pause_secs=agent.speculate_after_secs if agent.speculate_after_secs > 0 else float("inf"),
    )


def _stt(engines: Engines, options: CallOptions, agent: CallAgent, events: CallEvents, *, vad: PauseAwareSileroVAD,
         judged: bool, eager: bool) -> EngineSTTService:
    judge = PauseJudge(options=options.pauses.limits, default_pause_s=agent.vad_stop_secs, allowance=vad,
                       engine=engines.turn_end, on_verdict=events.pause_verdict) if judged else None
    lead_s = max(0.0, agent.vad_stop_secs - agent.speculate_after_secs) if options.schedule_by_wanted else None
    return EngineSTTService(engines.asr, options.stt(speculation_lead_s=lead_s, eager_reply=eager),
                            events=events, pause_judge=judge)


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
