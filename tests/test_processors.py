"""Our pipecat services, driven through pipecat's own test harness with scripted engines."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from pipecat.frames.frames import (
    SystemFrame,
    ErrorFrame,
    InputAudioRawFrame,
    LLMContextFrame,
    LLMServiceMetadataFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.frame_processor import FrameProcessor
from pipecat.tests.utils import run_test

from models.errors import CapacityError
from models.stalls import StallLimits
from pipelines.llm import CUT_SHORT_REPLY, FALLBACK_REPLY, EngineLLMService, prompt_window
from pipelines.frames import CallerSpeechEndFrame
from pipelines.options import STTOptions
from pipelines.stt import EngineSTTService
from pipelines.transcript_check import is_plausible
from pipelines.tts import EngineTTSService
from models.base import Transcript
from tests.fakes import ScriptedASR, ScriptedLLM, ToneTTS

SPEECH_20MS = (3000).to_bytes(2, "little", signed=True) * 320  # 20 ms at 16 kHz


def context_with(*turns: tuple[str, str]) -> LLMContext:
    return LLMContext(messages=[{"role": "system", "content": "be brief"}] +
                      [{"role": role, "content": text} for role, text in turns])


async def test_llm_service_streams_the_reply_between_start_and_end_frames():
    engine = ScriptedLLM(["Paris", " is the", " capital."])
    service = EngineLLMService(engine, max_reply_tokens=50, max_history_messages=4)
    down, _ = await run_test(
        service,
        frames_to_send=[LLMContextFrame(context_with(("user", "capital of France?")))],
    )
    assert [type(f) for f in down if not isinstance(f, LLMServiceMetadataFrame)] == [
        LLMFullResponseStartFrame, LLMTextFrame, LLMTextFrame, LLMTextFrame, LLMFullResponseEndFrame]
    assert "".join(f.text for f in down if isinstance(f, LLMTextFrame)) == "Paris is the capital."
    assert engine.prompts[0][0]["role"] == "system"


async def test_llm_service_warms_the_next_prompt_only_when_the_history_window_moves():
    engine = ScriptedLLM(["Sure."])
    service = EngineLLMService(engine, max_reply_tokens=50, max_history_messages=4)
    short = context_with(("user", "hi"))
    full = context_with(("user", "a"), ("assistant", "b"), ("user", "c"), ("assistant", "d"), ("user", "e"))
    await run_test(service, frames_to_send=[LLMContextFrame(short)])
    assert engine.warmed == []  # the next prompt extends this one: the cache already holds it
    service = EngineLLMService(engine, max_reply_tokens=50, max_history_messages=4)
    await run_test(service, frames_to_send=[LLMContextFrame(full)])
    # Next turn: 7 dialogue messages, window of 4 starting at a step of 2 -> from "e" on.
    assert [m["content"] for m in engine.warmed[0]] == ["be brief", "e", "Sure."]


class SlowWarmLLM(ScriptedLLM):
    """A model whose prefix warm-up takes `warm_s` (a long prompt read on a CPU), or never ends
    (`warm_s` None: a worker stuck while it reads). Records when each warm-up and request began and ended."""

    def __init__(self, pieces, *, warm_s: float | None) -> None:
        super().__init__(pieces)
        self.warm_s = warm_s
        self.events: list[str] = []

    async def warm_prefix(self, messages, *, on_progress=None):
        self.events.append("warm started")
        try:
            await (asyncio.sleep(self.warm_s) if self.warm_s is not None else asyncio.Event().wait())
        except asyncio.CancelledError:
            self.events.append("warm cancelled")
            raise
        self.warmed.append(list(messages))
        self.events.append("warm done")

    async def stream_chat(self, messages, *, max_tokens, sampling=None):
        self.events.append("request")
        async for piece in super().stream_chat(messages, max_tokens=max_tokens, sampling=sampling):
            yield piece


async def test_the_agents_prompt_is_warmed_when_the_call_starts_and_the_first_request_waits_for_it():
    engine = SlowWarmLLM(["We open at nine."], warm_s=0.3)
    service = EngineLLMService(engine, max_reply_tokens=50, max_history_messages=4, system_prompt="be brief")
    down, _ = await run_test(service, frames_to_send=[LLMContextFrame(context_with(("user", "hours?")))])
    assert engine.warmed[0] == [{"role": "system", "content": "be brief"}]  # the prompt every request starts with
    # The request met the warmed cache: it was sent once the warm-up was done, not beside it.
    assert engine.events[:3] == ["warm started", "warm done", "request"]
    assert "".join(f.text for f in down if isinstance(f, LLMTextFrame)) == "We open at nine."


async def test_a_warm_up_stuck_past_the_first_tokens_deadline_fails_the_turn_at_that_deadline():
    engine = SlowWarmLLM(["We open at nine."], warm_s=None)  # a worker stuck since the call began
    service = EngineLLMService(engine, max_reply_tokens=50, max_history_messages=4, system_prompt="be brief",
                               stall_limits=StallLimits(0.2, 0.2))
    down, up = await run_test(service, frames_to_send=[LLMContextFrame(context_with(("user", "hours?")))])
    assert engine.events == ["warm started", "warm cancelled"]  # given up, and no second wait on the same model
    assert "".join(f.text for f in down if isinstance(f, LLMTextFrame)) == FALLBACK_REPLY
    assert any(isinstance(f, ErrorFrame) and "no first answer within 0.2 s (the prompt's warm-up)" in f.error
               for f in up)


class ReportingWarmLLM(SlowWarmLLM):
    """A server that reports its progress through the prompt (llama-server): `reports` reports
    `every_s` apart while it warms, then it finishes (`then_stuck`: falls silent instead)."""

    reports_prompt_progress = True

    def __init__(self, pieces, *, reports: int, every_s: float, then_stuck: bool = False) -> None:
        super().__init__(pieces, warm_s=None)
        self.reports, self.every_s, self.then_stuck = reports, every_s, then_stuck

    async def warm_prefix(self, messages, *, on_progress=None):
        self.events.append("warm started")
        try:
            for _ in range(self.reports):
                await asyncio.sleep(self.every_s)
                on_progress()
            if self.then_stuck:
                await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.events.append("warm cancelled")
            raise
        self.events.append("warm done")


@pytest.mark.slow
async def test_a_warm_up_reporting_progress_is_waited_for_as_long_as_reports_come_and_no_longer():
    # 6 reports 0.1 s apart: 0.6 s of reading, three times the 0.2 s deadline, never 0.2 s silent
    engine = ReportingWarmLLM(["We open at nine."], reports=6, every_s=0.1)
    service = EngineLLMService(engine, max_reply_tokens=50, max_history_messages=4, system_prompt="be brief",
                               stall_limits=StallLimits(0.2, 0.2))
    down, _ = await run_test(service, frames_to_send=[LLMContextFrame(context_with(("user", "hours?")))])
    assert engine.events[:3] == ["warm started", "warm done", "request"]
    assert "".join(f.text for f in down if isinstance(f, LLMTextFrame)) == "We open at nine."
    # Two reports, then silence: given up 0.2 s after the last, with the reason
    engine = ReportingWarmLLM(["We open at nine."], reports=2, every_s=0.1, then_stuck=True)
    service = EngineLLMService(engine, max_reply_tokens=50, max_history_messages=4, system_prompt="be brief",
                               stall_limits=StallLimits(0.2, 0.2))
    down, up = await run_test(service, frames_to_send=[LLMContextFrame(context_with(("user", "hours?")))])
    assert engine.events == ["warm started", "warm cancelled"]
    assert "".join(f.text for f in down if isinstance(f, LLMTextFrame)) == FALLBACK_REPLY
    assert any(isinstance(f, ErrorFrame) and "within 0.2 s of its last progress (the prompt's warm-up)" in f.error
               for f in up)


async def test_a_warm_up_that_reads_a_long_prompt_is_allowed_the_time_a_request_of_it_is():
    engine = SlowWarmLLM(["We open at nine."], warm_s=0.4)  # longer than the plain deadline: a long prompt
    service = EngineLLMService(engine, max_reply_tokens=50, max_history_messages=4, system_prompt="x" * 1000,
                               stall_limits=StallLimits(0.2, 0.2, first_per_kchar_s=0.5))
    down, _ = await run_test(service, frames_to_send=[LLMContextFrame(context_with(("user", "hours?")))])
    assert engine.events[:3] == ["warm started", "warm done", "request"]
    assert "".join(f.text for f in down if isinstance(f, LLMTextFrame)) == "We open at nine."


async def test_an_agent_without_a_prompt_warms_nothing_at_the_start():
    engine = ScriptedLLM(["Sure."])
    await run_test(EngineLLMService(engine, max_reply_tokens=50, max_history_messages=4),
                   frames_to_send=[LLMContextFrame(context_with(("user", "hi")))])
    assert engine.warmed == []


async def test_llm_service_turns_an_overloaded_engine_into_an_error_and_a_spoken_fallback():
    service = EngineLLMService(ScriptedLLM([], refuse=True), max_reply_tokens=50, max_history_messages=4)
    down, up = await run_test(
        service,
        frames_to_send=[LLMContextFrame(context_with(("user", "hi")))],
    )
    assert [type(f) for f in down if not isinstance(f, LLMServiceMetadataFrame)] == [
        LLMFullResponseStartFrame, LLMTextFrame, LLMFullResponseEndFrame]
    assert "".join(f.text for f in down if isinstance(f, LLMTextFrame)) == FALLBACK_REPLY
    assert any(isinstance(f, ErrorFrame) and "retry later" in f.error for f in up)


async def test_llm_service_ends_a_reply_cut_by_a_dying_worker_with_a_short_apology_not_a_new_reply():
    engine = ScriptedLLM(["The clinic", " opens at", " eight."], fail_after=2)
    service = EngineLLMService(engine, max_reply_tokens=50, max_history_messages=4)
    down, up = await run_test(service, frames_to_send=[LLMContextFrame(context_with(("user", "hours?")))])
    spoken = "".join(f.text for f in down if isinstance(f, LLMTextFrame))
    assert spoken == "The clinic opens at" + CUT_SHORT_REPLY
    assert any(isinstance(f, ErrorFrame) and "failed mid-request" in f.error for f in up)


def test_prompt_window_keeps_system_and_recent_turns_with_a_stable_start():
    def dialogue(n):
        return [{"role": "system", "content": "s"}] + [
            {"role": "user" if i % 2 == 0 else "assistant", "content": str(i)} for i in range(n)]

    assert [m["content"] for m in prompt_window(dialogue(4), max_history=6)] == ["s", "0", "1", "2", "3"]
    starts = []
    for n in range(7, 20):
        window = prompt_window(dialogue(n), max_history=6)
        assert window[0]["content"] == "s" and len(window) - 1 <= 6
        assert window[-1]["content"] == str(n - 1)  # the newest message is always in
        starts.append(window[1]["content"])
    # The start moves every 3 messages, not every message: the prompt prefix stays cacheable.
    assert starts == ["3"] * 3 + ["6"] * 3 + ["9"] * 3 + ["12"] * 3 + ["15"]


def test_prompt_window_keeps_the_dialogue_within_its_character_budget():
    history = [{"role": "system", "content": "s"}] + [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"{i}" * 30} for i in range(6)]
    window = prompt_window(history, max_history=12, max_dialogue_chars=100)
    assert [m["content"][0] for m in window] == ["s", "3", "4", "5"]  # the oldest went first
    assert prompt_window(history, max_history=12, max_dialogue_chars=1000) == history
    # Ten minutes of talk in one turn: its end is kept, and said to be an end.
    monologue = " ".join(f"w{i}" for i in range(3000))
    window = prompt_window([history[0], {"role": "user", "content": monologue}], max_history=12,
                           max_dialogue_chars=500)
    assert len(window[1]["content"]) == 500 and window[1]["content"].startswith("[...] ")
    assert window[1]["content"].endswith("w2999") and window[1]["role"] == "user"
    assert history[1]["content"] == "0" * 30  # the context itself is never changed


async def test_stt_service_transcribes_the_vad_segment_once_it_ends():
    engine = ScriptedASR("what is the capital of france")
    service = EngineSTTService(engine, STTOptions(max_segment_seconds=30), clock=lambda: 1000.0)
    silence_20ms = bytes(len(SPEECH_20MS))
    frames = [VADUserStartedSpeakingFrame()] + [
        InputAudioRawFrame(audio=SPEECH_20MS, sample_rate=16_000, num_channels=1) for _ in range(25)
    ] + [InputAudioRawFrame(audio=silence_20ms, sample_rate=16_000, num_channels=1) for _ in range(20)] + [
        VADUserStoppedSpeakingFrame(stop_secs=0.4)]
    down, _ = await run_test(service, frames_to_send=frames)
    # The turn's clock starts at the last voiced audio: 0.4 s of silence before the newest audio.
    ends = [f for f in down if isinstance(f, CallerSpeechEndFrame)]
    assert len(ends) == 1 and abs(ends[0].last_voiced_at - (1000.0 - 0.4)) < 0.011
    transcripts = [f for f in down if isinstance(f, TranscriptionFrame)]
    assert [t.text for t in transcripts] == ["what is the capital of france"]
    assert transcripts[0].finalized
    assert len(engine.heard) == 1 and len(engine.heard[0]) >= 25 * len(SPEECH_20MS)


async def test_stt_service_cuts_overlong_turns_into_windows_and_transcribes_them_all():
    engine = ScriptedASR("long story")
    service = EngineSTTService(engine, STTOptions(max_segment_seconds=0.2))
    frames = [VADUserStartedSpeakingFrame()] + [
        InputAudioRawFrame(audio=SPEECH_20MS, sample_rate=16_000, num_channels=1) for _ in range(50)
    ] + [VADUserStoppedSpeakingFrame(stop_secs=0.4)]
    await run_test(service, frames_to_send=frames)
    assert len(engine.heard) >= 5 and all(len(segment) <= int(0.2 * 16_000) * 2 for segment in engine.heard)
    assert sum(len(segment) for segment in engine.heard) == 50 * len(SPEECH_20MS)


async def test_stt_service_drops_text_hallucinated_from_noise():
    engine = ScriptedASR("thank you", no_speech_probability=0.9)
    frames = [VADUserStartedSpeakingFrame(),
              InputAudioRawFrame(audio=SPEECH_20MS, sample_rate=16_000, num_channels=1),
              VADUserStoppedSpeakingFrame(stop_secs=0.4)]
    down, _ = await run_test(EngineSTTService(engine, STTOptions(max_segment_seconds=30)), frames_to_send=frames)
    assert not [f for f in down if isinstance(f, TranscriptionFrame)]


def test_plausibility_rules():
    assert is_plausible(Transcript("what time is it", 1.0, 0.1, no_speech_probability=0.1))
    assert not is_plausible(Transcript("  ", 1.0, 0.1))
    loop = "I'm sorry. " * 30
    from models.hallucination import compression_ratio

    assert compression_ratio(loop) > 2.4 and not is_plausible(Transcript(loop, 5.0, 1.0))
    assert is_plausible(Transcript("please book a table for four people", 2.0, 0.1, no_speech_probability=0.8))


def test_a_short_loop_too_small_for_gzip_is_caught_as_a_repetition():
    from models.hallucination import compression_ratio
    from pipelines.transcript_check import rejection

    loop = "Hello. Hello. Hello. Hello. Hello. Hello."  # a streaming pass seen in a browser call
    assert compression_ratio(loop) <= 2.4 and rejection(Transcript(loop, 2.0, 0.1)) == "repetition"
    for speech in ("no, no, no", "thank you thank you thank you", "very very very good"):
        assert rejection(Transcript(speech, 2.0, 0.1)) is None, speech


async def test_every_sentence_reports_its_own_ttfb():
    from pipelines.frames import TTSSentenceTimingFrame

    ticks = iter(range(100))
    engine = ToneTTS(chunks=2)
    service = EngineTTSService(engine, voice="tone", clock=lambda: float(next(ticks)))
    down, _ = await run_test(service, frames_to_send=[TTSSpeakFrame("Hello there."), TTSSpeakFrame("Bye now.")])
    timings = [f for f in down if isinstance(f, TTSSentenceTimingFrame)]
    assert [t.text for t in timings] == ["Hello there.", "Bye now."]
    assert all(t.ttfb_seconds > 0 for t in timings)  # each from its own request, on the injected clock


async def test_orpheus_service_keeps_emotion_tags_and_drops_other_markup():
    from models.orpheus.prompt import EMOTION_TAGS
    from pipelines.tts import OrpheusTTSService

    engine = ToneTTS(chunks=1)
    service = OrpheusTTSService(engine, voice="tara", model="orpheus", emotion_tags=EMOTION_TAGS)
    await run_test(service, frames_to_send=[TTSSpeakFrame("Well <laugh> that is <break time='1s'/> <b>funny</b>.")])
    assert engine.sentences == ["Well <laugh> that is funny."]


async def test_tts_service_streams_engine_audio_as_tts_frames():
    engine = ToneTTS(chunks=3)
    service = EngineTTSService(engine, voice="tone")
    down, _ = await run_test(service, frames_to_send=[TTSSpeakFrame("Hello there.")])
    audio = [f for f in down if isinstance(f, TTSAudioRawFrame)]
    assert audio and sum(len(f.audio) for f in audio) > 0
    assert engine.sentences == ["Hello there."]


@dataclass
class PauseMarker(SystemFrame):
    """Stands for the VAD's pause/resume callbacks at a point in the audio stream.

    A system frame, like input audio and VAD events, so it keeps its place among them."""

    resumed: bool = False


class PauseSignals(FrameProcessor):
    """Calls STT's pause/resume hooks where a marker stands in the stream, as the VAD does.

    It sits before STT and, at a marker, first lets STT consume every frame sent before it
    (in the real pipeline the VAD runs after STT, so STT has always buffered that audio).
    """

    def __init__(self, stt: EngineSTTService) -> None:
        super().__init__()
        self._stt = stt
        self._audio_bytes_sent = 0

    async def process_frame(self, frame, direction):
        await super().process_frame(frame, direction)
        if isinstance(frame, PauseMarker):
            for _ in range(200):  # STT takes system frames at once; this is a bound, not a timer
                if len(self._stt._audio_buffer) >= self._audio_bytes_sent:
                    break
                await asyncio.sleep(0.005)
            (self._stt.speech_resumed if frame.resumed else self._stt.speech_paused)()
            return
        if isinstance(frame, InputAudioRawFrame):
            self._audio_bytes_sent += len(frame.audio)
        await self.push_frame(frame, direction)


def speech(n: int) -> list[InputAudioRawFrame]:
    return [InputAudioRawFrame(audio=SPEECH_20MS, sample_rate=16_000, num_channels=1) for _ in range(n)]


async def test_a_pause_that_ends_the_turn_reuses_the_speculative_transcript():
    engine = ScriptedASR("book a table")
    stt = EngineSTTService(engine, STTOptions(max_segment_seconds=30))
    frames = [VADUserStartedSpeakingFrame(), *speech(20), PauseMarker(), *speech(10),
              VADUserStoppedSpeakingFrame(stop_secs=0.4)]
    down, _ = await run_test(Pipeline([PauseSignals(stt), stt]), frames_to_send=frames)
    assert [f.text for f in down if isinstance(f, TranscriptionFrame)] == ["book a table"]
    assert len(engine.heard) == 1  # transcribed once, at the pause
    assert len(engine.heard[0]) == 20 * len(SPEECH_20MS) and stt.speculations_used == 1


async def test_speech_after_a_pause_drops_the_speculation_and_transcribes_the_whole_turn():
    engine = ScriptedASR("book a table for four")
    stt = EngineSTTService(engine, STTOptions(max_segment_seconds=30))
    frames = [VADUserStartedSpeakingFrame(), *speech(20), PauseMarker(), *speech(5), PauseMarker(resumed=True),
              *speech(20), VADUserStoppedSpeakingFrame(stop_secs=0.4)]
    down, _ = await run_test(Pipeline([PauseSignals(stt), stt]), frames_to_send=frames)
    assert [f.text for f in down if isinstance(f, TranscriptionFrame)] == ["book a table for four"]
    assert stt.speculations_dropped == 1 and stt.speculations_used == 0
    assert len(engine.heard[-1]) == 45 * len(SPEECH_20MS)  # the final run saw the whole turn


async def test_a_guess_that_failed_leaves_the_turns_end_to_transcribe_afresh():
    """Found by chaos model-failures: the ASR worker restarting refused the guess at the pause
    (503, loading); pipecat's task wrapper turned its error into None, and the turn's end read
    None as the transcript: the turn was lost with no apology."""

    class RefusesFirst(ScriptedASR):
        async def transcribe(self, pcm16, *, prompt=None):
            if not self.heard:
                self.heard.append(pcm16)
                raise CapacityError("asr worker is busy: loading the engine; retry later")
            return await super().transcribe(pcm16, prompt=prompt)

    engine = RefusesFirst("book a table")
    stt = EngineSTTService(engine, STTOptions(max_segment_seconds=30))
    frames = [VADUserStartedSpeakingFrame(), *speech(20), PauseMarker(), *speech(10),
              VADUserStoppedSpeakingFrame(stop_secs=0.4)]
    down, _ = await run_test(Pipeline([PauseSignals(stt), stt]), frames_to_send=frames)
    assert [f.text for f in down if isinstance(f, TranscriptionFrame)] == ["book a table"]
    assert len(engine.heard) == 2 and stt.speculations_used == 0 and stt.transcripts_lost == 0


def test_a_later_sentence_is_wanted_when_the_audio_ahead_of_it_runs_low():
    from pipelines.tts import SENTENCE_LEAD_S, ReplyPlayout

    playout = ReplyPlayout()
    assert playout.wanted_in("reply-1", now=10.0) == 0.0  # first sentence: now
    playout.audio("reply-1", 3.0, now=10.4)  # 3 s of audio, first heard at 10.4
    assert playout.wanted_in("reply-1", now=11.0) == pytest.approx(3.0 - 0.6 - SENTENCE_LEAD_S)
    assert playout.wanted_in("reply-1", now=20.0) == 0.0  # it ran out: now
    assert playout.wanted_in("reply-2", now=20.0) == 0.0  # a new reply starts over
    playout.audio("reply-1", 5.0, now=20.1)  # audio of a reply that is over counts for nothing
    assert playout.wanted_in("reply-2", now=20.2) == 0.0


class _WantedRecordingTTS(ToneTTS):
    """Records when each sentence was said to be wanted, read at the call as ModelRunner does."""

    def __init__(self) -> None:
        super().__init__(chunks=1)
        self.wanted: list[float | None] = []

    def synthesize(self, text: str):
        from models.scheduling import WANTED_BY

        self.wanted.append(WANTED_BY.get())
        return super().synthesize(text)


@pytest.mark.parametrize("by_playout", [True, False])
async def test_sentences_say_when_they_are_wanted_unless_the_schedule_is_arrival(by_playout):
    engine = _WantedRecordingTTS()
    service = EngineTTSService(engine, voice="tone", clock=lambda: 50.0, schedule_by_playout=by_playout)
    await run_test(service, frames_to_send=[TTSSpeakFrame("Hello there.")])
    assert engine.wanted == ([50.0] if by_playout else [None])  # a reply's first sentence: wanted now


def test_the_schedule_switch_reaches_the_voice_and_bad_values_are_refused(default_config, tmp_path):
    from dataclasses import replace

    from agent.config import load_config
    from agent.errors import ConfigError
    from pipelines.cascade import tts_service

    arrival = replace(default_config, server=replace(default_config.server, schedule="arrival"))
    assert tts_service(ToneTTS(), arrival.call_options(), voice="tone")._schedule_by_playout is False
    assert tts_service(ToneTTS(), default_config.call_options(), voice="tone")._schedule_by_playout is True
    (tmp_path / "c.yaml").write_text("server: {schedule: fifo}\n")
    with pytest.raises(ConfigError, match="server.schedule must be one of wanted-by, arrival"):
        load_config(tmp_path / "c.yaml")
