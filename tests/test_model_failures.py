"""Model failures within a turn (issue 13, scenario 13): a model that raises, stalls past its
deadline or dies part way through its answer costs the caller a short spoken apology, never
silence, and the call goes on. The chaos bench's model-failures scenario does the same to real
model workers (kill, stop); these are the pipeline's stages on their own."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

import httpx
import pytest
from pipecat.frames.frames import (
    ErrorFrame,
    LLMContextFrame,
    LLMTextFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.tests.utils import run_test

from agent.config import ModelDeadlines
from latency_bench.callers import twilio_caller
from latency_bench.callers.audio import speak
from latency_bench.callers.conversation import PlannedTurn
from models.base import ASREngine, ChatMessage, LLMEngine, Sampling, TTSEngine, Transcript
from models.errors import StalledError, WorkerUnavailableError
from models.fallback_voice import FallbackTTSEngine
from models.orpheus.build import without_emotion_tags
from models.stalls import StallLimits, without_stalls
from pipelines.llm import CUT_SHORT_REPLY, FALLBACK_REPLY, EngineLLMService
from pipelines.reply import prompt_chars, shaped_reply
from models.scheduling import ANSWER_DEADLINE
from pipelines.options import STTOptions, TranscriptDeadline
from pipelines.stt import NOT_HEARD_REPLY, EngineSTTService
from pipelines.tts import EngineTTSService
from pipelines.voice import Engines
from tests.call_checks import wait_until_ended
from tests.conftest import running_server
from tests.fakes import HashingEmbedder, ScriptedLLM, ToneTTS
from tests.test_processors import context_with
from tests.test_streaming_asr import speech_frames

DEADLINE_S = 0.2  # short, so a stall is found in a test's time; the server's are seconds (deadlines.*)
FIXED_DEADLINE = TranscriptDeadline(seconds=DEADLINE_S, per_audio_second=0.0)  # whatever the turn's length


class Stream:
    """An engine's stream: `items`, then nothing at all (a stopped worker) unless `ends`."""

    def __init__(self, items: Sequence[str], *, ends: bool = True) -> None:
        self.items, self.ends = list(items), ends
        self.closed = False

    async def __call__(self) -> AsyncIterator[str]:
        try:
            for item in self.items:
                yield item
            if not self.ends:
                await asyncio.Event().wait()
        finally:
            self.closed = True


async def test_a_stream_with_no_first_item_within_its_deadline_stalls_and_is_closed():
    stream = Stream([], ends=False)
    with pytest.raises(StalledError, match="no first answer within 0.2 s"):
        [item async for item in without_stalls(stream(), StallLimits(DEADLINE_S, 5.0), what="LLM reply")]
    assert stream.closed


async def test_a_stream_that_stops_part_way_stalls_at_the_gap_deadline_after_its_items():
    stream = Stream(["a", "b"], ends=False)
    got = []
    with pytest.raises(StalledError, match="no next piece within 0.2 s"):
        async for item in without_stalls(stream(), StallLimits(5.0, DEADLINE_S), what="LLM reply"):
            got.append(item)
    assert got == ["a", "b"] and stream.closed


@pytest.mark.slow
async def test_the_consumers_own_time_does_not_count_against_the_stream():
    limits = StallLimits(DEADLINE_S, DEADLINE_S)
    got = []
    async for item in without_stalls(Stream(["a", "b", "c"])(), limits, what="x"):
        got.append(item)
        await asyncio.sleep(2 * DEADLINE_S)  # the consumer is slow (audio being pushed on), not the model
    assert got == ["a", "b", "c"]


async def test_no_limits_pass_every_item_and_only_a_first_limit_leaves_the_gaps_free():
    assert [i async for i in without_stalls(Stream(["a", "b"])(), None, what="x")] == ["a", "b"]
    with pytest.raises(ValueError):
        StallLimits(0.0)
    assert StallLimits(1.0).next_s is None


