"""Bad audio for the chaos bench (issue 13, scenario 7): what a buggy client sends where audio
belongs, made here as the payloads it would send, one per 20 ms. Plain data, no I/O.

Each `Case` names a transport, what the client does wrong and what the server owes it:
    answered         the call goes on through the bad audio and answers the good speech after it
    error_answered   the same, after an `error` event for each refused part (Realtime)
    refused          closed 1008 with a reason at the handshake, before a call is admitted
    closed_bad_input closed 1008 with a reason at the bad-message budget, stored as bad_input
    idle_timeout     silence: ended by the server at the idle timeout, stored as idle_timeout
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from latency_bench.callers.audio import mulaw_encode, resample

FRAME_S = 0.02
PHONE_RATE, REALTIME_RATE = 8_000, 24_000
MULAW_SILENCE = b"\xff"  # mu-law's code for 0
ANSWERED, ERROR_ANSWERED, REFUSED, CLOSED_BAD_INPUT, IDLE_TIMEOUT = (
    "answered", "error_answered", "refused", "closed_bad_input", "idle_timeout")
# Float32 values that int16 or mu-law readers must survive: NaN, both infinities, the largest
# finite float, and a denormal; written over every few samples of real speech.
NON_FINITE = np.array([np.nan, np.inf, -np.inf, np.finfo(np.float32).max, 1e-45], dtype=np.float32)
NON_FINITE_EVERY = 5


@dataclass(frozen=True)
class Material:
    """What the bad audio is made of: `seconds` of it, from speech other than the good utterance's."""

    speech: np.ndarray  # int16 mono
    rate: int
    seconds: float
    seed: int = 0

    def speech_at(self, rate: int) -> np.ndarray:
        """The speech at `rate`, repeated to fill `seconds`."""
        samples = resample(self.speech, self.rate, rate)
        return np.resize(samples, max(1, int(self.seconds * rate)))

    @property
    def frames(self) -> int:
        return max(1, round(self.seconds / FRAME_S))


@dataclass(frozen=True)
class BadAudio:
    payloads: tuple[bytes, ...]  # one per 20 ms, as the client sends them
    # Realtime: events sent before the audio (a session.update declaring something).
    before: tuple[dict, ...] = ()
    # Twilio: the `start` event's mediaFormat.
    media_format: dict | None = None
    # Realtime: the format the good utterance is then spoken in (after a switch, the new one).
    good_format: str = "pcm16"
    # Silence: the payload is repeated until the server ends the call.
    until_closed: bool = False


@dataclass(frozen=True)
class Case:
    transport: str  # "twilio" | "realtime"
    name: str
    owed: str
    what: str
    make: Callable[[Material], BadAudio]
    garbage: bool = True  # no speech a listener could make out: answering it answers a hallucination

    @property
    def key(self) -> str:
        return f"{self.transport}/{self.name}"


def full_scale_noise(material: Material, rate: int) -> np.ndarray:
    rng = np.random.default_rng(material.seed)
    return rng.integers(-32768, 32768, int(material.seconds * rate), dtype=np.int32).astype(np.int16)


def floats_with_non_finite(samples: np.ndarray) -> bytes:
    """int16 speech as the float32 a client forgot to convert, NaN/Inf bit patterns among it."""
    floats = samples.astype(np.float32) / 32768.0
    for i, value in enumerate(NON_FINITE):
        floats[i::NON_FINITE_EVERY * len(NON_FINITE)] = value
    return floats.astype("<f4").tobytes()


