"""A synthetic browser caller over WebRTC (aiortc), the way pipecat's SmallWebRTC clients call.

Like the phone caller, it behaves like a microphone: one 20 ms frame every 20 ms on a
real-time schedule, silence, the question, then silence until it hangs up. TTFS is
measured from the caller's side: from producing the frame that holds the question's
last voiced sample to receiving the first reply frame that is not silence.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import time
from dataclasses import dataclass

import av
import httpx
import numpy as np
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from latency_bench.audio import last_voiced_sample, resample

SEND_RATE = 48_000  # Opus' own rate: the encoder then needs no resampling
REPLY_RATE = 16_000  # what the reply is handed back at (Whisper's rate)
FRAME_SECONDS = 0.02
FRAME_SAMPLES = int(SEND_RATE * FRAME_SECONDS)
VOICED_RMS = 0.01  # of full scale; Opus-coded silence decodes to (near) zero
CONNECT_TIMEOUT_S = 10.0
HTTP_TIMEOUT_S = 15.0
DATA_CHANNEL_LABEL = "chat"


@dataclass
class CallResult:
    call_id: str
    speech_end_sent_at: float  # wall clock
    first_reply_at: float | None  # wall clock
    reply_audio: np.ndarray  # int16 mono at REPLY_RATE, from the first voiced reply frame on

    @property
    def ttfs_seconds(self) -> float | None:
        return None if self.first_reply_at is None else self.first_reply_at - self.speech_end_sent_at

    @property
    def reply_seconds(self) -> float:
        return len(self.reply_audio) / REPLY_RATE


class CallerTrack(MediaStreamTrack):
    """The caller's microphone: leading silence, the speech, then silence until stopped.

    Frames are paced by their timestamps (as aiortc's AudioStreamTrack paces), so the
    server hears real-time audio and the clock that measures TTFS starts when the
    frame holding the last voiced sample leaves, not when the whole utterance was queued.
    """

    kind = "audio"

    def __init__(self, speech: np.ndarray, leading_silence_s: float) -> None:
        super().__init__()
        lead = np.zeros(int(SEND_RATE * leading_silence_s), dtype=np.int16)
        self.audio = np.concatenate([lead, speech.astype(np.int16)])
        self._voiced_end = len(lead) + last_voiced_sample(speech, SEND_RATE)
        self._pts = 0
        self._start: float | None = None
        self.speech_end_sent_at: float | None = None  # wall clock; set once the last voiced frame went out

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.monotonic()
        else:
            self._pts += FRAME_SAMPLES
            await asyncio.sleep(max(0.0, self._start + self._pts / SEND_RATE - time.monotonic()))
        chunk = self.audio[self._pts : self._pts + FRAME_SAMPLES]
        chunk = np.pad(chunk, (0, FRAME_SAMPLES - len(chunk)))
        if self.speech_end_sent_at is None and self._pts + FRAME_SAMPLES >= self._voiced_end:
            self.speech_end_sent_at = time.time()
        frame = av.AudioFrame.from_ndarray(chunk.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = SEND_RATE
        frame.pts = self._pts
        frame.time_base = fractions.Fraction(1, SEND_RATE)
        return frame


def frame_to_mono(frame: av.AudioFrame) -> np.ndarray:
    """Any decoded frame -> int16 mono at the frame's own rate.

    to_ndarray() is (channels, samples) for planar formats but (1, samples * channels),
    interleaved, for packed ones such as aiortc's Opus output (s16, stereo, 48 kHz).
    """
    data = frame.to_ndarray()
    channels = len(frame.layout.channels)
    samples = data.reshape(channels, -1) if frame.format.is_planar else data.reshape(-1, channels).T
    mono = samples.astype(np.float64).mean(axis=0)
    if np.issubdtype(data.dtype, np.floating):
        mono = mono * 32768.0
    return np.clip(mono, -32768, 32767).astype(np.int16)


class _Listener:
    """Reads the agent's audio; notes when it first and last was voiced, keeps it from the first."""

    def __init__(self) -> None:
        self.first_voiced_at: float | None = None
        self.last_voiced_at: float | None = None
        self.rate: int | None = None
        self.chunks: list[np.ndarray] = []

    async def run(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            now = time.time()
            self.rate = self.rate or frame.sample_rate  # aiortc decodes Opus at 48 kHz throughout
            mono = resample(frame_to_mono(frame), frame.sample_rate, self.rate)
            if np.sqrt(np.mean(mono.astype(np.float64) ** 2)) / 32768.0 > VOICED_RMS:
                self.first_voiced_at = self.first_voiced_at or now
                self.last_voiced_at = now
            if self.first_voiced_at is not None:
                self.chunks.append(mono)

    def reply_audio(self) -> np.ndarray:
        if not self.chunks or self.rate is None:
            return np.zeros(0, dtype=np.int16)
        return resample(np.concatenate(self.chunks), self.rate, REPLY_RATE)


async def call(
    offer_url: str,
    speech: np.ndarray,
    speech_rate: int,
    *,
    leading_silence_s: float = 0.6,
    reply_timeout_s: float = 25.0,
    reply_quiet_s: float = 1.5,
) -> CallResult:
    """Calls `offer_url` (the server's POST /api/offer), says `speech`, waits for the reply to end."""
    # No ICE servers: aiortc's default would contact a public STUN server; host candidates suffice here.
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    mic = CallerTrack(resample(speech, speech_rate, SEND_RATE), leading_silence_s)
    listener = _Listener()
    tasks: list[asyncio.Task] = []
    settled = asyncio.Event()  # connected, or failed/closed for good

    @pc.on("track")
    def _on_track(track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            tasks.append(asyncio.ensure_future(listener.run(track)))

    @pc.on("connectionstatechange")
    def _on_state() -> None:
        if pc.connectionState in ("connected", "failed", "closed"):
            settled.set()

    try:
        # sendrecv at index 0: SmallWebRTC answers on the first transceiver with its own audio.
        pc.addTransceiver(mic, direction="sendrecv")
        # Browser clients open one; without it the server queues (then drops) its RTVI messages.
        pc.createDataChannel(DATA_CHANNEL_LABEL)
        # aiortc's setLocalDescription gathers every (host) candidate before it returns.
        await pc.setLocalDescription(await pc.createOffer())
        if pc.iceGatheringState != "complete":
            raise RuntimeError(f"ICE gathering did not complete: {pc.iceGatheringState}")
        if "a=candidate:" not in pc.localDescription.sdp:
            # aioice never offers 127.0.0.1, so a host whose only interface is loopback has none.
            raise ConnectionError("no ICE host candidate: this host has no interface address but 127.0.0.1")
        async with httpx.AsyncClient(timeout=HTTP_TIMEOUT_S) as http:
            response = await http.post(offer_url, json={"sdp": pc.localDescription.sdp,
                                                        "type": pc.localDescription.type})
        if response.status_code != 200:
            raise ConnectionError(f"offer refused: HTTP {response.status_code} {response.text}")
        answer = response.json()
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(settled.wait(), CONNECT_TIMEOUT_S)
        if pc.connectionState != "connected":
            raise ConnectionError(f"WebRTC call did not connect (connectionState={pc.connectionState}, "
                                  f"iceConnectionState={pc.iceConnectionState})")
        speaking_s = len(mic.audio) / SEND_RATE
        await _wait_for_reply_end(mic, listener, speaking_s + reply_timeout_s, reply_quiet_s)
    finally:
        mic.stop()
        await pc.close()
        for task in tasks:
            task.cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    for outcome in outcomes:  # a listener that crashed would otherwise read as "no reply"
        if isinstance(outcome, Exception):
            raise outcome
    return CallResult(answer["call_id"], mic.speech_end_sent_at or 0.0, listener.first_voiced_at,
                      listener.reply_audio())


async def _wait_for_reply_end(mic: CallerTrack, listener: _Listener, timeout_s: float, quiet_s: float) -> None:
    """Until the question was said and the reply started, then stayed silent `quiet_s`; or `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (mic.speech_end_sent_at is not None and listener.last_voiced_at is not None
                and time.time() - listener.last_voiced_at > quiet_s):
            return
        await asyncio.sleep(FRAME_SECONDS)