class ToldStream:
    """A stream with the `stalled()` hook: `items`, then nothing unless `ends`."""

    def __init__(self, items: Sequence[str], *, ends: bool) -> None:
        self._items = Stream(items, ends=ends)()
        self.told = 0

    def __aiter__(self):
        return self

    def __anext__(self):
        return self._items.__anext__()

    async def aclose(self) -> None:
        await self._items.aclose()

    def stalled(self) -> None:
        self.told += 1


async def test_a_stream_given_up_for_lateness_is_told_and_one_closed_for_a_barge_in_is_not():
    late = ToldStream(["a"], ends=False)
    with pytest.raises(StalledError):
        [item async for item in without_stalls(late, StallLimits(DEADLINE_S, DEADLINE_S), what="LLM reply")]
    assert late.told == 1
    for items, ends in ((["a", "b"], True), (["a"], False)):  # ends, or is closed by its consumer (barge-in)
        stream = ToldStream(items, ends=ends)
        async for _ in without_stalls(stream, StallLimits(5.0, 5.0), what="LLM reply"):
            break
        assert stream.told == 0


def test_the_first_items_limit_grows_with_the_request_and_only_once():
    limits = StallLimits(6.0, 3.0, first_per_kchar_s=1.5)
    sized = limits.for_request(8000)
    assert sized == StallLimits(18.0, 3.0)  # the gap limit is the model's pace, not the prompt's
    assert sized.for_request(8000) == sized  # the allowance is not counted twice
    assert StallLimits(6.0).for_request(8000).first_s == 6.0  # no allowance: the plain deadline
    with pytest.raises(ValueError):
        StallLimits(1.0, first_per_kchar_s=-0.5)


# The LLM: whatever fails, the caller hears why.

class HangingLLM(LLMEngine):
    """A stopped worker: `pieces`, then nothing."""

    def __init__(self, pieces: Sequence[str] = ()) -> None:
        self.pieces = list(pieces)
        self.closed = 0

    def load(self) -> None:
        pass

    async def stream_chat(self, messages: Sequence[ChatMessage], *, max_tokens: int,
                          sampling: Sampling | None = None) -> AsyncIterator[str]:
        try:
            for piece in self.pieces:
                yield piece
            await asyncio.Event().wait()
        finally:
            self.closed += 1


class BrokenLLM(ScriptedLLM):
    """A bug in an engine: not one of our errors."""

    async def stream_chat(self, messages, *, max_tokens, sampling=None):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
        yield ""  # an async generator


async def _reply(engine: LLMEngine, **kwargs) -> tuple[str, list]:
    service = EngineLLMService(engine, max_reply_tokens=50, max_history_messages=4, **kwargs)
    down, up = await run_test(service, frames_to_send=[LLMContextFrame(context_with(("user", "hours?")))])
    return "".join(f.text for f in down if isinstance(f, LLMTextFrame)), up


async def test_an_llm_that_never_answers_is_given_up_at_its_deadline_and_the_caller_hears_the_apology(caplog):
    engine = HangingLLM()
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="pipelines.llm"):
        spoken, up = await _reply(engine, stall_limits=StallLimits(DEADLINE_S, DEADLINE_S))
    assert spoken == FALLBACK_REPLY and engine.closed == 1  # the request was cancelled, not left running
    assert time.monotonic() - started < DEADLINE_S + 2.0
    assert any(isinstance(f, ErrorFrame) and "no first answer" in f.error for f in up)
    # The operator's line names the deadline it gave up at (the bench reads it), with no traceback.
    lost = [r for r in caplog.records if "LLM reply lost" in r.message]
    assert len(lost) == 1 and "no first answer within 0.2 s" in lost[0].getMessage() and not lost[0].exc_info


