"""Per-turn stage timestamps and TTFS, as plain data (no pipecat, no I/O).

TTFS (time to first sentence) is measured as the caller hears it: from the last voiced
audio of the caller's turn (not the VAD's later stop decision) to the first reply audio
handed to the caller's connection.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

# Stage names in pipeline order; each is a timestamp (seconds, wall clock) on a turn.
STAGES = (
    "asr_final",  # final transcript of the caller's turn
    "retrieval",  # the turn's passages are in the LLM request (agents with knowledge only)
    "llm_first_token",  # first text piece from the LLM
    "first_sentence",  # first complete sentence handed to TTS
    "tts_first_audio",  # first audio chunk out of TTS
    "first_audio_sent",  # first reply audio written to the caller's transport
)

# Turns a call keeps in memory, the open one included: what its live page shows, and where a
# reply cut after the fact is looked for. Older ones drop out, oldest first; each closed turn
# has gone to `on_closed` (the store), which keeps them all. Unbounded, a long call kept every
# turn until it ended: part of the soak's memory growth.
KEPT_TURNS = 50


@dataclass
class Turn:
    index: int
    end_of_speech_at: float | None = None  # the caller's last voiced audio
    stage_at: dict[str, float] = field(default_factory=dict)
    user_text: str = ""
    reply_text: str = ""  # only what was actually sent to the caller
    interrupted: bool = False
    completed_at: float | None = None
    sentence_ttfb_ms: list[float] = field(default_factory=list)  # per reply sentence: TTS request to first audio

    def stage_ms(self) -> dict[str, float]:
        """Milliseconds from the caller's end of speech to each stage reached."""
        if self.end_of_speech_at is None:
            return {}
        return {name: round((at - self.end_of_speech_at) * 1000.0, 1) for name, at in self.stage_at.items()}

    @property
    def ttfs_ms(self) -> float | None:
        return self.stage_ms().get("first_audio_sent")