def opus_packets(samples: np.ndarray, rate: int) -> list[bytes]:
    """Speech as the 20 ms Opus packets a WebRTC client would send (libopus, through PyAV)."""
    import av  # noqa: PLC0415 - aiortc's dependency; only these cases need it

    codec = av.CodecContext.create("libopus", "w")
    codec.bit_rate, codec.format, codec.layout, codec.sample_rate = 32_000, "s16", "mono", 48_000
    at_48k, step = resample(samples, rate, 48_000), 960
    packets: list[bytes] = []
    for start in range(0, len(at_48k) - step + 1, step):
        frame = av.AudioFrame.from_ndarray(at_48k[start:start + step].reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts = 48_000, start
        packets += [bytes(p) for p in codec.encode(frame)]
    return packets


def chop(data: bytes, size: int, frames: int) -> tuple[bytes, ...]:
    """`frames` payloads of `size` bytes from `data`, repeated as needed."""
    if len(data) < size * frames:
        data = data * (size * frames // max(1, len(data)) + 1)
    return tuple(data[i * size:(i + 1) * size] for i in range(frames))


def odd_chunks(data: bytes, size: int, frames: int, seed: int) -> tuple[bytes, ...]:
    """A byte stream cut at odd boundaries near `size` (size +-1, and now and then 1 byte)."""
    rng = random.Random(seed)
    sizes = [rng.choice((size - 1, size + 1, size + 1, 1)) for _ in range(frames)]
    data = data * (sum(sizes) // max(1, len(data)) + 1)
    out, at = [], 0
    for n in sizes:
        out.append(data[at:at + n])
        at += n
    return tuple(out)


def frame_bytes(rate: int, sample_bytes: int) -> int:
    """Bytes of 20 ms of audio at `rate` with samples `sample_bytes` wide (mu-law 1, PCM16 2, float32 4)."""
    return round(rate * FRAME_S) * sample_bytes


def _pcm16(samples: np.ndarray) -> bytes:
    return samples.astype("<i2").tobytes()


# --- Twilio: 8 kHz mu-law, 160 bytes per 20 ms ------------------------------------------------

def _mulaw_frames(samples: np.ndarray, frames: int) -> tuple[bytes, ...]:
    return chop(mulaw_encode(samples), frame_bytes(PHONE_RATE, 1), frames)


TWILIO_CASES = (
    Case("twilio", "start_declares_16khz", REFUSED, "`start` declares audio/x-mulaw at 16000 Hz",
         lambda m: BadAudio((), media_format={"encoding": "audio/x-mulaw", "sampleRate": 16000, "channels": 1})),
    Case("twilio", "start_declares_l16", REFUSED, "`start` declares 16-bit linear PCM (audio/x-l16)",
         lambda m: BadAudio((), media_format={"encoding": "audio/x-l16", "sampleRate": 8000, "channels": 1})),
    Case("twilio", "l16_16khz_as_mulaw", ANSWERED, "16 kHz PCM16 speech sent where 8 kHz mu-law belongs",
         lambda m: BadAudio(chop(_pcm16(m.speech_at(16_000)), frame_bytes(16_000, 2), m.frames))),
    Case("twilio", "odd_lengths", ANSWERED, "mu-law speech cut at odd byte lengths (159, 161, 1)",
         lambda m: BadAudio(odd_chunks(mulaw_encode(m.speech_at(PHONE_RATE)), frame_bytes(PHONE_RATE, 1), m.frames,
                                       m.seed)),
         garbage=False),
    Case("twilio", "float32_nan_inf", ANSWERED, "float32 samples with NaN/Inf bit patterns sent as mu-law",
         lambda m: BadAudio(chop(floats_with_non_finite(m.speech_at(PHONE_RATE)), frame_bytes(PHONE_RATE, 4),
                                 m.frames))),
    Case("twilio", "full_scale_noise", ANSWERED, "white noise at full scale",
         lambda m: BadAudio(_mulaw_frames(full_scale_noise(m, PHONE_RATE), m.frames))),
    Case("twilio", "opus_as_mulaw", ANSWERED, "Opus packets of speech sent as mu-law payloads",
         lambda m: BadAudio(tuple(opus_packets(m.speech_at(PHONE_RATE), PHONE_RATE)[:m.frames]))),
    Case("twilio", "silence_to_idle_timeout", IDLE_TIMEOUT, "mu-law silence until the server gives up",
         lambda m: BadAudio((MULAW_SILENCE * frame_bytes(PHONE_RATE, 1),), until_closed=True), garbage=False),
)


# --- Realtime: PCM16 24 kHz, 960 bytes per 20 ms (or G.711 mu-law 8 kHz once switched) --------

PCM16_FRAME = frame_bytes(REALTIME_RATE, 2)


def _declare(audio_format: dict) -> dict:
    """The GA session.update a client sends to change its audio format (both ways, as required)."""
    return {"type": "session.update", "session": {"type": "realtime", "audio": {
        "input": {"format": audio_format}, "output": {"format": audio_format}}}}


REALTIME_CASES = (
    Case("realtime", "session_declares_16khz", ERROR_ANSWERED,
         "session.update asks for audio/pcm at 16000 Hz, then sends 16 kHz PCM16",
         lambda m: BadAudio(chop(_pcm16(m.speech_at(16_000)), frame_bytes(16_000, 2), m.frames),
                            before=(_declare({"type": "audio/pcm", "rate": 16000}),)),
         garbage=False),
    Case("realtime", "beta_input_audio_format", ERROR_ANSWERED,
         "session.update with the beta input_audio_format g711_ulaw, then mu-law bytes",
         lambda m: BadAudio(_mulaw_frames(m.speech_at(PHONE_RATE), m.frames),
                            before=({"type": "session.update", "session": {"input_audio_format": "g711_ulaw"}},))),
    Case("realtime", "8khz_as_24khz", ANSWERED, "8 kHz PCM16 speech in 20 ms appends, declared 24 kHz",
         lambda m: BadAudio(chop(_pcm16(m.speech_at(PHONE_RATE)), frame_bytes(PHONE_RATE, 2), m.frames)),
         garbage=False),
    Case("realtime", "odd_lengths", CLOSED_BAD_INPUT, "PCM16 cut at odd byte lengths (959, 961, 1)",
         lambda m: BadAudio(odd_chunks(_pcm16(m.speech_at(REALTIME_RATE)), frame_bytes(REALTIME_RATE, 2), m.frames,
                                       m.seed)), garbage=False),
    Case("realtime", "float32_nan_inf", ANSWERED, "float32 samples with NaN/Inf bit patterns sent as PCM16",
         lambda m: BadAudio(chop(floats_with_non_finite(m.speech_at(REALTIME_RATE)), frame_bytes(REALTIME_RATE, 4),
                                 m.frames))),
    Case("realtime", "full_scale_noise", ANSWERED, "white noise at full scale",
         lambda m: BadAudio(chop(_pcm16(full_scale_noise(m, REALTIME_RATE)), PCM16_FRAME, m.frames))),
    Case("realtime", "opus_as_pcm16", ANSWERED, "a stream of Opus packets of speech sent as PCM16",
         lambda m: BadAudio(chop(b"".join(opus_packets(m.speech_at(REALTIME_RATE), REALTIME_RATE)), PCM16_FRAME,
                                 m.frames))),
    Case("realtime", "format_switch_mid_stream", ANSWERED,
         "switches to audio/pcmu mid-stream but goes on sending PCM16 (6x the audio per append: past "
         "limits.max_audio_ahead_seconds, refused as rate_limited)",
         lambda m: BadAudio(chop(_pcm16(m.speech_at(REALTIME_RATE)), PCM16_FRAME, m.frames),
                            before=(_declare({"type": "audio/pcmu"}),), good_format="pcmu")),
    Case("realtime", "silence_to_idle_timeout", IDLE_TIMEOUT, "PCM16 silence until the server gives up",
         lambda m: BadAudio((bytes(PCM16_FRAME),), until_closed=True), garbage=False),
)

CASES = TWILIO_CASES + REALTIME_CASES