class PrefillingLLM(LLMEngine):
    """A healthy model on a CPU: its first token comes after the whole prompt is read,
    `seconds_per_kchar` per 1,000 characters."""

    def __init__(self, seconds_per_kchar: float) -> None:
        self.seconds_per_kchar = seconds_per_kchar

    def load(self) -> None:
        pass

    async def stream_chat(self, messages: Sequence[ChatMessage], *, max_tokens: int,
                          sampling: Sampling | None = None) -> AsyncIterator[str]:
        await asyncio.sleep(self.seconds_per_kchar * sum(len(m["content"]) for m in messages) / 1000)
        yield "We open at nine."


@pytest.mark.slow
async def test_a_long_prompt_being_read_is_not_taken_for_a_stalled_model():
    engine = PrefillingLLM(seconds_per_kchar=DEADLINE_S)  # 4,000 characters: 0.8 s before the first token

    async def reply(limits: StallLimits) -> str:
        pieces = shaped_reply(engine, [{"role": "system", "content": "x" * 3990}, {"role": "user", "content": "hours?"}],
                              sampling=None, max_tokens=20, max_sentences=1, system_prompt="", stall_limits=limits)
        return "".join([p async for p in pieces])

    with pytest.raises(StalledError, match="no first answer within 0.2 s"):
        await reply(StallLimits(DEADLINE_S, DEADLINE_S))  # a deadline blind to the prompt gives up on it
    assert await reply(StallLimits(DEADLINE_S, DEADLINE_S, first_per_kchar_s=2 * DEADLINE_S)) == "We open at nine."
    with pytest.raises(StalledError, match=r"no first answer within 0.6 s"):  # an allowance too small still stalls
        await reply(StallLimits(DEADLINE_S, DEADLINE_S, first_per_kchar_s=DEADLINE_S / 2))


class ProgressReportingLLM(LLMEngine):
    """llama-server reading a prompt: "" as it starts and after each batch, `batches` of them
    `batch_s` apart, then the reply; stopped (SIGSTOP: nothing more) after `stop_after` reports
    or after the reply's first piece (`hang_after_text`)."""

    reports_prompt_progress = True

    def __init__(self, batches: int, batch_s: float, stop_after: int | None = None,
                 hang_after_text: bool = False) -> None:
        self.batches, self.batch_s, self.stop_after = batches, batch_s, stop_after
        self.hang_after_text = hang_after_text

    def load(self) -> None:
        pass

    async def stream_chat(self, messages: Sequence[ChatMessage], *, max_tokens: int,
                          sampling: Sampling | None = None) -> AsyncIterator[str]:
        for batch in range(self.batches):
            if batch == self.stop_after:
                await asyncio.Event().wait()
            yield ""
            await asyncio.sleep(self.batch_s)
        yield "We open"
        if self.hang_after_text:
            await asyncio.Event().wait()
        yield " at nine."


async def _shaped(engine: LLMEngine, limits: StallLimits, prompt_chars: int = 4000) -> str:
    pieces = shaped_reply(engine, [{"role": "system", "content": "x" * (prompt_chars - 6)},
                                   {"role": "user", "content": "hours?"}],
                          sampling=None, max_tokens=20, max_sentences=1, system_prompt="", stall_limits=limits)
    return "".join([p async for p in pieces])


@pytest.mark.slow
async def test_a_prompt_read_with_progress_is_watched_batch_by_batch_not_by_its_length():
    limits = StallLimits(DEADLINE_S, DEADLINE_S / 2, first_per_kchar_s=DEADLINE_S)  # 4,000 characters: +0.8 s
    # Read for 8 x 0.15 s, far past the plain first-piece deadline (0.2 s), each batch within it: heard.
    assert await _shaped(ProgressReportingLLM(batches=8, batch_s=0.75 * DEADLINE_S), limits) == "We open at nine."
    # Stopped after 2 batches: found at the plain deadline after its last report, not at the
    # allowance for the prompt (1.0 s).
    started = time.monotonic()
    with pytest.raises(StalledError, match="no first answer within 0.2 s of its last progress"):
        await _shaped(ProgressReportingLLM(batches=8, batch_s=0.75 * DEADLINE_S, stop_after=2), limits)
    assert time.monotonic() - started < 2 * 0.75 * DEADLINE_S + DEADLINE_S + 0.5
    # Stopped before it started: found at the plain deadline, the prompt's allowance not added.
    with pytest.raises(StalledError, match=r"no first answer within 0.2 s$"):
        await _shaped(ProgressReportingLLM(batches=8, batch_s=0.75 * DEADLINE_S, stop_after=0), limits)
    # Once the text flows, the gap limit (0.1 s) is the one that applies.
    with pytest.raises(StalledError, match=r"no next piece within 0.1 s$"):  # from the last piece, not progress
        await _shaped(ProgressReportingLLM(batches=2, batch_s=0.75 * DEADLINE_S, hang_after_text=True), limits)


