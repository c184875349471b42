"""What a caller hears, turn by turn: pure bookkeeping, fed with timestamps by the callers.

Definitions (all from the caller's side, wall clock):
- TTFB: end of the caller's speech -> first reply audio received that is not digital
  silence (a phone line sends no packets while the agent is quiet; a WebRTC track sends
  silence frames throughout, so "not silence" is what marks a reply's first byte there).
- TTFS: end of the caller's speech -> first reply audio loud enough to hear.
- Underruns: holes the caller hears inside a reply. Two kinds, counted together:
  playout stalls (a packet arrived after the previous ones had finished playing from a
  small jitter buffer: the phone path, where nothing is sent while the server is late),
  and silent stretches longer than any pause TTS puts between sentences (the WebRTC path,
  where the server fills a late reply with silence frames).
- Barge-in stop: the caller's first word over the reply -> the reply stops being heard
  (a `clear` flushes the phone's buffer; on WebRTC the last audible frame before silence).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

AUDIBLE_RMS = 0.01  # of full scale, per 10 ms window
DIGITAL_SILENCE_PEAK = 64  # int16 peak under which a frame is codec/line silence
JITTER_BUFFER_S = 0.1  # the caller's playout prebuffer (phones and browsers hold 40-200 ms)
LONG_SILENCE_S = 0.7  # a silence inside a reply longer than this is a hole, not a pause
STALL_TOLERANCE_S = 0.02  # one frame late is jitter, not an audible hole


@dataclass
class TurnRecord:
    caller: int
    index: int
    text: str
    voice: str
    utterance_seconds: float
    transport: str = ""
    speech_started_at: float | None = None  # wall clock: first frame of the utterance sent
    speech_end_at: float | None = None  # wall clock: the frame holding the last voiced sample sent
    first_packet_at: float | None = None
    first_audible_at: float | None = None
    last_audible_at: float | None = None
    last_packet_at: float | None = None
    reply_audio_seconds: float = 0.0
    underruns: int = 0
    underrun_seconds: float = 0.0
    barge_in_at: float | None = None  # the next utterance began over this reply
    reply_stopped_at: float | None = None
    late_reply_seconds: float = 0.0  # reply audio still arriving after a `clear`
    clear_events: int = 0
    error: str | None = None
    server: dict | None = None  # the server's own record of this turn, joined after the run
    reply_chunks: list[np.ndarray] = field(default_factory=list, repr=False)
    # playout and silence bookkeeping
    _play_end: float | None = field(default=None, repr=False)
    _silent_since: float | None = field(default=None, repr=False)

    def _since_speech_end(self, at: float | None) -> float | None:
        if at is None or self.speech_end_at is None:
            return None
        return (at - self.speech_end_at) * 1000

    @property
    def ttfs_ms(self) -> float | None:
        return self._since_speech_end(self.first_audible_at)

    @property
    def ttfb_ms(self) -> float | None:
        return self._since_speech_end(self.first_packet_at)

    @property
    def barge_in_stop_ms(self) -> float | None:
        if self.barge_in_at is None or self.reply_stopped_at is None:
            return None
        return max(0.0, self.reply_stopped_at - self.barge_in_at) * 1000

    def reply_audio(self) -> np.ndarray:
        return np.concatenate(self.reply_chunks) if self.reply_chunks else np.zeros(0, dtype=np.int16)

    def metrics(self) -> dict:
        return {
            "ttfs_ms": self.ttfs_ms,
            "ttfb_ms": self.ttfb_ms,
            "reply_seconds": self.reply_audio_seconds,
            "underruns": self.underruns,
            "underrun_seconds": self.underrun_seconds,
            "barge_in_stop_ms": self.barge_in_stop_ms,
        }

    def to_json(self) -> dict:
        return {
            "caller": self.caller, "turn": self.index, "transport": self.transport, "voice": self.voice,
            "text": self.text, "utterance_seconds": round(self.utterance_seconds, 3),
            "speech_end_at": self.speech_end_at, "error": self.error, **self.metrics(),
            "barged_in": self.barge_in_at is not None, "late_reply_seconds": self.late_reply_seconds,
            "server": self.server,
        }

    def hear(self, now: float, samples: np.ndarray, rate: int, *, keep_audio: bool, clock_rate: float = 1.0) -> None:
        """One chunk of reply audio that arrived at `now`, played by a caller whose clock runs
        at `clock_rate` against true time (a fast one plays it out sooner)."""
        seconds = len(samples) / rate
        played_s = seconds / clock_rate  # how long the caller's device takes to play it
        audible = is_audible(samples, rate)
        if self.first_packet_at is None:
            if not audible and np.abs(samples.astype(np.int32)).max(initial=0) < DIGITAL_SILENCE_PEAK:
                return  # line silence before the reply: not part of it
            self.first_packet_at = now
            self._play_end = now + JITTER_BUFFER_S
        self.last_packet_at = now
        self.reply_audio_seconds += seconds
        if keep_audio:
            self.reply_chunks.append(samples)
        # Playout: a packet that arrives after the buffer ran dry is a hole the caller hears.
        assert self._play_end is not None
        if now > self._play_end + STALL_TOLERANCE_S:
            self._hole(now - self._play_end)
            self._play_end = now + played_s
        else:
            self._play_end = max(self._play_end, now) + played_s
        if audible:
            if self.first_audible_at is None:
                self.first_audible_at = now
            elif self._silent_since is not None and now - self._silent_since > LONG_SILENCE_S:
                self._hole(now - self._silent_since)
            self._silent_since = None
            self.last_audible_at = now
        elif self.first_audible_at is not None and self._silent_since is None:
            self._silent_since = now

    def _hole(self, seconds: float) -> None:
        self.underruns += 1
        self.underrun_seconds += seconds

    @property
    def playout_end(self) -> float | None:
        return self._play_end


def is_audible(samples: np.ndarray, rate: int, *, window_s: float = 0.01) -> bool:
    window = max(1, int(rate * window_s))
    n = max(1, len(samples) // window)
    frames = samples[: n * window].astype(np.float32)
    if len(frames) < n * window:
        frames = np.pad(frames, (0, n * window - len(frames)))
    rms = np.sqrt(((frames.reshape(n, window) / 32768.0) ** 2).mean(axis=1))
    return bool((rms > AUDIBLE_RMS).any())


class ReplyTracker:
    """Which turn the reply audio now arriving belongs to, and when a barged-in reply stopped."""

    def __init__(self, *, keep_audio: bool = False, clock_rate: float = 1.0) -> None:
        self.turns: list[TurnRecord] = []
        self._clock_rate = clock_rate
        self._target: TurnRecord | None = None  # the turn whose reply is arriving
        self._cleared: TurnRecord | None = None  # a reply a `clear` cut off; late audio counts against it
        self._keep_audio = keep_audio

    def begin(self, turn: TurnRecord, now: float, *, barging_in: bool) -> None:
        """The caller starts saying `turn`; over the current reply if `barging_in`."""
        turn.speech_started_at = now
        if barging_in and self._target is not None:
            self._target.barge_in_at = now
        elif not barging_in:
            self._target = turn
        self.turns.append(turn)

    def speech_ended(self, turn: TurnRecord, at: float) -> None:
        turn.speech_end_at = at
        previous = self._target
        if previous is not None and previous is not turn and previous.barge_in_at is not None:
            self._settle_barge_in(previous)
        self._target = turn

    def hear(self, now: float, samples: np.ndarray, rate: int) -> None:
        if self._target is None:
            if self._cleared is not None:
                self._cleared.late_reply_seconds += len(samples) / rate
            return
        self._target.hear(now, samples, rate, keep_audio=self._keep_audio, clock_rate=self._clock_rate)

    def clear(self, now: float) -> None:
        """The server flushed the caller's playout (phone `clear`): what was buffered is not heard."""
        target = self._target
        if target is None:
            return
        target.clear_events += 1
        if target.barge_in_at is None:
            return  # pipecat also clears when any caller turn starts; only a barge-in's clear stops a reply
        if target.reply_stopped_at is None:
            target.reply_stopped_at = now
        newest = self.turns[-1]
        if newest is not target:  # audio from here on belongs to the barge-in's own reply
            self._cleared, self._target = target, None

    def _settle_barge_in(self, turn: TurnRecord) -> None:
        """No `clear` came (WebRTC): the reply stopped when its audio last was heard."""
        if turn.reply_stopped_at is not None:
            return
        if turn.last_audible_at is not None and turn.last_audible_at >= (turn.barge_in_at or 0):
            turn.reply_stopped_at = turn.last_audible_at
        elif turn.last_audible_at is not None:
            turn.reply_stopped_at = turn.barge_in_at  # it had already gone quiet

    def waiting_for(self, turn: TurnRecord) -> bool:
        return self._target is turn
