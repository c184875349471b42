"""Turn end: the pause policy on its own, the VAD that applies it, the STT's judge at a
pause (scripted engines in pipecat's harness), the eager reply's stop strategy, and the
real Smart Turn weights."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np
import pytest
from pipecat.frames.frames import (
    DataFrame, EagerEndOfTurnCancelFrame, EagerTranscriptionFrame, Frame, LLMFullResponseEndFrame, LLMTextFrame,
    TranscriptionFrame,
    UserStoppedSpeakingFrame, VADUserStartedSpeakingFrame, VADUserStoppedSpeakingFrame)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.processors.frame_processor import FrameProcessor
from pipecat.tests.utils import run_test

from models.base import TurnEndEngine
from pipelines.pause_judge import PauseJudge
from pipelines.options import STTOptions
from pipelines.stt import EngineSTTService
from pipelines.turn_end import PauseVerdict, TurnEndOptions, judge_pause, words_state
from tests.fakes import ScriptedASR, ScriptedLLM
from tests.test_processors import PauseMarker, PauseSignals, speech

OPTIONS = TurnEndOptions(complete_pause_s=0.2, incomplete_pause_s=1.0)


@pytest.mark.parametrize("text, state", [
    ("What are your opening hours on Saturday?", "finished"),
    ("Thanks, that's all.", "finished"),
    ("What is it for?", "finished"),  # a wh-question may end on a preposition
    ("Can you tell me what the capital city of France is?", "finished"),  # a question may end on "is"
    ("I need to change the delivery address for", "unfinished"),
    ("Can you tell me about?", "unfinished"),  # Whisper's "?" on a fragment said with a rising voice
    ("My order number is...", "unfinished"),
    ("my order number is", "unfinished"),
    ("I would like to", "unfinished"),
    ("I want two pizzas and", "unfinished"),
    ("So the thing is,", "unfinished"),
    ("I need to change the delivery address for my order from last week.", "finished"),
    ("book a table", "unknown"),  # no closing mark: the words cannot say
    ("", "unknown"),
])
def test_the_words_say_whether_a_turn_is_finished(text, state):
    assert words_state(text) == state


def test_only_words_and_voice_together_shorten_a_pause():
    verdict = lambda words, voice: judge_pause(words, voice, default_pause_s=0.4, options=OPTIONS)  # noqa: E731
    assert verdict("Where is my package?", 0.9) == PauseVerdict(0.2, "finished")
    assert verdict("Where is my package?", 0.1) == PauseVerdict(0.4, "undecided")  # the voice is not sure
    assert verdict("Where is my package?", None) == PauseVerdict(0.4, "undecided")  # no voice judge
    assert verdict("I need to change the delivery address for", 0.99) == PauseVerdict(1.0, "words_unfinished")
    assert verdict("book a table", 0.2) == PauseVerdict(1.0, "voice_unfinished")
    assert verdict("book a table", 0.9) == PauseVerdict(0.4, "undecided")
    assert verdict(None, 0.1) == PauseVerdict(1.0, "voice_unfinished")
    assert verdict(None, None) == PauseVerdict(0.4, "undecided")
    # An agent whose own pause is shorter than the policy's short one keeps its own.
    assert judge_pause("Hi.", 0.9, default_pause_s=0.1, options=OPTIONS) == PauseVerdict(0.1, "finished")


def test_options_are_checked():
    with pytest.raises(ValueError):
        TurnEndOptions(complete_pause_s=1.2, incomplete_pause_s=1.0)
    with pytest.raises(ValueError):
        TurnEndOptions(complete_probability=1.0)


async def test_the_vad_ends_a_pause_at_the_length_it_is_allowed():
    from latency_bench.callers.audio import resample, speak
    from pipecat.audio.vad.vad_analyzer import VADParams, VADState
    from pipelines.vad import PauseAwareSileroVAD

    from latency_bench.callers.speech import trim_silence

    samples, rate = speak("Where is my package?")
    voice = trim_silence(resample(samples, rate, 16_000), 16_000).tobytes()
    silence = bytes(32_000 * 2)  # 2 s

    async def quiet_after(allowance_s: float | None) -> float:
        """Seconds of silence the VAD heard before the turn ended."""
        class Judge:  # at the pause, a verdict (as the STT's pause judge gives one)
            def speech_paused(self) -> None:
                if allowance_s is not None:
                    vad.allow_pause(allowance_s)

            def speech_resumed(self) -> None:
                pass

        vad = PauseAwareSileroVAD(params=VADParams(stop_secs=1.0), sample_rate=16_000, pause_secs=0.1)
        vad.report_pauses_to(Judge())
        vad.set_sample_rate(16_000)
        chunk = 640  # 20 ms
        for i in range(0, len(voice), chunk):
            await vad.analyze_audio(voice[i : i + chunk])
        for i in range(0, len(silence), chunk):
            if await vad.analyze_audio(silence[i : i + chunk]) == VADState.QUIET:
                return (i + chunk) / 32_000
        raise AssertionError("the turn never ended")

    # (Silero's confidence trails the audio by ~0.1 s: the VAD's silence starts that late.)
    longest, short = await quiet_after(None), await quiet_after(0.2)
    assert longest == pytest.approx(1.0, abs=0.15)  # no verdict: the longest pause
    assert short == pytest.approx(0.2, abs=0.15)
    # A verdict shorter than the pause already heard (0.1 s when it comes) ends it at once.
    assert await quiet_after(0.05) <= short


class ScriptedVoice(TurnEndEngine):
    """Hears every turn as finished with the given probability."""

    def __init__(self, probability: float) -> None:
        self.probability = probability
        self.heard: list[bytes] = []

    def load(self) -> None:
        pass

    async def probability_complete(self, pcm16: bytes) -> float:
        self.heard.append(pcm16)
        return self.probability


class Allowed(list):
    """The pauses a judge allowed, in order (it stands for the VAD)."""

    def allow_pause(self, seconds: float) -> None:
        self.append(seconds)


def judged_stt(text: str, probability: float, *, eager: bool = False):
    allowed = Allowed()
    verdicts: list[PauseVerdict] = []
    voice = ScriptedVoice(probability)
    judge = PauseJudge(options=OPTIONS, default_pause_s=0.4, allowance=allowed, engine=voice,
                       on_verdict=verdicts.append)
    stt = EngineSTTService(ScriptedASR(text), STTOptions(max_segment_seconds=30, eager_reply=eager), pause_judge=judge)
    return stt, voice, allowed, verdicts


async def test_at_a_pause_the_judge_hears_the_turn_and_tells_the_vad_how_long_to_wait():
    stt, voice, allowed, verdicts = judged_stt("Where is my package?", 0.93)
    frames = [VADUserStartedSpeakingFrame(), *speech(30), PauseMarker(), *speech(5),
              VADUserStoppedSpeakingFrame(stop_secs=1.0)]
    await run_test(Pipeline([PauseSignals(stt), stt]), frames_to_send=frames)
    assert verdicts == [PauseVerdict(0.2, "finished")] and allowed == [0.2]
    assert voice.heard == stt._engine.heard  # the voice heard what Whisper heard, once, at the pause


async def test_an_unfinished_sentence_gets_the_long_pause():
    stt, _voice, allowed, verdicts = judged_stt("I need to change the delivery address for", 0.98)
    frames = [VADUserStartedSpeakingFrame(), *speech(100), PauseMarker(), *speech(5),
              VADUserStoppedSpeakingFrame(stop_secs=1.0)]
    await run_test(Pipeline([PauseSignals(stt), stt]), frames_to_send=frames)
    assert verdicts == [PauseVerdict(1.0, "words_unfinished")] and allowed == [1.0]


async def test_a_verdict_for_a_pause_the_caller_ended_by_speaking_is_not_applied():
    engine_gate = asyncio.Event()

    class SlowASR(ScriptedASR):
        async def transcribe(self, pcm16, *, prompt=None):
            await engine_gate.wait()
            return await super().transcribe(pcm16, prompt=prompt)

    allowed = Allowed()
    judge = PauseJudge(options=OPTIONS, default_pause_s=0.4, allowance=allowed, engine=ScriptedVoice(0.9))
    stt = EngineSTTService(SlowASR("Where is my package?"), STTOptions(max_segment_seconds=30), pause_judge=judge)
    frames = [VADUserStartedSpeakingFrame(), *speech(30), PauseMarker(), PauseMarker(resumed=True), *speech(5)]
    await run_test(Pipeline([PauseSignals(stt), stt]), frames_to_send=frames)
    engine_gate.set()
    assert allowed == [] and stt.speculations_dropped == 1


async def test_eager_reply_the_speculative_transcript_goes_out_at_the_pause_and_is_withdrawn_if_the_caller_goes_on():
    stt, _voice, _allowed, _verdicts = judged_stt("please book a table for four", 0.9, eager=True)
    frames = [VADUserStartedSpeakingFrame(), *speech(100), PauseMarker(), *speech(3), PauseMarker(resumed=True),
              *speech(60), VADUserStoppedSpeakingFrame(stop_secs=1.0)]
    down, _ = await run_test(Pipeline([PauseSignals(stt), stt]), frames_to_send=frames)
    kinds = [type(f) for f in down if isinstance(f, (EagerTranscriptionFrame, EagerEndOfTurnCancelFrame,
                                                     TranscriptionFrame))]
    assert kinds == [EagerTranscriptionFrame, EagerEndOfTurnCancelFrame, TranscriptionFrame]


async def test_eager_reply_is_not_withdrawn_when_the_turn_ends_at_the_pause():
    stt, _voice, _allowed, _verdicts = judged_stt("Where is my package?", 0.9, eager=True)
    frames = [VADUserStartedSpeakingFrame(), *speech(30), PauseMarker(), *speech(3),
              VADUserStoppedSpeakingFrame(stop_secs=1.0)]
    down, _ = await run_test(Pipeline([PauseSignals(stt), stt]), frames_to_send=frames)
    kinds = [type(f) for f in down if isinstance(f, (EagerTranscriptionFrame, EagerEndOfTurnCancelFrame,
                                                     TranscriptionFrame))]
    assert kinds == [EagerTranscriptionFrame, TranscriptionFrame]
    assert not stt.eager_end_of_turn_pending  # settled by the turn's end


async def test_the_real_smart_turn_weights_load_checked_and_judge_off_the_event_loop():
    from models.smart_turn import WINDOW_SECONDS, SmartTurnEngine, SmartTurnOptions, last_window

    engine = SmartTurnEngine(SmartTurnOptions())
    engine.load()  # the ONNX file inside pipecat's wheel, checked against its recorded sha256
    try:
        from latency_bench.callers.audio import resample, speak

        samples, rate = speak("Where is my package?")
        pcm = resample(samples, rate, 16_000).tobytes()
        first, second = await asyncio.gather(engine.probability_complete(pcm), engine.probability_complete(pcm))
        assert 0.0 <= first <= 1.0 and first == pytest.approx(second)
        assert 0.0 <= await engine.probability_complete(bytes(2 * 16_000 * 12)) <= 1.0  # longer than its window
    finally:
        await engine.close()
    padded = last_window(np.ones(16_000, dtype=np.float32))
    assert len(padded) == WINDOW_SECONDS * 16_000 and padded[0] == 0 and padded[-1] == 1
    assert len(last_window(np.ones(20 * 16_000, dtype=np.float32))) == WINDOW_SECONDS * 16_000


async def test_smart_turn_used_before_load_says_so():
    from models.errors import ModelAssetError
    from models.smart_turn import SmartTurnEngine, SmartTurnOptions

    engine = SmartTurnEngine(SmartTurnOptions())
    with pytest.raises(ModelAssetError, match="before load"):
        await engine.probability_complete(bytes(3200))
    await engine.close()


# --- the eager reply through pipecat's user aggregator and our LLM service ---------------

class RecordingLLM(ScriptedLLM):
    """Says its pieces; `answered` is set each time a reply has been fully generated."""

    def __init__(self, pieces) -> None:
        super().__init__(pieces)
        self.answered = asyncio.Event()

    async def stream_chat(self, messages, *, max_tokens, sampling=None):
        async for piece in super().stream_chat(messages, max_tokens=max_tokens, sampling=sampling):
            yield piece
        self.answered.set()


@dataclass
class AwaitReply(DataFrame):
    """Holds the caller's next frames until the LLM has generated a reply (held or not). A
    data frame: a system frame would overtake the data frames sent before it."""


@dataclass
class InOrder(DataFrame):
    """Carries a system frame in the data frames' order (it would overtake them otherwise)."""

    frame: Frame | None = None