def test_the_configured_llm_deadline_carries_its_allowance_per_prompt_character():
    deadlines = ModelDeadlines(llm_first_token_seconds=6.0, llm_first_token_per_1k_prompt_chars=1.5)
    assert deadlines.llm.for_request(2000).first_s == 9.0
    assert ModelDeadlines(llm_first_token_per_1k_prompt_chars=0).llm.for_request(8000).first_s == 6.0


async def test_an_llm_that_stops_mid_reply_ends_it_with_a_short_apology():
    spoken, up = await _reply(HangingLLM(["The clinic", " opens at"]), stall_limits=StallLimits(5.0, DEADLINE_S))
    assert spoken == "The clinic opens at" + CUT_SHORT_REPLY
    assert any(isinstance(f, ErrorFrame) and "no next piece" in f.error for f in up)


async def test_an_llm_that_raises_something_unexpected_is_logged_and_apologised_for(caplog):
    with caplog.at_level(logging.ERROR, logger="pipelines.llm"):
        spoken, _ = await _reply(BrokenLLM([]))
    assert spoken == FALLBACK_REPLY
    assert any("LLM reply failed" in r.message and r.exc_info for r in caplog.records)


async def test_an_llm_refused_for_good_is_apologised_for_too():
    class Refusing(ScriptedLLM):
        async def stream_chat(self, messages, *, max_tokens, sampling=None):
            raise WorkerUnavailableError("LLM server at http://127.0.0.1:1 failed to load its model")
            yield ""

    assert (await _reply(Refusing([])))[0] == FALLBACK_REPLY


# The ASR: a turn whose words are lost is answered by asking again.

class FailingASR(ASREngine):
    def __init__(self, *, hang: bool = False) -> None:
        self.hang = hang
        self.calls = 0

    def load(self) -> None:
        pass

    async def transcribe(self, pcm16: bytes, *, prompt: str | None = None) -> Transcript:
        self.calls += 1
        if self.hang:
            await asyncio.Event().wait()
        raise WorkerUnavailableError("ASR worker at http://127.0.0.1:1 went away mid-request")


@pytest.mark.parametrize("hang", [False, True], ids=["raises", "hangs"])
async def test_a_turn_whose_transcript_is_lost_is_answered_by_asking_the_caller_again(hang, caplog):
    stt = EngineSTTService(FailingASR(hang=hang),
                           STTOptions(max_segment_seconds=30, transcript_deadline=FIXED_DEADLINE))
    frames = [VADUserStartedSpeakingFrame(), *speech_frames(1.0), VADUserStoppedSpeakingFrame(stop_secs=0.4)]
    with caplog.at_level(logging.WARNING, logger="pipelines.stt"):
        down, _ = await run_test(stt, frames_to_send=frames)
    said = [f.text for f in down if isinstance(f, TTSSpeakFrame)]
    assert said == [NOT_HEARD_REPLY] and not [f for f in down if isinstance(f, TranscriptionFrame)]
    assert stt.transcripts_lost == 1
    # One line for the operator (and the model-failures bench, which reads when the server gave up).
    lost = [r.getMessage() for r in caplog.records if r.name == "pipelines.stt" and "transcript lost" in r.getMessage()]
    assert len(lost) == 1 and ("no transcript within" in lost[0]) == hang, lost


