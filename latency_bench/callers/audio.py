"""Audio helpers for synthetic callers: speech generation, G.711 mu-law, resampling."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import wave
from pathlib import Path

import numpy as np

_MULAW_BIAS = 0x84
_MULAW_CLIP = 32635


def speak(text: str, *, voice: str = "en-us", words_per_minute: int = 160) -> tuple[np.ndarray, int]:
    """Speech for `text` from espeak-ng as int16 mono samples and their rate."""
    if shutil.which("espeak-ng") is None:
        raise RuntimeError("espeak-ng is not installed; `make deps` installs it (apt-get install espeak-ng)")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "speech.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(words_per_minute), "-w", str(path), text],
                       check=True, capture_output=True, timeout=30)
        return read_wav(path)


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2:
            raise ValueError(f"{path}: expected 16-bit PCM")
        samples = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
        if w.getnchannels() > 1:
            samples = samples.reshape(-1, w.getnchannels())[:, 0]
        return samples.copy(), w.getframerate()


def write_wav(path: Path, samples: np.ndarray, rate: int) -> None:
    """16-bit WAV of (n,) mono or (channels, n) samples."""
    channels = 1 if samples.ndim == 1 else samples.shape[0]
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.ascontiguousarray(samples.astype(np.int16).T).tobytes())


def resample(samples: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    if from_rate == to_rate:
        return samples
    import soxr

    out = soxr.resample(samples.astype(np.float32) / 32768.0, from_rate, to_rate, quality="HQ")
    return np.clip(out * 32768.0, -32768, 32767).astype(np.int16)


def mulaw_encode(samples: np.ndarray) -> bytes:
    """16-bit PCM -> G.711 mu-law bytes."""
    x = samples.astype(np.int32)
    sign = np.where(x < 0, 0x80, 0)
    magnitude = np.minimum(np.abs(x), _MULAW_CLIP) + _MULAW_BIAS
    exponent = np.floor(np.log2(magnitude)).astype(np.int32) - 7
    exponent = np.clip(exponent, 0, 7)
    mantissa = (magnitude >> (exponent + 3)) & 0x0F
    return (~(sign | (exponent << 4) | mantissa) & 0xFF).astype(np.uint8).tobytes()


def mulaw_decode(data: bytes) -> np.ndarray:
    """G.711 mu-law bytes -> 16-bit PCM."""
    u = ~np.frombuffer(data, dtype=np.uint8).astype(np.int32) & 0xFF
    sign = u & 0x80
    exponent = (u >> 4) & 0x07
    mantissa = u & 0x0F
    magnitude = ((mantissa << 3) + _MULAW_BIAS) << exponent
    return np.where(sign != 0, _MULAW_BIAS - magnitude, magnitude - _MULAW_BIAS).astype(np.int16)


def last_voiced_sample(samples: np.ndarray, rate: int, *, threshold: float = 0.02, window_s: float = 0.01) -> int:
    """Index just past the last 10 ms window louder than `threshold` of full scale."""
    window = max(1, int(rate * window_s))
    n = len(samples) // window
    if n == 0:
        return 0
    frames = samples[: n * window].astype(np.float32).reshape(n, window) / 32768.0
    loud = np.nonzero(np.sqrt((frames**2).mean(axis=1)) > threshold)[0]
    return 0 if len(loud) == 0 else int((loud[-1] + 1) * window)