class TurnTimeline:
    """Assembles turns from pipeline events; the observer translates frames into these calls.

    A turn opens when the caller stops speaking, collects stage times once each, and
    closes when the reply finishes or is interrupted; `on_turn_closed` gets closed turns.
    An eager reply (started at a pause, before the turn ended) reaches some stages early:
    they are kept aside (`stage_ahead`) and given to the turn its final transcript opens,
    unless the eager reply is dropped first.

    `turns` holds the newest KEPT_TURNS turns; `turn_count` counts them all.
    """

    def __init__(self, on_closed: Callable[[Turn], None] = lambda turn: None) -> None:
        self.turns: deque[Turn] = deque(maxlen=KEPT_TURNS)
        self.turn_count = 0  # turns opened so far in the call; the next one's index
        self._on_closed = on_closed
        self._open: Turn | None = None
        self._bot_speaking = False
        self._reply_generated = False  # the LLM finished; the next bot silence ends the turn
        self._ahead: dict[str, float] = {}  # stages an eager reply reached before its turn ended
        self._from_ahead: set[str] = set()  # of the open turn's stages, those an eager reply gave it
        self._parts_ahead: list[str] = []  # a long turn's parts transcribed before the turn ended

    @property
    def current(self) -> Turn | None:
        return self._open

    def user_stopped_speaking(self, last_voiced_at: float) -> Turn:
        turn = self._open
        if turn is None or turn.stage_at:  # a new utterance after the previous reply began
            if turn is not None:
                self._close(last_voiced_at, interrupted=self._bot_speaking)
            turn = Turn(index=self.turn_count, user_text=" ".join(self._parts_ahead))
            self._parts_ahead.clear()
            self.turns.append(turn)
            self.turn_count += 1
            self._open = turn
        # The caller paused and went on before we answered: same turn, later end of speech.
        turn.end_of_speech_at = last_voiced_at
        return turn

    def transcript_part(self, text: str) -> None:
        """Part of a turn too long for one transcription window, cut while the caller went on.
        Parts come in order, before the turn's own transcript; usually before the turn has ended
        too, so they wait for it. Its stages do not move: the reply waits for the last part."""
        turn = self._open
        if turn is not None and "asr_final" not in turn.stage_at:  # this turn's end came first
            turn.user_text = f"{turn.user_text} {text}".strip()
        else:
            self._parts_ahead.append(text)

    def transcript(self, text: str, at: float) -> None:
        turn = self._open
        if turn is None:
            return
        turn.user_text = f"{turn.user_text} {text}".strip() if turn.user_text else text
        # A second transcript in one turn moves asr_final: the reply waits for the last one.
        turn.stage_at["asr_final"] = at
        for name, early in self._ahead.items():
            if name not in turn.stage_at:
                turn.stage_at[name] = early
                self._from_ahead.add(name)
        self._ahead.clear()

    def transcript_lost(self, at: float) -> None:
        """The turn's words are lost (the ASR failed): it ends here, its reply an apology
        spoken without the LLM, which closes the turn once it has been heard."""
        turn = self._open
        if turn is None:
            return
        turn.stage_at["asr_final"] = at
        self._ahead.clear()
        self._reply_generated = True

    def stage(self, name: str, at: float) -> None:
        if name not in STAGES:
            raise ValueError(f"unknown stage {name!r}")
        if self._open is not None and "asr_final" in self._open.stage_at:
            self._open.stage_at.setdefault(name, at)

    def stage_ahead(self, name: str, at: float) -> None:
        """An eager reply (started before its turn ended) reached a stage. The turn may have
        ended since: then the stage is that turn's, unless its reply has begun to play."""
        if name not in STAGES:
            raise ValueError(f"unknown stage {name!r}")
        turn = self._open
        if turn is not None and "asr_final" in turn.stage_at and "first_audio_sent" not in turn.stage_at:
            if name not in turn.stage_at:
                turn.stage_at[name] = at
                self._from_ahead.add(name)
            return
        self._ahead.setdefault(name, at)

    def eager_reply_dropped(self) -> None:
        """Dropped, even after its turn's transcript (whose words differed): its stages go."""
        self._ahead.clear()
        if self._open is not None:
            for name in self._from_ahead:
                self._open.stage_at.pop(name, None)
        self._from_ahead.clear()

    def sentence_synthesized(self, ttfb_seconds: float) -> None:
        """A reply sentence's first audio came out of TTS, `ttfb_seconds` after it was asked for."""
        if self._open is not None and "asr_final" in self._open.stage_at:
            self._open.sentence_ttfb_ms.append(round(ttfb_seconds * 1000.0, 1))

    def bot_started_speaking(self, at: float) -> None:
        self._bot_speaking = True
        self.stage("first_audio_sent", at)

    def spoken_text(self, text: str) -> None:
        if self._open is not None and text:
            sep = "" if not self._open.reply_text or text.startswith((" ", ",", ".", "!", "?")) else " "
            self._open.reply_text += sep + text

    def reply_generated(self) -> None:
        self._reply_generated = True

    def bot_stopped_speaking(self, at: float) -> Turn | None:
        """Audio paused. Only after the whole reply was generated is that the turn's end:
        a slow sentence can leave a gap mid-reply."""
        self._bot_speaking = False
        if self._open is None or not self._reply_generated:
            return None
        return self._close(at, interrupted=False)

    def interrupted(self, at: float) -> Turn | None:
        """The caller barged in: the open turn ends with what was said so far."""
        if not self._bot_speaking or self._open is None:
            return None
        self._bot_speaking = False
        return self._close(at, interrupted=True)

    def turn_with_reply(self, said: str) -> Turn | None:
        """The newest closed turn whose reply was `said` (whitespace aside), for a later cut."""
        wanted = " ".join(said.split())
        for turn in reversed(self.turns):
            if turn is not self._open and " ".join(turn.reply_text.split()) == wanted:
                return turn
        return None

    def finish(self, at: float) -> Turn | None:
        """The call ended; close whatever is open."""
        return None if self._open is None else self._close(at, interrupted=self._bot_speaking)

    def _close(self, at: float, *, interrupted: bool) -> Turn:
        turn = self._open
        assert turn is not None
        turn.interrupted = interrupted
        turn.completed_at = at
        self._open = None
        self._reply_generated = False
        self._from_ahead.clear()
        self._on_closed(turn)
        return turn
