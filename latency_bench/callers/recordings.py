"""Long test recordings with a known transcript, generated here (espeak-ng, flite):
sentences read in turn by one or more voices, with pauses between them, as mono or as a stereo call
recording (each voice on its own channel). Used by the long-file tests and benches."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from latency_bench.callers.audio import resample, write_wav
from latency_bench.callers.speech import Voice, speak_as

RATE = 16_000
# Varied, plainly spoken sentences: numbers, names, questions, long and short.
SENTENCES = (
    "Thank you for calling the clinic, how can I help you today?",
    "I would like to book an appointment with the dentist next week.",
    "We have openings on Tuesday morning and Thursday afternoon.",
    "Thursday afternoon works best for me, around three o'clock.",
    "Could you tell me your full name and date of birth please?",
    "My name is Maria Lopez and I was born on the fourth of June.",
    "Thank you, I can see your records from your last visit in March.",
    "Do you still live at the same address on Maple Street?",
    "Yes, nothing has changed since then.",
    "The appointment is confirmed for Thursday at three in the afternoon.",
    "Please arrive ten minutes early to fill in a short form.",
    "Is there parking near the building?",
    "There is a public car park behind the pharmacy on the corner.",
    "It costs two dollars an hour and the first hour is free for patients.",
    "That is good to know, thank you very much.",
    "You will get a reminder message the day before your visit.",
    "If you need to cancel, please call us at least one day ahead.",
    "What happens if I am late for the appointment?",
    "We can usually still see you if you are less than fifteen minutes late.",
    "Otherwise we may have to move you to another time.",
)
# Two clearly different speakers: two synthesizers, a male and a female voice. (Two espeak-ng
# voices share one formant synthesizer, and a speaker encoder hears them as near one voice.)
VOICES = (Voice("espeak-ng", "en-us+m3"), Voice("flite", "slt"))


@dataclass(frozen=True)
class Turn:
    start: float
    end: float
    speaker: int
    text: str


@dataclass(frozen=True)
class Recording:
    samples: np.ndarray  # int16, (n,) mono or (2, n) stereo
    turns: tuple[Turn, ...]

    @property
    def reference(self) -> str:
        return " ".join(t.text for t in self.turns)

    @property
    def seconds(self) -> float:
        return self.samples.shape[-1] / RATE


def build(seconds: float, *, speakers: int = 1, pause_s: float = 0.8, stereo: bool = False,
          start_silence_s: float = 0.5) -> Recording:
    """Sentences in turn (speaker i reads every speakers-th one) until `seconds` is reached."""
    cache: dict[tuple[str, str], np.ndarray] = {}
    parts: list[tuple[int, np.ndarray]] = [(-1, np.zeros(int(start_silence_s * RATE), np.int16))]
    turns: list[Turn] = []
    at, index = start_silence_s, 0
    while at < seconds:
        text, speaker = SENTENCES[index % len(SENTENCES)], index % speakers
        key = (text, VOICES[speaker])
        if key not in cache:
            samples, rate = speak_as(text, VOICES[speaker])
            cache[key] = resample(samples, rate, RATE) if rate != RATE else samples
        speech = cache[key]
        turns.append(Turn(at, at + len(speech) / RATE, speaker, text))
        parts.append((speaker, speech))
        parts.append((-1, np.zeros(int(pause_s * RATE), np.int16)))
        at += (len(speech) + int(pause_s * RATE)) / RATE
        index += 1
    if not stereo:
        return Recording(np.concatenate([p for _, p in parts]), tuple(turns))
    channels = np.zeros((2, sum(len(p) for _, p in parts)), np.int16)
    at_sample = 0
    for speaker, part in parts:
        if speaker >= 0:
            channels[speaker % 2, at_sample: at_sample + len(part)] = part
        at_sample += len(part)
    return Recording(channels, tuple(turns))


def write(recording: Recording, path: Path) -> Path:
    """A WAV file (mono or stereo); other formats: convert it with ffmpeg (or PyAV)."""
    write_wav(path, recording.samples, RATE)
    return path