@dataclass
class AwaitSpoken(DataFrame):
    """Holds the caller's next frames until a reply has come out of the LLM service."""


class ReplyOut(FrameProcessor):
    def __init__(self) -> None:
        super().__init__()
        self.event = asyncio.Event()

    async def process_frame(self, frame, direction):
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMFullResponseEndFrame):
            self.event.set()
        await self.push_frame(frame, direction)


class HoldForReply(FrameProcessor):
    def __init__(self, llm: RecordingLLM, out: ReplyOut) -> None:
        super().__init__()
        self._llm = llm
        self._out = out

    async def process_frame(self, frame, direction):
        await super().process_frame(frame, direction)
        if isinstance(frame, (AwaitReply, AwaitSpoken)):
            event = self._llm.answered if isinstance(frame, AwaitReply) else self._out.event
            await asyncio.wait_for(event.wait(), 10)
            event.clear()
            return
        if isinstance(frame, InOrder):
            await self.push_frame(frame.frame, direction)
            return
        await self.push_frame(frame, direction)


async def run_eager_turn(frames: list, *, outcomes: list[str]):
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.aggregators.llm_response_universal import (
        LLMContextAggregatorPair, LLMUserAggregatorParams)
    from pipecat.turns.user_start import VADUserTurnStartStrategy
    from pipecat.turns.user_turn_strategies import UserTurnStrategies

    from pipelines.eager_turn import EagerSpeechTimeoutStopStrategy
    from pipelines.llm import EngineLLMService

    engine = RecordingLLM(["Your package ", "is on its way."])
    context = LLMContext(messages=[{"role": "system", "content": "Be brief."}])
    aggregators = LLMContextAggregatorPair(context, user_params=LLMUserAggregatorParams(
        # (No interruption at the turn's start: it would flush the test's queued frames.)
        user_turn_strategies=UserTurnStrategies(start=[VADUserTurnStartStrategy(enable_interruptions=False)],
                                                stop=[EagerSpeechTimeoutStopStrategy(on_outcome=outcomes.append)])))
    llm = EngineLLMService(engine, max_reply_tokens=16, max_history_messages=8)
    out = ReplyOut()
    down, _ = await run_test(Pipeline([HoldForReply(engine, out), aggregators.user(), llm, out]),
                             frames_to_send=frames)
    order = [type(f).__name__ for f in down if isinstance(f, (UserStoppedSpeakingFrame, LLMTextFrame))]
    return engine, context, order, "".join(f.text for f in down if isinstance(f, LLMTextFrame))