class DeadlineRecordingASR(FailingASR):
    """Transcribes, noting the answer deadline its request carried (models.scheduling)."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds_left: list[float | None] = []

    async def transcribe(self, pcm16: bytes, *, prompt: str | None = None) -> Transcript:
        deadline = ANSWER_DEADLINE.get()
        self.seconds_left.append(None if deadline is None else deadline - time.monotonic())
        return Transcript(text="what time do you open", audio_seconds=1.0, compute_seconds=0.0, language="en",
                          no_speech_probability=0.1)


async def test_the_transcript_request_carries_the_turns_deadline_for_a_worker_to_be_waited_for_within():
    engine = DeadlineRecordingASR()
    stt = EngineSTTService(engine, STTOptions(max_segment_seconds=30, transcript_deadline=FIXED_DEADLINE))
    frames = [VADUserStartedSpeakingFrame(), *speech_frames(1.0), VADUserStoppedSpeakingFrame(stop_secs=0.4)]
    down, _ = await run_test(stt, frames_to_send=frames)
    assert [f.text for f in down if isinstance(f, TranscriptionFrame)] == ["what time do you open"]
    assert len(engine.seconds_left) == 1 and 0 < engine.seconds_left[0] <= DEADLINE_S
    assert ANSWER_DEADLINE.get() is None


def test_the_transcript_deadline_grows_with_the_turn():
    deadlines = ModelDeadlines(asr_seconds=3.0, asr_per_audio_second=0.5)
    assert deadlines.asr_seconds_for(2.0) == 4.0 and deadlines.asr_seconds_for(30.0) == 18.0


# The voice: a stuck sentence is skipped, or said by the fallback voice.

class HangingTTS(TTSEngine):
    sample_rate = 16_000

    def __init__(self, chunks_before: int = 0) -> None:
        self.chunks_before = chunks_before
        self.closed = 0

    def load(self) -> None:
        pass

    async def synthesize(self, text: str) -> AsyncIterator[bytes]:
        try:
            for _ in range(self.chunks_before):
                yield b"\x10\x00" * 1600
            await asyncio.Event().wait()
        finally:
            self.closed += 1


@pytest.mark.slow
async def test_a_sentence_whose_voice_stalls_is_skipped_and_the_next_is_still_tried():
    engine = HangingTTS()
    service = EngineTTSService(engine, voice="v", stall_limits=StallLimits(DEADLINE_S, DEADLINE_S))
    down, up = await run_test(service, frames_to_send=[TTSSpeakFrame("One."), TTSSpeakFrame("Two.")])
    ours = [f for f in [*down, *up] if isinstance(f, ErrorFrame) and "speech synthesis unavailable" in f.error]
    assert len(ours) == 2 and all("no first answer" in f.error for f in ours)
    assert engine.closed == 2


async def test_a_primary_voice_with_no_audio_in_time_hands_the_sentence_to_the_fallback_voice():
    fallback = ToneTTS()
    engine = FallbackTTSEngine(HangingTTS(), fallback, first_audio_within_s=DEADLINE_S,
                               fallback_text=without_emotion_tags)  # as the Orpheus voice has it
    audio = [chunk async for chunk in engine.synthesize("Hello <laugh> there.")]
    assert audio and fallback.sentences == ["Hello there."] and engine.fallbacks == 1


async def test_a_primary_voice_that_stalls_after_its_first_audio_keeps_the_sentence():
    """The caller has heard part of it: a second voice would restart it. The service's own
    deadline ends the sentence instead."""
    engine = FallbackTTSEngine(HangingTTS(chunks_before=1), ToneTTS(), first_audio_within_s=DEADLINE_S)
    service = EngineTTSService(engine, voice="v", stall_limits=StallLimits(5.0, DEADLINE_S))
    down, up = await run_test(service, frames_to_send=[TTSSpeakFrame("One.")])
    assert [f for f in down if isinstance(f, TTSAudioRawFrame)] and engine.fallbacks == 0
    assert any(isinstance(f, ErrorFrame) and "no next piece" in f.error for f in [*down, *up])


# A whole call: each failure is heard as its apology, and the next turn is answered.

class FailsFirstASR(ASREngine):
    """The first turn's transcription fails (a worker that died), the rest are heard."""

    def __init__(self, text: str) -> None:
        self.text, self.calls = text, 0

    def load(self) -> None:
        pass

    async def transcribe(self, pcm16: bytes, *, prompt: str | None = None) -> Transcript:
        self.calls += 1
        if self.calls == 1:
            raise WorkerUnavailableError("ASR worker at http://127.0.0.1:1 went away mid-request")
        return Transcript(self.text, len(pcm16) / 2 / self.sample_rate, 0.0)


