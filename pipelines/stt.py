"""Speech-to-text as a pipecat service over our `ASREngine`.

The segment handed to the engine is the caller's turn as cut by the VAD. It already ends
in `stop_secs` of real silence, so no synthetic padding is added (pipecat's default
pads another 0.5 s, which Whisper then has to encode).

Speculative transcription: when the VAD reports that the caller paused (`speech_paused`),
the audio so far is transcribed at once, while the VAD is still waiting out `stop_secs`
to be sure the turn is over. If the turn does end with no more speech, that transcript is
used and the wait cost no ASR time; if the caller goes on, it is dropped.

Streaming partials (`partial_every_s`): while the caller speaks, the turn so far is
transcribed again every time that much more audio has come, one pass at a time; words two
consecutive passes agree on are settled (LocalAgreement-2, local_agreement.py) and pushed
with the tentative rest as an InterimTranscriptionFrame. Each pass, the speculation and the
final transcript are forced to begin with the settled words (`transcribe_continuing`): the
final costs only the decoding of the words not yet settled, and settled words never
change. Partial passes are wanted later than any final, so under load other calls' turns
go first. Every pass is checked (`rejection`); a rejected one is dropped and counted.

Long turns: a caller who talks past `max_segment_seconds` (Whisper's 30 s window) without a
pause has the turn so far cut at its quietest moment of the last 2 s, transcribed and pushed,
and the turn goes on from there: every word is transcribed, in order, and the buffer never
holds more than one window (10 minutes of talk would otherwise hold 19 MB and lose all but
the last 30 s).

At each pause the turn-end judge (`pause_judge`, pipelines/pause_judge.py) hears the voice
beside the speculative transcript and tells the VAD how long this pause may be before the
turn ends. With `eager_reply`, a plausible speculative transcript is also pushed as an
eager end of turn (pipecat's `EagerTranscriptionFrame`): the reply is generated from it
while the VAD waits, and held until the turn ends (pipelines/eager_turn.py); if the caller
goes on, it is withdrawn.

The turn's bookkeeping (when a partial is due, when a long turn is cut, what each segment's
transcript must begin with) is pure, in `TranscriptPlan` (pipelines/transcript_plan.py); this
processor holds the audio and the engine's passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator

from pipecat.frames.frames import (
    ErrorFrame,
    Frame,
    InputAudioRawFrame,
    InterimTranscriptionFrame,
    TranscriptionFrame,
    TTSSpeakFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.settings import STTSettings
from pipecat.services.stt_service import SegmentedSTTService
from pipecat.turns.eager_end_of_turn_mixin import EagerEndOfTurnSTTServiceMixin
from pipecat.utils.time import time_now_iso8601

from models.errors import CadenceError
from models.scheduling import answer_within, wanted_in
from models.base import ASREngine, Transcript
from pipelines.call_events import CallEvents
from pipelines.frames import (CallerSpeechEndFrame, SpeculativeTranscriptFrame, TranscriptLostFrame,
                              TurnPartTranscriptionFrame)
from pipelines.options import STTOptions
from pipelines.pause_judge import PauseJudge
from pipelines.long_turn import cut_at, window_start
from pipelines.speech_end import last_voiced_at
from pipelines.speculation import PauseStep, Speculation, read_guess
from pipelines.transcript_check import counted, rejection
from pipelines.transcript_loss import deadline_s, lost_transcript
from pipelines.transcript_plan import AudioStep, TranscriptPlan

log = logging.getLogger(__name__)

# Said when a turn's words are lost (the ASR failed or is stuck): the caller says it again
# instead of waiting on a reply that cannot come.
NOT_HEARD_REPLY = "Sorry, I didn't catch that. Could you say it again?"

_PCM16_BYTES = 2

# A partial pass is wanted this long after it starts: a final transcript (the end of some
# caller's turn) waiting for the same engine goes first.
PARTIAL_LEAD_S = 1.0


class EngineSTTService(EagerEndOfTurnSTTServiceMixin, SegmentedSTTService):
    def __init__(self, engine: ASREngine, options: STTOptions, *, events: CallEvents | None = None,
                 pause_judge: PauseJudge | None = None, clock=time.time, **kwargs) -> None:
        """`events`: told of every transcript the plausibility check drops, every partial (and,
        with partials on, the guess made at a pause), every cut of a long turn and every
        transcript lost. `pause_judge`: decides each pause's length (None: the VAD's own)."""
        super().__init__(
            enable_eager_end_of_turn=options.eager_reply,
            sample_rate=engine.sample_rate,
            trailing_silence_secs=0.0,
            settings=STTSettings(model=None, language=None),
            **kwargs,
        )
        self._engine = engine
        self._options = options
        self._events = events if events is not None else CallEvents()
        self._max_segment_bytes = int(options.max_segment_seconds * engine.sample_rate) * _PCM16_BYTES
        self._plan = TranscriptPlan(max_segment_bytes=self._max_segment_bytes,
                                    partial_every_bytes=int(options.partial_every_s * engine.sample_rate) * _PCM16_BYTES)
        self._clock = clock
        self._last_audio_at = 0.0  # when the newest buffered audio arrived
        self._guesses: Speculation[asyncio.Task] = Speculation()
        self._partial: asyncio.Task | None = None
        self._pause_judge = pause_judge
        self.partials_pushed = 0
        self.transcripts_lost = 0

    def speech_paused(self) -> None:
        """The caller went quiet mid-turn: start transcribing what we have. No partial pass
        starts until they go on: if the turn ends here, the final must find the model free."""
        self._plan.paused = True
        step = self._guesses.at_pause(speaking=self._user_speaking, buffered=len(self._audio_buffer))
        if step is PauseStep.UNDECIDED and self._pause_judge is not None:
            self._pause_judge.undecided()
        if step is not PauseStep.GUESS:
            return
        audio = bytes(self._audio_buffer)
        voice = self._pause_judge.listen(audio) if self._pause_judge is not None else None
        task = self.create_task(self._speculate(self._fit(audio), self._plan.settled, voice),
                                name="speculative-asr")
        # A guess that failed gives None (pipecat's task wrapper would log its error and return
        # None anyway): the turn's end then transcribes the audio afresh.
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        self._guesses.started(len(audio), task)

    async def _speculate(self, audio: bytes, settled: str, voice: asyncio.Task | None) -> Transcript | None:
        # Wanted when the pause would end the turn: a final transcript (another call's turn
        # that has ended) goes first if both wait for the engine.
        lead = self._options.speculation_lead_s
        try:
            with wanted_in(lead) if lead is not None else contextlib.nullcontext():
                transcript = await self._continuing(audio, settled)
        except CadenceError as exc:  # busy, or its worker gone: a guess is not worth an error
            log.info("speculative transcript failed (%s); the turn's end will transcribe afresh", exc)
            if self._pause_judge is not None:
                self._pause_judge.undecided()
            return None
        finally:
            if voice is not None and asyncio.current_task().cancelling():
                voice.cancel()  # the caller went on: nobody needs the verdict
        reading = read_guess(transcript, partials_on=bool(self._plan.partial_every_bytes))
        if reading.shown is not None:
            self._events.partial(reading.shown)
        if reading.words is not None:
            # Retrieval starts on the guess now, so its passages are ready when the turn ends.
            await self.push_frame(SpeculativeTranscriptFrame(text=reading.words))
            # Pushed before the verdict can end the turn, so the reply starts first. Also on
            # words that sound unfinished: measured, the reply ready when a long pause ends
            # is worth more than the prefill wasted when the caller goes on (see README).
            await self._push_eager_end_of_turn(reading.words, user_id=self._user_id)
        if self._pause_judge is not None:
            verdict = await self._pause_judge.decide(reading.words, voice)
            if self._plan.paused:  # still this pause: a resumed caller has cancelled this task
                self._pause_judge.apply(verdict)
        return transcript

    def speech_resumed(self) -> None:
        """The caller went on talking: the speculative transcript is missing words."""
        self._plan.paused = False
        self._drop_speculation()
        if self.eager_end_of_turn_pending:
            # A system frame: it overtakes queued frames and withdraws the held reply.
            self.create_task(self._cancel_eager_end_of_turn(), name="withdraw-eager-reply")

    def _drop_speculation(self) -> None:
        task = self._guesses.drop()
        if task is not None:
            task.cancel()  # the model thread finishes its run; the result is ignored

    async def _handle_user_started_speaking(self, frame) -> None:
        self._drop_speculation()
        self._drop_partial()
        self._plan.turn_starting()
        await super()._handle_user_started_speaking(frame)
        # The buffer already holds pipecat's ~1 s of audio from before the VAD spoke, most of
        # it silence: the first partial waits for `partial_every_s` of the turn itself, since
        # Whisper turns a fraction of a word into a guess ("Hel-" came back "The Lord.").
        self._plan.partials_from(len(self._audio_buffer))

    async def process_audio_frame(self, frame: InputAudioRawFrame, direction: FrameDirection) -> None:
        await super().process_audio_frame(frame, direction)
        self._last_audio_at = self._clock()  # STT is the first stage after the transport: ~arrival time
        # Not during a pause: the turn may be ending, and its end cuts it anyway (below).
        step = self._plan.audio(len(self._audio_buffer), speaking=self._user_speaking,
                                partial_running=self._partial is not None)
        if step is AudioStep.CUT:
            await self._cut_long_turn()
        elif step is AudioStep.PARTIAL:
            self._partial = self.create_task(self._partial_pass(bytes(self._audio_buffer)), name="partial-asr")

    async def _cut_long_turn(self) -> None:
        """Queues the turn so far, up to its quietest recent moment, as a segment of its own; the
        rest stays buffered and the turn goes on. Partials start afresh on the rest."""
        cut = cut_at(bytes(self._audio_buffer[: self._max_segment_bytes]), self.sample_rate)
        head = bytes(self._audio_buffer[:cut])
        del self._audio_buffer[:cut]
        self._drop_speculation()
        self._drop_partial()
        self._plan.cut(remaining=len(self._audio_buffer))
        seconds = len(head) / _PCM16_BYTES / self.sample_rate
        self._events.long_turn_cut(seconds)
        log.info("caller turn longer than %.0f s: %.1f s of it cut and transcribed, the turn goes on",
                 self._max_segment_bytes / _PCM16_BYTES / self.sample_rate, seconds)
        await self._segment_queue.put(head)

    async def _partial_pass(self, audio: bytes) -> None:
        try:
            with wanted_in(PARTIAL_LEAD_S):
                transcript = await self._continuing(audio, self._plan.settled)
        except CadenceError as exc:  # busy or gone: partials are a nicety, the final will say
            log.debug("partial transcription skipped: %s", exc)
            return
        finally:
            self._partial = None
        reason = rejection(transcript)
        if counted(reason):
            self._events.asr_rejected(reason)
        if reason is not None:
            return
        partial = self._plan.heard(transcript.text)
        self.partials_pushed += 1
        self._events.partial(partial)
        await self.push_frame(InterimTranscriptionFrame(partial, self._user_id, time_now_iso8601()))

    def _drop_partial(self) -> None:
        if self._partial is not None:
            self._partial.cancel()  # the model thread finishes its run; the result is ignored
            self._partial = None

    async def _continuing(self, audio: bytes, settled: str) -> Transcript:
        """A pass that keeps the settled words; one whose text fails the check is redone
        without them once (a forced prefix can lead the decoder astray)."""
        if settled and len(audio) <= self._max_segment_bytes:
            transcript = await self._engine.transcribe_continuing(audio, committed=settled)
            if rejection(transcript) is None:
                return transcript
            self._events.asr_rejected("prefixed_pass")
        return await self._engine.transcribe(audio)

    async def _handle_user_stopped_speaking(self, frame: VADUserStoppedSpeakingFrame) -> None:
        await self.push_frame(CallerSpeechEndFrame(last_voiced_at=self._last_voiced_at(frame)))
        self._clear_eager_end_of_turn()  # the turn is over: the final transcript settles it
        self._plan.paused = False  # a verdict still out is for a pause that is over
        self._drop_partial()  # the final pass starts now, on all of the turn
        if self._plan.needs_cut_at_end(len(self._audio_buffer)):  # it grew past the limit in a pause
            await self._cut_long_turn()
        self._plan.turn_ended()
        await super()._handle_user_stopped_speaking(frame)

    def _last_voiced_at(self, frame: VADUserStoppedSpeakingFrame) -> float:
        return last_voiced_at(bytes(self._audio_buffer), self.sample_rate, last_audio_at=self._last_audio_at,
                              vad_estimate=frame.timestamp - frame.stop_secs)

    async def cleanup(self) -> None:
        self._drop_speculation()
        self._drop_partial()
        # A call cancelled before its StartFrame reached the pipeline's end is only cleaned up:
        # no CancelFrame comes, and pipecat's SegmentedSTTService leaves its segment task
        # pending ("Task was destroyed but it is pending!" once collected). Idempotent.
        await self._cancel_segment_task()
        await super().cleanup()

    def _fit(self, audio: bytes) -> bytes:
        start = window_start(len(audio), self._max_segment_bytes)
        if start:
            log.warning("caller turn of %.1f s cut to its last %.1f s", len(audio) / 2 / self.sample_rate,
                        self._max_segment_bytes / 2 / self.sample_rate)
        return audio[start:]

    async def _transcribe(self, audio: bytes) -> Transcript:
        queued = self._plan.next_segment()
        settled = queued.settled
        # A cut's transcript is of its own audio: a guess made since covers the rest of the turn.
        guess = self._guesses.take(len(audio)) if queued.whole_turn_end else None
        if guess is not None:
            try:
                transcript = await guess
                if transcript is not None:  # None: the guess failed
                    self._guesses.stood_for_turn()
                    log.debug("speculative transcript used (%d used, %d dropped so far)",
                              self._guesses.used, self._guesses.dropped)
                    return transcript
            except asyncio.CancelledError:
                if asyncio.current_task().cancelling():
                    raise
        log.debug("no speculative transcript for this turn (%d used, %d dropped so far)",
                  self._guesses.used, self._guesses.dropped)
        return await self._continuing(self._fit(audio), settled if len(audio) <= self._max_segment_bytes else "")

    @property
    def speculations_used(self) -> int:
        return self._guesses.used

    @property
    def speculations_dropped(self) -> int:
        return self._guesses.dropped

    @property
    def long_turn_cuts(self) -> int:
        return self._plan.cuts

    @property
    def wants_wav_segments(self) -> bool:
        return False  # the engine reads raw 16-bit PCM

    @property
    def supports_ttfs(self) -> bool:
        # pipecat's turn-stop strategy would wait up to (its STT p99 latency - the VAD's stop_secs)
        # after the VAD's stop for a transcript. Ours ends the turn itself (the VAD, the turn-end
        # policy) and sends the turn's transcript finalized, which ends that wait anyway: no
        # wait, as before (the default 1.0 s p99 against the VAD's 1.0 s collapsed it to 0), and
        # no WARNING per call about a p99 figure nobody set.
        return False

    def can_generate_metrics(self) -> bool:
        return True

    async def run_stt(self, audio: bytes) -> AsyncGenerator[Frame | None, None]:
        part = self._plan.next_is_part  # _transcribe takes it off
        await self.start_processing_metrics()
        limit_s = deadline_s(self._options.transcript_deadline, len(audio) / (_PCM16_BYTES * self.sample_rate))
        try:
            # The engine knows the deadline too: a worker restarting or loading is waited for
            # within it (models/remote.py) rather than the turn lost at once.
            async with asyncio.timeout(limit_s):
                with answer_within(limit_s) if limit_s is not None else contextlib.nullcontext():
                    transcript = await self._transcribe(audio)
        except Exception as exc:  # a stuck or failed engine, or a bug: the caller is told, the call goes on
            lost = lost_transcript(exc, deadline_s=limit_s, part=part)
            self.transcripts_lost += 1
            self._events.model_failed("asr", lost.kind)
            if not lost.known:
                log.exception("transcription failed")
            else:  # one line saying which, no traceback
                log.warning("transcript lost, %s: %s", lost.consequence, lost.error)
            yield ErrorFrame(error=f"speech recognition unavailable: {lost.error}")
            if lost.apologise:
                yield TranscriptLostFrame(error=str(lost.error))
                yield TTSSpeakFrame(NOT_HEARD_REPLY)
            return
        finally:
            await self.stop_processing_metrics()
        reason = rejection(transcript)
        if reason is not None:
            log.debug("dropped implausible transcript (%d chars: %s)", len(transcript.text), reason)
            if counted(reason):
                self._events.asr_rejected(reason)
            return
        kind = TurnPartTranscriptionFrame if part else TranscriptionFrame
        yield kind(transcript.text, self._user_id, time_now_iso8601(), finalized=True)