async def test_an_eager_reply_is_held_until_the_turn_ends_then_released_without_a_second_inference():
    outcomes: list[str] = []
    frames = [VADUserStartedSpeakingFrame(), EagerTranscriptionFrame("where is my package", "caller", ""),
              AwaitReply(), TranscriptionFrame("Where is my package?", "caller", "", finalized=True),
              InOrder(VADUserStoppedSpeakingFrame(stop_secs=0.4)), AwaitSpoken()]
    engine, context, order, said = await run_eager_turn(frames, outcomes=outcomes)
    assert len(engine.prompts) == 1 and engine.prompts[0][-1]["content"] == "where is my package"
    assert order[0] == "UserStoppedSpeakingFrame" and said == "Your package is on its way."  # held till the turn ended
    assert outcomes == ["confirmed"]
    assert context.get_messages()[-1] == {"role": "user", "content": "Where is my package?"}  # the final words


async def test_an_eager_reply_to_other_words_is_dropped_and_the_turn_answered_again():
    outcomes: list[str] = []
    frames = [VADUserStartedSpeakingFrame(), EagerTranscriptionFrame("where is my package", "caller", ""),
              AwaitReply(), TranscriptionFrame("Where is my parcel from Monday?", "caller", "", finalized=True),
              InOrder(VADUserStoppedSpeakingFrame(stop_secs=0.4)), AwaitSpoken()]
    engine, _context, order, said = await run_eager_turn(frames, outcomes=outcomes)
    assert len(engine.prompts) == 2 and engine.prompts[1][-1]["content"] == "Where is my parcel from Monday?"
    assert said == "Your package is on its way." and order[0] == "UserStoppedSpeakingFrame"  # said once, not twice
    assert outcomes == ["missed"]


async def test_an_eager_reply_is_dropped_when_the_caller_goes_on():
    outcomes: list[str] = []
    frames = [VADUserStartedSpeakingFrame(), EagerTranscriptionFrame("I need to change the address for", "caller", ""),
              AwaitReply(), InOrder(EagerEndOfTurnCancelFrame()),
              TranscriptionFrame("I need to change the address for my order.", "caller", "", finalized=True),
              InOrder(VADUserStoppedSpeakingFrame(stop_secs=0.4)), AwaitSpoken()]
    engine, _context, order, said = await run_eager_turn(frames, outcomes=outcomes)
    assert len(engine.prompts) == 2 and engine.prompts[1][-1]["content"].endswith("my order.")
    assert said == "Your package is on its way."  # only the second reply was heard
    assert outcomes == ["withdrawn"]
