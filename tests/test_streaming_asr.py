"""Streaming partials: LocalAgreement-2 on its own, the STT service with a scripted engine
in pipecat's harness, and the real Whisper on espeak-ng speech."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from pipecat.frames.frames import (
    InputAudioRawFrame, InterimTranscriptionFrame, SystemFrame, TranscriptionFrame, VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.processors.frame_processor import FrameProcessor
from pipecat.tests.utils import run_test

from latency_bench.quality.wer import word_error_rate
from models.base import ASREngine, Transcript
from pipelines.local_agreement import LocalAgreement
from pipelines.call_events import CallEvents
from pipelines.options import STTOptions
from pipelines.stt import EngineSTTService

SENTENCE = "I need to change the delivery address for my order from last week"


def test_words_settle_once_two_passes_agree_and_never_change():
    agreement = LocalAgreement()
    assert agreement.update("I need") == []  # one pass: nothing agreed yet
    assert agreement.update("I need to chase") == ["I", "need"]
    assert agreement.tentative == ["to", "chase"]
    assert agreement.update("I need to change the") == ["to"]  # "chase" became "change": not settled
    assert agreement.update("I need to change, the delivery") == ["change,", "the"]  # punctuation aside
    assert agreement.committed_text == "I need to change, the" and agreement.text == "I need to change, the delivery"
    agreement.reset()
    assert agreement.text == "" and agreement.update("Hello") == []


class GrowingASR(ASREngine):
    """Hears 2.5 words a second of SENTENCE; the newest word is misheard until the next pass."""

    def __init__(self) -> None:
        self.settled_given: list[str] = []
        self.passes = 0

    def load(self) -> None:
        pass

    def _hypothesis(self, pcm16: bytes) -> str:
        words = SENTENCE.split()
        heard = min(len(words), max(1, int(len(pcm16) / 32_000 * 2.5)))
        return " ".join(words[: heard - 1] + [f"{words[heard - 1]}x"]) if heard < len(words) else SENTENCE

    async def transcribe(self, pcm16: bytes, *, prompt: str | None = None) -> Transcript:
        self.passes += 1
        return Transcript(self._hypothesis(pcm16), len(pcm16) / 32_000, 0.0)

    async def transcribe_continuing(self, pcm16: bytes, *, committed: str, prompt: str | None = None) -> Transcript:
        self.settled_given.append(committed)
        return await super().transcribe_continuing(pcm16, committed=committed, prompt=prompt)


class LetPassesFinish(FrameProcessor):
    """Paces the audio as a live call does: before each audio frame goes on, STT has taken
    the one before it and any partial pass it started has finished. (Pushed all at once,
    the frames would queue up and STT would take them without ever yielding to a pass.)"""

    def __init__(self, stt: EngineSTTService) -> None:
        super().__init__()
        self._stt = stt
        self._sent = 0

    async def process_frame(self, frame, direction):
        await super().process_frame(frame, direction)
        if isinstance(frame, InputAudioRawFrame):
            async with asyncio.timeout(30):  # a bound: the engine answers within it when the code is right
                while len(self._stt._audio_buffer) < self._sent or self._stt._partial is not None:
                    await asyncio.sleep(0.001 if self._stt._partial is not None else 0)
            self._sent += len(frame.audio)
        await self.push_frame(frame, direction)


@dataclass
class AwaitFinal(SystemFrame):
    """Sent after the turn: held until the final transcript has come (run_test would end the
    pipeline, and a final still being decoded with it)."""


class FinalSeen(FrameProcessor):
    def __init__(self) -> None:
        super().__init__()
        self.event = asyncio.Event()

    async def process_frame(self, frame, direction):
        await super().process_frame(frame, direction)
        if isinstance(frame, TranscriptionFrame):
            self.event.set()
        await self.push_frame(frame, direction)


class HoldUntilFinal(FrameProcessor):
    def __init__(self, seen: FinalSeen) -> None:
        super().__init__()
        self._seen = seen

    async def process_frame(self, frame, direction):
        await super().process_frame(frame, direction)
        if isinstance(frame, AwaitFinal):
            await asyncio.wait_for(self._seen.event.wait(), 60)
            return
        await self.push_frame(frame, direction)


def speech_frames(seconds: float) -> list[InputAudioRawFrame]:
    chunk = (3000).to_bytes(2, "little", signed=True) * 320
    return [InputAudioRawFrame(audio=chunk, sample_rate=16_000, num_channels=1) for _ in range(int(seconds * 50))]


async def test_partials_come_while_the_caller_speaks_and_the_final_keeps_the_settled_words():
    engine = GrowingASR()
    stt = EngineSTTService(engine, STTOptions(max_segment_seconds=30, partial_every_s=0.4))
    frames = [VADUserStartedSpeakingFrame(), *speech_frames(6.0), VADUserStoppedSpeakingFrame(stop_secs=0.4)]
    down, _ = await run_test(Pipeline([LetPassesFinish(stt), stt]), frames_to_send=frames)
    texts = [(type(f).__name__, f.text) for f in down if isinstance(f, (InterimTranscriptionFrame, TranscriptionFrame))]
    interims = [t for kind, t in texts if kind == "InterimTranscriptionFrame"]
    assert len(interims) >= 5 and texts[-1] == ("TranscriptionFrame", SENTENCE)
    assert all(kind == "InterimTranscriptionFrame" for kind, _ in texts[:-1])  # every partial before the final
    settled = [s for s in engine.settled_given if s]
    assert settled and all(a == b[: len(a)] for a, b in zip(settled, settled[1:]))  # settled text only grows
    assert SENTENCE.startswith(settled[-1])  # and the final began with it
    assert not any(t.split()[-1].endswith("x") for t in [settled[-1]])  # a misheard word was never settled


async def test_without_partials_the_turn_is_transcribed_once():
    engine = GrowingASR()
    stt = EngineSTTService(engine, STTOptions(max_segment_seconds=30))
    frames = [VADUserStartedSpeakingFrame(), *speech_frames(3.0), VADUserStoppedSpeakingFrame(stop_secs=0.4)]
    down, _ = await run_test(stt, frames_to_send=frames)
    assert not [f for f in down if isinstance(f, InterimTranscriptionFrame)] and engine.passes == 1


@pytest.mark.slow
async def test_the_real_whisper_streams_partials_and_a_final_within_the_wer_bound(embedded_engines):
    from latency_bench.callers.audio import resample, speak

    samples, rate = speak(SENTENCE, words_per_minute=150)
    pcm = resample(samples, rate, 16_000).tobytes()
    audio = [InputAudioRawFrame(audio=pcm[i : i + 640], sample_rate=16_000, num_channels=1)
             for i in range(0, len(pcm), 640)]
    stt = EngineSTTService(embedded_engines.asr, STTOptions(max_segment_seconds=30, partial_every_s=0.5))
    seen = FinalSeen()
    frames = [VADUserStartedSpeakingFrame(), *audio, VADUserStoppedSpeakingFrame(stop_secs=0.4), AwaitFinal()]
    down, _ = await run_test(Pipeline([HoldUntilFinal(seen), LetPassesFinish(stt), stt, seen]),
                             frames_to_send=frames)
    interims = [f.text for f in down if isinstance(f, InterimTranscriptionFrame)]
    final = [f.text for f in down if isinstance(f, TranscriptionFrame)]
    assert len(interims) >= 2 and len(final) == 1
    assert word_error_rate(SENTENCE, final[0]) < 0.2, final[0]
    assert word_error_rate(SENTENCE, interims[-1]) < 0.5  # the last partial already has most of it


def test_a_forced_prefix_that_covers_all_the_audio_is_not_said_twice():
    from models.whisper_asr import _starting_with

    settled = "I need to change the address."
    assert _starting_with(settled, "I need to change the address. I need to change the address.") == settled
    assert _starting_with(settled, "I need to change the address. For my order.") == \
        "I need to change the address. For my order."
    assert _starting_with(settled, "for my order") == "I need to change the address. for my order"
    assert _starting_with(None, "anything") == "anything"


async def test_no_partial_pass_starts_after_the_pause_so_the_final_finds_the_model_free():
    from tests.test_processors import PauseMarker, PauseSignals

    engine = GrowingASR()
    stt = EngineSTTService(engine, STTOptions(max_segment_seconds=30, partial_every_s=0.4))
    frames = [VADUserStartedSpeakingFrame(), *speech_frames(2.0), PauseMarker(), *speech_frames(1.0),
              VADUserStoppedSpeakingFrame(stop_secs=0.4)]
    await run_test(Pipeline([PauseSignals(stt), LetPassesFinish(stt), stt]), frames_to_send=frames)
    # ~2 s of speech at one pass per 0.4 s before the pause; none in the second after it
    assert stt.partials_pushed <= 5 and stt.speculations_used == 1
    assert engine.passes == stt.partials_pushed + 1  # the partials, then the speculation, which was the final


class PartialsShown(CallEvents):
    """Notes every partial the STT shows the call's page."""

    def __init__(self, shown: list[str]) -> None:
        self.shown = shown

    def partial(self, text: str) -> None:
        self.shown.append(text)


