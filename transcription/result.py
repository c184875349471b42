"""What a transcription gives back."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Piece:
    """One stretch of text as Whisper timed it, in seconds from the start of the recording."""

    start: float
    end: float
    text: str
    avg_logprob: float | None = None
    speaker: str | None = None
    suspect: bool = False  # still failed the hallucination guard after every retry


@dataclass
class TranscriptionResult:
    segments: list[Piece]
    audio_seconds: float  # the whole recording, silence included
    processing_seconds: float
    speech_seconds: float = 0.0  # what the VAD kept and Whisper was given
    truncated: bool = False  # decoding stopped early on a damaged file; what decoded is here
    guard_triggers: dict[str, int] = field(default_factory=dict)  # reason -> count
    speakers: int | None = None  # distinct speakers found, with diarization
    diarization_seconds: float = 0.0  # of processing_seconds, what labelling speakers took

    @property
    def text(self) -> str:
        return " ".join(p.text for p in self.segments if p.text)

    @property
    def rtf(self) -> float:
        """Real-time factor as a speed: audio seconds per processing second (higher is faster)."""
        return self.audio_seconds / self.processing_seconds if self.processing_seconds > 0 else float("inf")

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "segments": [asdict(p) for p in self.segments],
                "audio_seconds": round(self.audio_seconds, 3), "speech_seconds": round(self.speech_seconds, 3),
                "processing_seconds": round(self.processing_seconds, 3), "rtf": round(self.rtf, 2),
                "truncated": self.truncated, "guard_triggers": dict(self.guard_triggers), "speakers": self.speakers,
                "diarization_seconds": round(self.diarization_seconds, 3)}
