"""pipelines/speech_events.py (frames -> conversation events) and pipelines/assistant_context.py
(context edits), without a pipeline: frames are handed to the observer as pipecat hands them."""

from __future__ import annotations

import pytest
from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    InterimTranscriptionFrame,
    InterruptionFrame,
    LLMContextAssistantTimestampFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    TTSTextFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.observers.base_observer import FramePushed
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

from pipelines import assistant_context
from pipelines.speech_events import SpeechEventObserver

DOWN, UP = FrameDirection.DOWNSTREAM, FrameDirection.UPSTREAM


class RecordingSink:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __getattr__(self, name: str):
        async def record(*args, **kwargs):
            self.calls.append((name, *args, *sorted(kwargs.items())))
        return record


@pytest.fixture
def wired():
    sink, output, llm = RecordingSink(), FrameProcessor(name="output"), FrameProcessor(name="llm")
    assistant = LLMContextAggregatorPair(LLMContext()).assistant()
    observer = SpeechEventObserver(sink, output_transport=output)

    async def push(frame, source=llm, direction=DOWN, first_push=True):
        await observer.on_push_frame(FramePushed(source=source, destination=source, frame=frame, direction=direction,
                                                 timestamp=0, first_push=first_push))
    return sink, push, output, assistant


def names(sink: RecordingSink) -> list[str]:
    return [call[0] for call in sink.calls]


async def test_caller_speech_is_told_once_per_change_whichever_way_the_vad_frame_travels(wired):
    sink, push, _, _ = wired
    await push(VADUserStartedSpeakingFrame(), direction=DOWN)
    await push(VADUserStartedSpeakingFrame(), direction=UP)  # the same change, broadcast both ways
    await push(InterimTranscriptionFrame("what is", "u", "t"))
    await push(VADUserStoppedSpeakingFrame(), direction=UP)
    await push(VADUserStoppedSpeakingFrame(), direction=DOWN)
    await push(TranscriptionFrame("what is the time", "u", "t"))
    await push(TranscriptionFrame("what is the time", "u", "t"), first_push=False)  # passed on: not new
    assert sink.calls == [("speech_started",), ("user_transcript", "what is", ("final", False)),
                          ("speech_stopped",), ("user_transcript", "what is the time", ("final", True))]


async def test_a_reply_is_told_as_sent_and_ends_when_its_end_leaves_the_output(wired):
    sink, push, output, _ = wired
    await push(LLMFullResponseStartFrame())
    await push(LLMTextFrame("Paris."))
    await push(LLMFullResponseEndFrame())  # written; not yet spoken
    assert names(sink) == ["reply_started", "reply_text_generated"]
    await push(BotStartedSpeakingFrame(), source=output)
    await push(TTSAudioRawFrame(b"\x01\x00" * 240, 24_000, 1), source=output)
    await push(TTSTextFrame("Paris.", text_type="sentence"), source=output)
    await push(TTSAudioRawFrame(b"\x01\x00" * 240, 24_000, 1), source=output, direction=UP)  # not sent to the caller
    await push(LLMFullResponseEndFrame(), source=output)
    await push(BotStoppedSpeakingFrame(), source=output)
    assert names(sink) == ["reply_started", "reply_text_generated", "reply_audio", "reply_text_spoken",
                           "reply_finished"]
    assert sink.calls[-1] == ("reply_finished", ("audio_ms", 10.0), ("interrupted", False))


async def test_an_interruption_ends_the_reply_and_a_greeting_ends_with_its_audio(wired):
    sink, push, output, _ = wired
    await push(LLMFullResponseStartFrame())
    await push(BotStartedSpeakingFrame(), source=output)
    await push(TTSAudioRawFrame(b"\x01\x00" * 480, 24_000, 1), source=output)  # 20 ms sent, then cut
    await push(InterruptionFrame())
    await push(InterruptionFrame(), source=output)  # passed on: the reply is already over
    assert sink.calls[-1] == ("reply_finished", ("audio_ms", 20.0), ("interrupted", True))
    sink.calls.clear()
    await push(BotStartedSpeakingFrame(), source=output)  # no model wrote this: a greeting
    await push(TTSAudioRawFrame(b"\x01\x00" * 240, 24_000, 1), source=output)
    await push(BotStoppedSpeakingFrame(), source=output)
    assert names(sink) == ["reply_started", "reply_audio", "reply_finished"]


async def test_the_reply_is_stored_when_the_assistant_aggregator_passes_its_marks_on(wired):
    sink, push, output, assistant = wired
    await push(LLMContextAssistantTimestampFrame(timestamp="t"), source=output)  # before the aggregator
    assert "reply_stored" not in names(sink)
    await push(LLMContextAssistantTimestampFrame(timestamp="t"), source=assistant)
    await push(InterruptionFrame(), source=assistant)
    assert names(sink).count("reply_stored") == 2


# --- assistant_context ----------------------------------------------------------------------------

def context(*messages: tuple[str, str]) -> LLMContext:
    return LLMContext(messages=[{"role": role, "content": text} for role, text in messages])


def contents(ctx: LLMContext) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in ctx.get_messages()]


def test_instructions_follow_the_agents_prompt_and_can_be_cleared():
    ctx = context(("system", "You are the bakery."), ("user", "hi"))
    assistant_context.set_extra_instructions(ctx, "You are the bakery.", "Answer in French.")
    assert contents(ctx)[0] == ("system", "You are the bakery.\n\nAnswer in French.")
    assistant_context.set_extra_instructions(ctx, "You are the bakery.", None)
    assert contents(ctx) == [("system", "You are the bakery."), ("user", "hi")]


def test_a_reply_is_cut_to_what_was_heard_matching_whitespace_loosely():
    ctx = context(("system", "p"), ("assistant", "We open at eight. Come early."), ("user", "ok"),
                  ("assistant", "We open  at eight.   Come early."))
    assert assistant_context.cut_reply(ctx, "We open at eight. Come early.", "We open at eight.")
    assert contents(ctx)[-1] == ("assistant", "We open at eight.")
    assert contents(ctx)[1] == ("assistant", "We open at eight. Come early.")  # only the newest


def test_an_interrupted_reply_holds_part_of_what_was_said_and_is_cut_too():
    ctx = context(("system", "p"), ("assistant", "We open at eight."))  # the rest never went out
    assert assistant_context.cut_reply(ctx, "We open at eight. Come early.", "")
    assert contents(ctx) == [("system", "p")]  # nothing heard: as if never said
    assert not assistant_context.cut_reply(ctx, "We open at eight. Come early.", "")
    assert not assistant_context.cut_reply(None, "a", "")


def test_removing_a_message_never_removes_the_agents_prompt():
    ctx = context(("system", "p"), ("user", "hello"), ("user", "hello"))
    assert assistant_context.remove_message(ctx, "user", "hello")
    assert contents(ctx) == [("system", "p"), ("user", "hello")]
    assert not assistant_context.remove_message(ctx, "system", "p")
    assert not assistant_context.remove_message(ctx, "assistant", "hello")