class HangsFirstLLM(ScriptedLLM):
    """The first reply never comes (a stopped worker), the rest do."""

    async def stream_chat(self, messages, *, max_tokens, sampling=None):
        if not self.prompts:
            self.prompts.append(list(messages))
            await asyncio.Event().wait()
        async for piece in super().stream_chat(messages, max_tokens=max_tokens, sampling=sampling):
            yield piece


@pytest.mark.slow
@pytest.mark.e2e
async def test_a_call_hears_an_apology_for_a_lost_transcript_and_a_stuck_reply_then_a_real_answer(server_config):
    # One transcription per turn (no guesses at pauses), so "the first" is the first turn's.
    config = replace(server_config, asr=replace(server_config.asr, speculate_after_secs=0.0),
                     turn_end=replace(server_config.turn_end, enabled=False),
                     deadlines=ModelDeadlines(asr_seconds=0.5, llm_first_token_seconds=0.5))
    engines = Engines(asr=FailsFirstASR("When do you open?"), llm=HangsFirstLLM(["We open at nine."]),
                      tts=ToneTTS(chunks=10), embedder=HashingEmbedder())
    samples, rate = speak("When do you open?")
    plan = [PlannedTurn.of(samples, rate, "When do you open?", pause_before_s=0.6 if i == 0 else 1.0) for i in range(3)]
    with running_server(config, engines) as running:
        result = await twilio_caller.call(f"{running.ws_url}/ws/twilio", plan)
        async with httpx.AsyncClient(base_url=running.base_url) as http:
            call_id = (await http.get("/api/calls")).json()["calls"][0]["id"]
            call = await wait_until_ended(http, call_id)
            metrics = (await http.get("/metrics")).text
    heard = [turn.first_audible_at is not None for turn in result.turns]
    assert heard == [True, True, True], result.turns
    # Each apology within 2 s of the failure being known: the ASR's raise at once, the LLM's
    # silence at its 0.5 s deadline (plus the VAD's stop and the reply's own way out).
    assert result.turns[0].ttfs_ms < 2000 and result.turns[1].ttfs_ms < 500 + 2000, result.turns
    replies = [turn["reply_text"].strip() for turn in call["turns"]]
    assert replies == [NOT_HEARD_REPLY, FALLBACK_REPLY, "We open at nine."], replies
    assert call["turns"][0]["user_text"] == "" and call["turns"][1]["user_text"] == "When do you open?"
    assert 'cadence_model_failures_total{kind="error",model="asr"} 1.0' in metrics
    assert 'cadence_model_failures_total{kind="stalled",model="llm"} 1.0' in metrics


def test_the_prompt_is_measured_in_the_characters_the_engine_reads():
    assert prompt_chars([{"role": "system", "content": "abc"}, {"role": "user", "content": "de"}]) == 5
    parts = [{"type": "text", "text": "hello"}, {"type": "image_url", "image_url": {"url": "x" * 100}}]
    assert prompt_chars([{"role": "user", "content": parts}, {"role": "assistant", "content": None}]) == 5