async def test_the_guess_at_a_pause_is_shown_as_the_words_so_far_when_no_partial_finished():
    from tests.test_processors import PauseMarker, PauseSignals

    for partials_on in (True, False):
        shown: list[str] = []
        options = STTOptions(max_segment_seconds=30, partial_every_s=0.4 if partials_on else 0.0)
        stt = EngineSTTService(GrowingASR(), options, events=PartialsShown(shown))
        # 0.3 s of speech: less than one partial's worth, so only the pause's guess is made
        frames = [VADUserStartedSpeakingFrame(), *speech_frames(0.3), PauseMarker(),
                  VADUserStoppedSpeakingFrame(stop_secs=0.4)]
        down, _ = await run_test(Pipeline([PauseSignals(stt), LetPassesFinish(stt), stt]), frames_to_send=frames)
        assert stt.partials_pushed == 0 and stt.speculations_used == 1
        guess = [f.text for f in down if isinstance(f, TranscriptionFrame)]  # the guess became the final
        assert len(guess) == 1 and shown == (guess if partials_on else [])


class RecordingASR(ASREngine):
    """Says how long each segment it was given was; remembers them."""

    def __init__(self) -> None:
        self.segments: list[bytes] = []

    def load(self) -> None:
        pass

    async def transcribe(self, pcm16: bytes, *, prompt: str | None = None) -> Transcript:
        self.segments.append(pcm16)
        return Transcript(f"segment {len(self.segments)} of {len(pcm16) / 32_000:.1f} seconds", len(pcm16) / 32_000,
                          0.0)


