"""What a call's pipeline needs to know of the server's configuration, in the pipeline's own terms.

pipelines/ reads no configuration of the server's (agent/config.py): the server composes
these options from its `CadenceConfig` (`CadenceConfig.call_options`) and hands them in.
What belongs to the agent (its prompt, voice, pause) comes apart, in `CallAgent`.
"""

from __future__ import annotations

from dataclasses import dataclass

from models.stalls import StallLimits
from pipelines.turn_end import TurnEndOptions


@dataclass(frozen=True)
class VADOptions:
    confidence: float  # Silero speech probability threshold
    start_secs: float  # voiced time before "user started speaking"
    min_volume: float  # pipecat's volume gate, suppresses low-level line noise
    # (The silence that ends a turn is the agent's: CallAgent.vad_stop_secs.)


@dataclass(frozen=True)
class TranscriptDeadline:
    """How long a turn's final transcript may take before the caller is asked to say it again."""

    seconds: float  # for any turn
    per_audio_second: float  # added for each second of the turn's audio

    def seconds_for(self, audio_seconds: float) -> float:
        return self.seconds + self.per_audio_second * audio_seconds


@dataclass(frozen=True)
class STTOptions:
    """How the caller's turn is transcribed (pipelines/stt.py)."""

    max_segment_seconds: float  # a longer turn is cut and transcribed in parts (Whisper's 30 s window)
    partial_every_s: float = 0.0  # streaming partials every this much new speech; 0: none
    # When a guess made at a pause is wanted (from the pause to the turn's end); None: guesses
    # in arrival order with every other request.
    speculation_lead_s: float | None = 0.0
    eager_reply: bool = False  # answer a pause's guess while the VAD waits (held until the turn ends)
    # How long a turn's transcript may take before the caller is asked to say it again;
    # None: as long as the engine takes.
    transcript_deadline: TranscriptDeadline | None = None


@dataclass(frozen=True)
class PauseOptions:
    """How the caller's pauses are judged (pipelines/pause_judge.py, pipelines/turn_end.py)."""

    judged: bool  # judge each pause by the words and the voice; False: every pause is the agent's
    eager_reply: bool  # start the reply at a judged pause, held until the turn ends
    limits: TurnEndOptions  # the pauses a verdict may give


@dataclass(frozen=True)
class CallOptions:
    """The server's settings for every call's cascade (pipelines/cascade.py)."""

    vad: VADOptions
    pauses: PauseOptions
    # Shared engines serve the request wanted soonest first (models/scheduling.py): a guess made
    # at a pause is wanted at the turn's end, a later sentence when the audio before it runs
    # out. False: arrival order (for A/B measurements).
    schedule_by_wanted: bool
    max_user_turn_seconds: float  # a longer turn is cut and transcribed in parts (Whisper's window)
    partial_every_s: float  # streaming partials every this much new speech; 0: none
    transcript_deadline: TranscriptDeadline
    max_history_messages: int  # dialogue messages kept in the call's context and in each prompt
    llm_stall_limits: StallLimits  # a reply's first token, then between tokens
    tts_stall_limits: StallLimits  # a sentence's first audio, then between its chunks
    retrieval_timeout_s: float  # a turn waits at most this long for its passages
    # Have the LLM read the prompt up to the passages found for a speculative transcript.
    warm_llm_on_guess: bool
    orpheus_model: str | None  # the Orpheus voice's model; None: the CPU voice (Piper)

    def stt(self, *, speculation_lead_s: float | None, eager_reply: bool) -> STTOptions:
        """The STT's options: these settings, with what the agent's pauses decide."""
        return STTOptions(max_segment_seconds=self.max_user_turn_seconds, partial_every_s=self.partial_every_s,
                          speculation_lead_s=speculation_lead_s, eager_reply=eager_reply,
                          transcript_deadline=self.transcript_deadline)
