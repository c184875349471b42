"""A synthetic browser caller over WebRTC (aiortc), the way pipecat's SmallWebRTC clients call.

Like the phone caller it behaves like a microphone: one 20 ms frame every 20 ms on a
real-time schedule, silence until the conversation has something to say. What it
hears goes to a `ReplyTracker`; a WebRTC track carries silence frames between replies,
so the tracker marks a reply by its first frame that is not silence.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import av
import httpx
import numpy as np
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from agent.transports.jitter import ImmediateAudioJitterBuffer
from latency_bench.callers.audio import last_voiced_sample, resample
from latency_bench.callers.conversation import PlannedTurn, converse
from latency_bench.callers.listen import ReplyTracker, TurnRecord

SEND_RATE = 48_000  # Opus' own rate: the encoder then needs no resampling
FRAME_SECONDS = 0.02
FRAME_SAMPLES = int(SEND_RATE * FRAME_SECONDS)
CONNECT_TIMEOUT_S = 10.0
HTTP_TIMEOUT_S = 15.0
DATA_CHANNEL_LABEL = "chat"


@dataclass
class CallResult:
    call_id: str | None
    turns: list[TurnRecord]
    reply_rate: int | None = None  # rate of the kept reply audio (aiortc decodes Opus at 48 kHz)
    error: str | None = None


class _Speech:
    def __init__(self, samples: np.ndarray, on_first_frame: Callable[[float], None]) -> None:
        self.samples = samples
        self.voiced_end = last_voiced_sample(samples, SEND_RATE)
        self.on_first_frame = on_first_frame
        self.position = 0
        self.voiced_sent_at: float | None = None
        self.done: asyncio.Future[float] = asyncio.get_running_loop().create_future()


class MicrophoneTrack(MediaStreamTrack):
    """The caller's microphone: queued speech when there is some, silence otherwise.

    Frames are paced by their timestamps (as aiortc's AudioStreamTrack paces), so the
    server hears real-time audio and TTFS starts when the frame holding the last voiced
    sample leaves, not when the utterance was queued.
    """

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._queue: deque[_Speech] = deque()
        self._pts = 0
        self._start: float | None = None
        self.frames_sent = 0

    def say(self, samples: np.ndarray, on_first_frame: Callable[[float], None]) -> asyncio.Future[float]:
        speech = _Speech(samples, on_first_frame)
        self._queue.append(speech)
        return speech.done

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.monotonic()
        else:
            self._pts += FRAME_SAMPLES
            await asyncio.sleep(max(0.0, self._start + self._pts / SEND_RATE - time.monotonic()))
        chunk = self._next_chunk(time.time())
        frame = av.AudioFrame.from_ndarray(chunk.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = SEND_RATE
        frame.pts = self._pts
        frame.time_base = fractions.Fraction(1, SEND_RATE)
        self.frames_sent += 1
        return frame

    def _next_chunk(self, now: float) -> np.ndarray:
        if not self._queue:
            return np.zeros(FRAME_SAMPLES, dtype=np.int16)
        speech = self._queue[0]
        if speech.position == 0:
            speech.on_first_frame(now)
        chunk = speech.samples[speech.position : speech.position + FRAME_SAMPLES]
        if speech.position < speech.voiced_end:
            speech.voiced_sent_at = now
        speech.position += FRAME_SAMPLES
        if speech.position >= len(speech.samples):
            self._queue.popleft()
            if not speech.done.done():
                speech.done.set_result(speech.voiced_sent_at or now)
        return np.pad(chunk, (0, FRAME_SAMPLES - len(chunk))).astype(np.int16)

    def stop(self) -> None:
        for speech in self._queue:
            if not speech.done.done():
                speech.done.set_exception(ConnectionError("the call ended while the caller was speaking"))
        self._queue.clear()
        super().stop()


class WebRTCLine:
    def __init__(self, mic: MicrophoneTrack) -> None:
        self._mic = mic

    async def say(self, samples: np.ndarray, rate: int, on_first_frame: Callable[[float], None]) -> float:
        return await self._mic.say(resample(samples, rate, SEND_RATE), on_first_frame)

    async def pause(self, seconds: float) -> None:
        await asyncio.sleep(seconds)  # the microphone sends silence by itself


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


async def _listen(track: MediaStreamTrack, tracker: ReplyTracker, rates: list[int],
                  on_frame: Callable[[float], None]) -> None:
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        if not rates:
            rates.append(frame.sample_rate)
        now = time.time()
        on_frame(now)
        tracker.hear(now, frame_to_mono(frame), frame.sample_rate)


async def call(
    offer_url: str,
    plan: list[PlannedTurn],
    *,
    caller: int = 0,
    keep_audio: bool = False,
    reply_timeout_s: float = 20.0,
    reply_quiet_s: float = 1.5,
    on_turn: Callable[[TurnRecord], None] | None = None,
    agent: str | None = None,
    stop_when: Callable[[], bool] = lambda: False,
    on_connected: Callable[[str | None], None] = lambda call_id: None,
    on_frame_heard: Callable[[float], None] = lambda at: None,
    mic: MicrophoneTrack | None = None,
) -> CallResult:
    """Calls `offer_url` (the server's POST /api/offer) and goes through `plan` (or until
    `stop_when()`, asked before each turn). `on_connected(call_id)` once the peer connection is
    up; `on_frame_heard(wall time)` for every frame received, silence included; `mic`: the
    microphone to send (its `frames_sent` counts what left)."""
    # No ICE servers: aiortc's default would contact a public STUN server; host candidates suffice here.
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    mic = mic or MicrophoneTrack()
    tracker = ReplyTracker(keep_audio=keep_audio)
    rates: list[int] = []
    listeners: list[asyncio.Task] = []
    settled = asyncio.Event()  # connected, or failed/closed for good
    call_id = None

    @pc.on("track")
    def _on_track(track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            listeners.append(asyncio.ensure_future(_listen(track, tracker, rates, on_frame_heard)))

    @pc.on("connectionstatechange")
    def _on_state() -> None:
        if pc.connectionState in ("connected", "failed", "closed"):
            settled.set()

    try:
        # sendrecv at index 0: SmallWebRTC answers on the first transceiver with its own audio.
        transceiver = pc.addTransceiver(mic, direction="sendrecv")
        # aiortc's receiver holds 4 packets (80 ms) before it plays one; the phone caller counts
        # audio as it arrives. Like for like: the server's buffer, each packet on as it arrives.
        transceiver.receiver._RTCRtpReceiver__jitter_buffer = ImmediateAudioJitterBuffer()
        # Browser clients open one; without it the server queues (then drops) its RTVI messages.
        pc.createDataChannel(DATA_CHANNEL_LABEL)
        # aiortc's setLocalDescription gathers every (host) candidate before it returns.
        await pc.setLocalDescription(await pc.createOffer())
        if "a=candidate:" not in pc.localDescription.sdp:
            # aioice never offers 127.0.0.1, so a host whose only interface is loopback has none.
            raise ConnectionError("no ICE host candidate: this host has no interface address but 127.0.0.1")
        async with httpx.AsyncClient(timeout=HTTP_TIMEOUT_S) as http:
            offer = {"sdp": pc.localDescription.sdp, "type": pc.localDescription.type}
            response = await http.post(offer_url, json={**offer, "agent": agent} if agent else offer)
        if response.status_code != 200:
            raise ConnectionError(f"offer refused: HTTP {response.status_code} {response.text}")
        answer = response.json()
        call_id = answer.get("call_id")
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(settled.wait(), CONNECT_TIMEOUT_S)
        if pc.connectionState != "connected":
            raise ConnectionError(f"WebRTC call did not connect (connectionState={pc.connectionState}, "
                                  f"iceConnectionState={pc.iceConnectionState})")
        on_connected(call_id)
        await converse(WebRTCLine(mic), tracker, plan, caller=caller, transport="webrtc",
                       reply_timeout_s=reply_timeout_s, reply_quiet_s=reply_quiet_s, on_turn=on_turn,
                       stop_when=stop_when)
    finally:
        mic.stop()
        await pc.close()
        for task in listeners:
            task.cancel()
        outcomes = await asyncio.gather(*listeners, return_exceptions=True)
    for outcome in outcomes:  # a listener that crashed would otherwise read as "no reply"
        if isinstance(outcome, Exception):
            raise outcome
    return CallResult(call_id, tracker.turns, rates[0] if rates else None)