def speech_with_gaps(seconds: float) -> list[InputAudioRawFrame]:
    """Loud 20 ms frames with a quiet one every 0.5 s: where words end in real speech."""
    loud, quiet = (3000).to_bytes(2, "little", signed=True) * 320, bytes(640)
    return [InputAudioRawFrame(audio=quiet if i % 25 == 24 else loud, sample_rate=16_000, num_channels=1)
            for i in range(int(seconds * 50))]


async def test_a_turn_longer_than_the_window_is_cut_at_a_quiet_moment_and_every_part_transcribed():
    engine = RecordingASR()
    stt = EngineSTTService(engine, STTOptions(max_segment_seconds=10))
    frames = [VADUserStartedSpeakingFrame(), *speech_with_gaps(35.0), VADUserStoppedSpeakingFrame(stop_secs=0.4)]
    down, _ = await run_test(Pipeline([stt, FinalSeen()]), frames_to_send=[*frames, AwaitFinal()])
    finals = [f.text for f in down if isinstance(f, TranscriptionFrame)]
    assert len(finals) == len(engine.segments) == 4 and stt.long_turn_cuts == 3  # each cut within 2 s of 10 s
    assert finals == [f"segment {n}" + t.split(f"segment {n}")[1] for n, t in enumerate(finals, 1)]  # in order
    assert all(len(s) <= 10 * 32_000 for s in engine.segments)
    assert sum(len(s) for s in engine.segments) == 35 * 32_000  # nothing lost, nothing twice
    for segment in engine.segments[:-1]:  # each cut in a quiet frame, not through a loud one
        assert segment[-2:] == b"\x00\x00"
    assert len(stt._audio_buffer) == 0
