"""Where a reply's first audio waits on the WebRTC path, and on the phone path, offline.

    python -m latency_bench webrtc-path [--trials 15] [--json FILE] [--no-loopback] [--gil-load]

No server and no models: each stage a reply's first audio crosses is rebuilt from the
objects the server uses (pipecat's stream resampler, SmallWebRTC's `RawAudioTrack`, aiortc's
Opus encoder, an aiortc sender and receiver, pipecat's Twilio output pacing) and fed a
known signal: `onset` ms of silence, then a tone. Three kinds of figure:

- Signal hold-back (deterministic): how much audio a stage keeps back after its first
  input chunk, and whether its output is shifted in time.
- Wall time (median of --trials): from the moment the output transport takes a reply's
  first chunk (pipecat pushes BotStartedSpeakingFrame then: the server's
  "first_audio_sent") to the moment the bench's caller code marks it audible, split at
  the stage boundaries. "beyond real time" subtracts the onset: a stage that plays audio
  out in real time has to wait `onset` ms before the tone even exists.
- Alternatives, measured the same way: a 48 kHz WebRTC output track, 20 ms track frames,
  smaller output chunks, other resampler qualities, a smaller aiortc jitter-buffer prefetch;
  with --gil-load, the path again while a pure-Python thread competes for the GIL.

The WebRTC end-to-end piece is a loopback aiortc pair in this process (no ICE servers;
aioice offers only non-loopback host addresses, so it runs over this host's own
interface address). Both ends share this process, so the CPU figure covers both.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import fractions
import json
import random
import statistics
import sys
import time
import types
from dataclasses import dataclass, field

import av
import numpy as np
from loguru import logger

logger.remove()  # pipecat logs every track swap at DEBUG
logger.add(sys.stderr, level="WARNING")

from aiortc import RTCConfiguration, RTCPeerConnection, RTCRtpReceiver, RTCSessionDescription  # noqa: E402
from aiortc.codecs.opus import OpusDecoder, OpusEncoder  # noqa: E402
from aiortc.jitterbuffer import JitterBuffer, JitterFrame  # noqa: E402
from pipecat.audio.resamplers.soxr_stream_resampler import SOXRStreamAudioResampler  # noqa: E402
from pipecat.audio.utils import create_stream_resampler, pcm_to_ulaw, ulaw_to_pcm  # noqa: E402
from pipecat.transports.smallwebrtc.transport import RawAudioTrack  # noqa: E402
from pipecat.transports.websocket.fastapi import FastAPIWebsocketOutputTransport  # noqa: E402

from latency_bench.callers.audio import mulaw_decode  # noqa: E402
from latency_bench.callers.listen import is_audible  # noqa: E402
from latency_bench.callers.webrtc_caller import MicrophoneTrack, frame_to_mono  # noqa: E402

PIPER_RATE = 22_050  # models/piper_tts.py: the joe voice's rate
PIPER_CHUNK_S = 0.2  # PiperOptions.chunk_seconds
WEBRTC_RATE = 24_000  # agent/transports/webrtc.py WEBRTC_OUTPUT_SAMPLE_RATE
PHONE_RATE = 8_000  # agent/transports/twilio.py PHONE_SAMPLE_RATE
PIPELINE_IN_RATE = 16_000  # pipelines/voice.py PIPELINE_INPUT_SAMPLE_RATE
OUT_CHUNK_10MS = 4  # TransportParams.audio_out_10ms_chunks default: 40 ms output chunks
# Where the joe voice's first 10 ms window passes listen.AUDIBLE_RMS, measured on five
# replies ("Sure, I can help with that." 10 ms, "Our office opens at nine..." 80 ms,
# "Hello! Thanks for calling." 40, "The refund takes about..." 50, "Yes." 60).
PIPER_ONSETS_MS = (10, 80, 40, 50, 60)
TONE_S = 0.3
HEARD_TIMEOUT_S = 1.5


# ----------------------------------------------------------------------------- helpers

@dataclass
class Row:
    path: str
    stage: str
    values: list[float]
    notes: str = ""
    unit: str = "ms"

    def cells(self) -> tuple[str, str, str, str]:
        if not self.values:
            return self.path, self.stage, "n/a", self.notes
        med = statistics.median(self.values)
        if len(self.values) == 1 or max(self.values) == min(self.values):
            return self.path, self.stage, f"{med:.1f}", self.notes
        mean = statistics.fmean(self.values)
        return (self.path, self.stage,
                f"{med:.1f} (mean {mean:.1f}) [{min(self.values):.0f}..{max(self.values):.0f}]", self.notes)


def reply_signal(rate: int, onset_ms: float, *, chunk_ms: float = 10 * OUT_CHUNK_10MS) -> np.ndarray:
    """`onset_ms` of digital silence, a loud two-tone, silence; a whole number of chunks."""
    lead = int(rate * onset_ms / 1000)
    t = np.arange(int(rate * TONE_S)) / rate
    tone = 0.25 * np.sin(2 * np.pi * 220 * t) + 0.15 * np.sin(2 * np.pi * 660 * t)
    x = np.concatenate([np.zeros(lead), tone, np.zeros(int(rate * 0.06))])
    chunk = int(rate * chunk_ms / 1000)
    x = np.pad(x, (0, (-len(x)) % chunk))
    return np.clip(x * 32767, -32768, 32767).astype(np.int16)


def first_loud(samples: np.ndarray, threshold: int = 2000) -> int | None:
    idx = np.nonzero(np.abs(samples.astype(np.int32)) > threshold)[0]
    return int(idx[0]) if len(idx) else None


# ---------------------------------------------------------------- 1. resampling steps

async def resampler_profile(in_rate: int, out_rate: int, *, quality: str, chunk_s: float,
                            clear_after_secs: float | None) -> dict:
    """Feed white noise with a pulse through pipecat's stream resampler, chunk by chunk."""
    r = SOXRStreamAudioResampler(quality=quality, clear_after_secs=clear_after_secs)
    n = int(in_rate * chunk_s)
    chunks = 60
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(n * chunks) * 600).astype(np.int16)
    pulse_at = int(in_rate * 0.05)
    x[pulse_at:pulse_at + in_rate // 100] = 20000  # a 10 ms step at 50 ms: where does it come out?
    held, outs, first_out_chunk = [], [], None
    total_in = total_out = 0
    for k in range(chunks):
        out = np.frombuffer(await r.resample(x[k * n:(k + 1) * n].tobytes(), in_rate, out_rate), dtype=np.int16)
        outs.append(out)
        total_in += n
        total_out += len(out)
        if first_out_chunk is None and len(out):
            first_out_chunk = k
        held.append(total_in / in_rate * 1000 - total_out / out_rate * 1000)
    y = np.concatenate(outs)
    loud = first_loud(y, 12000)
    return {
        "held_after_first_ms": held[0],
        "held_mean_ms": float(np.mean(held[5:])),
        "held_max_ms": float(np.max(held)),
        "first_out_chunk": first_out_chunk,
        "first_out_wall_ms": (first_out_chunk or 0) * chunk_s * 1000,  # chunks arriving in real time
        "shift_ms": (loud / out_rate - pulse_at / in_rate) * 1000 if loud is not None else float("nan"),
    }


async def resampler_cpu_ms_per_s(in_rate: int, out_rate: int, quality: str, chunk_s: float, runs: int) -> float:
    n = int(in_rate * chunk_s)
    x = (np.random.default_rng(1).standard_normal(in_rate * 2) * 3000).astype(np.int16)
    times = []
    for _ in range(runs):
        r = SOXRStreamAudioResampler(quality=quality, clear_after_secs=None)
        t = time.process_time()
        for k in range(0, len(x) - n + 1, n):
            await r.resample(x[k:k + n].tobytes(), in_rate, out_rate)
        times.append((time.process_time() - t) / 2 * 1000)
    return statistics.median(times)


def av_resampler_profile(in_rate: int, in_layout: str, out_rate: int, out_layout: str, chunk_s: float,
                         frame_size: int | None = None) -> dict:
    """The same for an av (ffmpeg swr) AudioResampler, as SmallWebRTC's input reader and
    aiortc's Opus encoder use one."""
    kw = {"frame_size": frame_size} if frame_size else {}
    r = av.AudioResampler(format="s16", layout=out_layout, rate=out_rate, **kw)
    channels = 2 if in_layout == "stereo" else 1
    n = int(in_rate * chunk_s)
    x = np.zeros(n * 40, dtype=np.int16)
    pulse_at = int(in_rate * 0.05)
    x[pulse_at:pulse_at + in_rate // 100] = 20000
    held, outs, total_in, total_out = [], [], 0, 0
    for k in range(40):
        seg = x[k * n:(k + 1) * n]
        data = np.repeat(seg, channels)[None, :] if channels == 2 else seg[None, :]
        f = av.AudioFrame.from_ndarray(data, format="s16", layout=in_layout)
        f.sample_rate = in_rate
        f.pts = k * n
        f.time_base = fractions.Fraction(1, in_rate)
        for o in r.resample(f):
            a = o.to_ndarray().reshape(-1)
            a = a.reshape(-1, 2)[:, 0] if out_layout == "stereo" else a
            outs.append(a)
            total_out += len(a)
        total_in += n
        held.append(total_in / in_rate * 1000 - total_out / out_rate * 1000)
    y = np.concatenate(outs) if outs else np.zeros(0, np.int16)
    loud = first_loud(y, 12000)
    return {"held_after_first_ms": held[0], "held_mean_ms": float(np.mean(held[5:])),
            "held_max_ms": float(np.max(held)),
            "shift_ms": (loud / out_rate - pulse_at / in_rate) * 1000 if loud is not None else float("nan")}


async def resampling_rows(runs: int) -> list[Row]:
    rows: list[Row] = []

    async def add(path: str, stage: str, in_rate: int, out_rate: int, quality: str, chunk_s: float,
                  clear: float | None, note: str, cpu: bool = True) -> None:
        p = await resampler_profile(in_rate, out_rate, quality=quality, chunk_s=chunk_s, clear_after_secs=clear)
        cpu_txt = f"; CPU {await resampler_cpu_ms_per_s(in_rate, out_rate, quality, chunk_s, runs):.2f} ms/s audio" \
            if cpu else ""
        rows.append(Row(path, stage, [p["held_after_first_ms"]],
                        f"{chunk_s * 1000:.0f} ms chunks; 1st output at chunk {p['first_out_chunk']}; then holds "
                        f"mean {p['held_mean_ms']:.0f}/max {p['held_max_ms']:.0f} ms; output shift "
                        f"{p['shift_ms']:+.2f} ms{cpu_txt}{note}"))

    sentence = "; a sentence arrives at once, so no wall delay"
    await add("webrtc", f"TTS resample {PIPER_RATE}->{WEBRTC_RATE} VHQ (TTSService._resampler)",
              PIPER_RATE, WEBRTC_RATE, "VHQ", PIPER_CHUNK_S, 0.2, sentence)
    await add("phone", f"TTS resample {PIPER_RATE}->{PHONE_RATE} VHQ (TTSService._resampler)",
              PIPER_RATE, PHONE_RATE, "VHQ", PIPER_CHUNK_S, 0.2, sentence)
    await add("alt", f"TTS resample {PIPER_RATE}->48000 VHQ (48 kHz output)",
              PIPER_RATE, 48_000, "VHQ", PIPER_CHUNK_S, 0.2, "")
    for q in ("HQ", "LQ", "QQ"):
        await add("alt", f"TTS resample {PIPER_RATE}->{WEBRTC_RATE} {q}", PIPER_RATE, WEBRTC_RATE, q,
                  PIPER_CHUNK_S, 0.2, "")
    # The same step fed in small real-time pieces (a streaming TTS): then the hold is wall time.
    await add("alt", f"TTS resample {PIPER_RATE}->{WEBRTC_RATE} VHQ, 20 ms chunks", PIPER_RATE, WEBRTC_RATE,
              "VHQ", 0.02, 0.2, "", cpu=False)
    await add("alt", f"TTS resample {PIPER_RATE}->{PHONE_RATE} VHQ, 20 ms chunks", PIPER_RATE, PHONE_RATE,
              "VHQ", 0.02, 0.2, "", cpu=False)
    await add("alt", "resample 24000->48000 VHQ, 40 ms chunks (Orpheus at a 48 kHz output)", 24_000, 48_000,
              "VHQ", 0.04, None, "")
    # Not latency, but it shows up as clipped audio: TTSService never flushes its resampler, and
    # its 0.2 s clear_after_secs discards what it holds when the next sentence comes later.
    for path, rate in (("webrtc", WEBRTC_RATE), ("phone", PHONE_RATE)):
        rows.append(Row(path, f"TTS resampler tail lost per sentence ({PIPER_RATE}->{rate})",
                        [await sentence_tail_lost_ms(rate)],
                        "1 s sentence, next one 0.3 s later: held audio dropped by clear(), never played"))
    # The output transport's own resampler (MediaSender): TTS already delivers the output rate.
    for path, rate in (("webrtc", WEBRTC_RATE), ("phone", PHONE_RATE)):
        r = create_stream_resampler(clear_after_secs=None)
        chunk = bytes(int(rate * 0.04) * 2)
        same = await r.resample(chunk, rate, rate) is chunk
        rows.append(Row(path, f"MediaSender resample {rate}->{rate} + 40 ms chunking", [0.0],
                        "pass-through (same rate)" if same else "NOT a pass-through"))
    # The phone serializer's output resampler (pcm_to_ulaw 8000->8000) is also a pass-through.
    r = create_stream_resampler()
    chunk = bytes(640)
    same = len(await pcm_to_ulaw(chunk, PHONE_RATE, PHONE_RATE, r)) == 320
    rows.append(Row("phone", "Twilio serializer pcm_to_ulaw 8000->8000", [0.0],
                    "pass-through + mu-law" if same else "resamples"))
    # aiortc's Opus encoder resamples the track's audio to 48 kHz stereo with swr (frame_size 960).
    for rate in (WEBRTC_RATE, 48_000):
        p = av_resampler_profile(rate, "mono", 48_000, "stereo", 0.01, frame_size=960)
        rows.append(Row("webrtc" if rate == WEBRTC_RATE else "alt",
                        f"OpusEncoder swr {rate} mono->48000 stereo (frame_size 960)", [p["held_after_first_ms"]],
                        f"10 ms frames; holds mean {p['held_mean_ms']:.1f}/max {p['held_max_ms']:.1f} ms "
                        f"(960-sample framing); output shift {p['shift_ms']:+.2f} ms"))
    return rows


async def sentence_tail_lost_ms(out_rate: int) -> float:
    r = create_stream_resampler()  # as TTSService.__init__ makes it
    x = (np.random.default_rng(2).standard_normal(PIPER_RATE) * 3000).astype(np.int16)
    n = int(PIPER_RATE * PIPER_CHUNK_S)
    out = 0
    for k in range(0, len(x), n):
        out += len(await r.resample(x[k:k + n].tobytes(), PIPER_RATE, out_rate)) // 2
    await asyncio.sleep(0.3)
    nxt = len(await r.resample(x[:n].tobytes(), PIPER_RATE, out_rate)) // 2
    fresh = SOXRStreamAudioResampler()
    fresh_out = len(await fresh.resample(x[:n].tobytes(), PIPER_RATE, out_rate)) // 2
    # A kept tail would come out ahead of the next sentence's audio; a dropped one never does.
    kept_ms = (nxt - fresh_out) / out_rate * 1000
    return (1000 - out / out_rate * 1000) - max(0.0, kept_ms)


async def input_resampling_rows() -> list[Row]:
    """The caller's speech on its way in: a real-time stream, so a hold is a wall delay,
    and the end of the caller's speech reaches the VAD that much later."""
    p = await resampler_profile(PHONE_RATE, PIPELINE_IN_RATE, quality="VHQ", chunk_s=0.02, clear_after_secs=0.2)
    q = await resampler_profile(PHONE_RATE, PIPELINE_IN_RATE, quality="QQ", chunk_s=0.02, clear_after_secs=0.2)
    a = av_resampler_profile(48_000, "stereo", PIPELINE_IN_RATE, "mono", 0.02)
    return [
        Row("phone in", "Twilio serializer ulaw_to_pcm 8000->16000 VHQ (_input_resampler)", [p["held_mean_ms"]],
            f"20 ms frames; mean lag (max {p['held_max_ms']:.0f}); QQ would lag {q['held_mean_ms']:.1f} ms"),
        Row("webrtc in", "SmallWebRTC reader av.AudioResampler 48000 stereo->16000", [a["held_mean_ms"]],
            f"20 ms frames; mean lag (max {a['held_max_ms']:.1f})"),
    ]


# ------------------------------------------------------------------ 2. Opus framing

def opus_rows() -> list[Row]:
    """aiortc's OpusEncoder fed 10 ms frames as RawAudioTrack.recv() gives them: after how
    many more frames does the packet holding a sound come out (wall time at a paced track),
    and how late is the sound inside the decoded packet (codec lookahead)."""
    rows = []
    for rate in (WEBRTC_RATE, 48_000):
        waits, shifts = [], []
        for click_frame in (20, 21):  # both phases of the 20 ms packet
            enc, dec = OpusEncoder(), OpusDecoder()
            sp = rate // 100
            x = np.zeros(sp * 40, dtype=np.int16)
            x[click_frame * sp:(click_frame + 1) * sp] = 16000
            out, packet_at = [], None
            for k in range(40):
                f = av.AudioFrame.from_ndarray(x[None, k * sp:(k + 1) * sp], format="s16", layout="mono")
                f.sample_rate, f.pts, f.time_base = rate, k * sp, fractions.Fraction(1, rate)
                payloads, ts = enc.encode(f)
                for payload in payloads:
                    for d in dec.decode(JitterFrame(payload, ts)):
                        mono = d.to_ndarray().reshape(-1, 2)[:, 0]
                        if packet_at is None and np.abs(mono).max() > 2000:
                            packet_at = k
                        out.append(mono)
            y = np.concatenate(out)
            waits.append((packet_at - click_frame) * 10.0)
            shifts.append(first_loud(y) / 48.0 - click_frame * 10.0)
        path = "webrtc" if rate == WEBRTC_RATE else "alt"
        rows.append(Row(path, f"Opus packet assembly, {rate // 1000} kHz track (wall, paced 10 ms frames)",
                        [statistics.mean(waits)],
                        f"the packet holding a sound leaves {waits[0]:.0f} or {waits[1]:.0f} ms after its "
                        f"10 ms frame (mean of both phases)"))
        rows.append(Row(path, f"Opus lookahead, {rate // 1000} kHz track (signal)", [statistics.mean(shifts)],
                        "libopus voip delay inside the decoded audio; aiortc does not trim it"))
    return rows


# ------------------------------------------------------- 3. wall time, end to end

class _Probe:
    """Decodes an aiortc receiver's packets as they arrive, to time the first audible one."""

    def __init__(self) -> None:
        self.decoder = OpusDecoder()
        self.armed = False
        self.audible_at: float | None = None

    def packet(self, payload: bytes, timestamp: int, now: float) -> None:
        if not payload:
            return
        try:
            frames = self.decoder.decode(JitterFrame(payload, timestamp))
        except Exception:
            return
        if self.armed and self.audible_at is None:
            for f in frames:
                if is_audible(frame_to_mono(f), f.sample_rate):
                    self.audible_at = now
                    break


_original_handle_rtp = RTCRtpReceiver._handle_rtp_packet


async def _stamped_handle_rtp(self, packet, arrival_time_ms):
    probe = getattr(self, "_bench_probe", None)
    if probe is not None:
        probe.packet(packet.payload, packet.timestamp, time.time())
    return await _original_handle_rtp(self, packet, arrival_time_ms)


RTCRtpReceiver._handle_rtp_packet = _stamped_handle_rtp


class TimedRawAudioTrack(RawAudioTrack):
    """pipecat's SmallWebRTC output track, noting when recv() first returns audible audio.
    `frame_ms=20` is the proposed variant: RawAudioTrack's frame size lives in
    `_samples_per_10ms`/`_bytes_per_10ms` (queueing, pacing and timestamps all use them)."""

    def __init__(self, sample_rate: int, frame_ms: int = 10) -> None:
        super().__init__(sample_rate=sample_rate, auto_silence=True)
        if frame_ms != 10:
            self._samples_per_10ms = sample_rate * frame_ms // 1000
            self._bytes_per_10ms = self._samples_per_10ms * 2
        self.armed = False
        self.audible_at: float | None = None

    async def recv(self):
        frame = await super().recv()
        if self.armed and self.audible_at is None:
            if is_audible(frame.to_ndarray().reshape(-1), self._sample_rate):
                self.audible_at = time.time()
        return frame


@dataclass
class Pair:
    server: RTCPeerConnection
    caller: RTCPeerConnection
    track: TimedRawAudioTrack
    mic: MicrophoneTrack
    caller_probe: _Probe
    server_probe: _Probe
    heard: dict = field(default_factory=dict)  # what the caller's listener and the server's reader saw
    tasks: list = field(default_factory=list)


async def open_pair(out_rate: int, caller_prefetch: int, server_prefetch: int, frame_ms: int = 10) -> Pair:
    """A caller as latency_bench/callers/webrtc_caller.py builds it, and a server end as
    SmallWebRTCConnection + SmallWebRTCClient set theirs up (RawAudioTrack on transceiver 0)."""
    caller = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    server = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    mic = MicrophoneTrack()
    track = TimedRawAudioTrack(out_rate, frame_ms)
    pair = Pair(server, caller, track, mic, _Probe(), _Probe())
    pair.heard = {"caller_armed": False, "caller_at": None, "server_armed": False, "server_at": None,
                  "caller_last_audible": 0.0}

    async def caller_listen(remote) -> None:  # webrtc_caller._listen, with is_audible as ReplyTracker uses it
        while True:
            try:
                frame = await remote.recv()
            except Exception:
                return
            now = time.time()
            if is_audible(frame_to_mono(frame), frame.sample_rate):
                pair.heard["caller_last_audible"] = now
                if pair.heard["caller_armed"] and pair.heard["caller_at"] is None:
                    pair.heard["caller_at"] = now

    async def server_read(remote) -> None:  # SmallWebRTCClient's audio reader: recv, swr to 16 kHz mono
        resampler = av.AudioResampler("s16", "mono", PIPELINE_IN_RATE)
        while True:
            try:
                frame = await remote.recv()
            except Exception:
                return
            for f in resampler.resample(frame):
                now = time.time()
                if pair.heard["server_armed"] and pair.heard["server_at"] is None:
                    if is_audible(f.to_ndarray().astype(np.int16).reshape(-1), PIPELINE_IN_RATE):
                        pair.heard["server_at"] = now

    @caller.on("track")
    def _on_caller_track(t) -> None:
        if t.kind == "audio":
            pair.tasks.append(asyncio.ensure_future(caller_listen(t)))

    @server.on("track")
    def _on_server_track(t) -> None:
        if t.kind == "audio":
            pair.tasks.append(asyncio.ensure_future(server_read(t)))

    transceiver = caller.addTransceiver(mic, direction="sendrecv")
    transceiver.receiver._RTCRtpReceiver__jitter_buffer = JitterBuffer(capacity=16, prefetch=caller_prefetch)
    transceiver.receiver._bench_probe = pair.caller_probe
    await caller.setLocalDescription(await caller.createOffer())
    await server.setRemoteDescription(RTCSessionDescription(caller.localDescription.sdp, "offer"))
    st = server.getTransceivers()[0]
    st.direction = "sendrecv"  # SmallWebRTCConnection.force_transceivers_to_send_recv
    st.receiver._RTCRtpReceiver__jitter_buffer = JitterBuffer(capacity=16, prefetch=server_prefetch)
    st.receiver._bench_probe = pair.server_probe
    await server.setLocalDescription(await server.createAnswer())
    await caller.setRemoteDescription(RTCSessionDescription(server.localDescription.sdp, "answer"))
    for _ in range(200):
        if caller.connectionState == "connected" and server.connectionState == "connected":
            break
        await asyncio.sleep(0.05)
    else:
        raise ConnectionError(f"loopback pair did not connect ({caller.connectionState}/{server.connectionState})")
    st.sender.replaceTrack(track)  # SmallWebRTCConnection.replace_audio_track, at on_client_connected
    await asyncio.sleep(0.5)  # let both directions settle into steady silence
    return pair


async def close_pair(pair: Pair) -> None:
    pair.mic.stop()
    await pair.caller.close()
    await pair.server.close()
    for t in pair.tasks:
        t.cancel()
    await asyncio.gather(*pair.tasks, return_exceptions=True)


async def webrtc_output_trial(pair: Pair, onset_ms: float, chunk_10ms: int = OUT_CHUNK_10MS) -> dict | None:
    """Hand a reply to the transport as pipecat's MediaSender does (40 ms chunks, each write
    awaiting RawAudioTrack's future) and time each boundary."""
    rate = pair.track._sample_rate
    chunk = int(rate * 0.01) * chunk_10ms * 2
    audio = reply_signal(rate, onset_ms).tobytes()
    quiet_by = time.time() + 3.0  # the previous reply has finished reaching the caller (matters under load)
    while time.time() - pair.heard["caller_last_audible"] < 0.25 and time.time() < quiet_by:
        await asyncio.sleep(0.02)
    pair.track.armed, pair.track.audible_at = True, None
    pair.caller_probe.armed, pair.caller_probe.audible_at = True, None
    pair.heard["caller_armed"], pair.heard["caller_at"] = True, None
    await asyncio.sleep(random.uniform(0, 0.02))  # any phase of the track's 10 ms grid

    async def write_all() -> None:  # SmallWebRTCClient.write_audio_frame, chunk after chunk
        for i in range(0, len(audio), chunk):
            await pair.track.add_audio_bytes(audio[i:i + chunk])

    handed = time.time()
    writer = asyncio.ensure_future(write_all())
    deadline = handed + HEARD_TIMEOUT_S
    while pair.heard["caller_at"] is None and time.time() < deadline:
        await asyncio.sleep(0.002)
    await writer
    pair.track.armed = pair.caller_probe.armed = pair.heard["caller_armed"] = False
    await asyncio.sleep(0.15)
    if pair.heard["caller_at"] is None or pair.track.audible_at is None or pair.caller_probe.audible_at is None:
        return None
    return {"onset": onset_ms, "track": (pair.track.audible_at - handed) * 1000,
            "arrived": (pair.caller_probe.audible_at - handed) * 1000,
            "heard": (pair.heard["caller_at"] - handed) * 1000}


async def webrtc_input_trial(pair: Pair) -> dict | None:
    """The caller's microphone (webrtc_caller.MicrophoneTrack) starts a loud sound: when does
    SmallWebRTC's reader hand audible 16 kHz audio to the pipeline?"""
    sent: list[float] = []
    pair.server_probe.armed, pair.server_probe.audible_at = True, None
    pair.heard["server_armed"], pair.heard["server_at"] = True, None
    speech = reply_signal(48_000, 0.0, chunk_ms=20)
    done = pair.mic.say(speech, sent.append)
    deadline = time.time() + HEARD_TIMEOUT_S
    while pair.heard["server_at"] is None and time.time() < deadline:
        await asyncio.sleep(0.002)
    await done
    pair.server_probe.armed = pair.heard["server_armed"] = False
    await asyncio.sleep(0.1 + random.uniform(0, 0.02))
    if not sent or pair.heard["server_at"] is None or pair.server_probe.audible_at is None:
        return None
    return {"arrived": (pair.server_probe.audible_at - sent[0]) * 1000,
            "read": (pair.heard["server_at"] - sent[0]) * 1000}


class GilLoad:
    """A thread of pure-Python work: the GIL is free only at switch intervals (5 ms), as when
    the server's own Python work (pipeline frames, bookkeeping) competes with aiortc's threads."""

    def __init__(self) -> None:
        self._stop = False
        self._thread = None

    def __enter__(self) -> "GilLoad":
        def burn() -> None:
            while not self._stop:
                x = 0
                for i in range(20_000):
                    x += i * i
        self._thread = __import__("threading").Thread(target=burn, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop = True
        self._thread.join()


async def webrtc_variant(label: str, *, out_rate: int, caller_prefetch: int, server_prefetch: int, trials: int,
                         inputs: bool, chunk_10ms: int = OUT_CHUNK_10MS, frame_ms: int = 10,
                         load: bool = False) -> tuple[list[dict], list[dict], float]:
    """Returns output trials, input trials, and CPU ms/s of the idle call (with `load`: the
    track's audio seconds sent per wall second instead, 1.0 being real time)."""
    pair = await open_pair(out_rate, caller_prefetch, server_prefetch, frame_ms)
    stack = GilLoad() if load else None
    try:
        if stack:
            stack.__enter__()
            await asyncio.sleep(0.5)
        cpu0, wall0, ts0 = time.process_time(), time.monotonic(), pair.track._timestamp
        await asyncio.sleep(2.0)  # idle call: silence both ways
        cpu_ms_per_s = (time.process_time() - cpu0) / (time.monotonic() - wall0) * 1000
        if load:
            cpu_ms_per_s = (pair.track._timestamp - ts0) / out_rate / (time.monotonic() - wall0)
        outs = []
        for i in range(trials):
            r = await webrtc_output_trial(pair, PIPER_ONSETS_MS[i % len(PIPER_ONSETS_MS)], chunk_10ms)
            if r:
                outs.append(r)
        ins = []
        if inputs:
            for _ in range(trials):
                r = await webrtc_input_trial(pair)
                if r:
                    ins.append(r)
        print(f"  {label}: {len(outs)}/{trials} output trials, {len(ins)} input trials", file=sys.stderr)
        return outs, ins, cpu_ms_per_s
    finally:
        if stack:
            stack.__exit__(None, None, None)
        await close_pair(pair)


async def phone_output_trials(trials: int) -> list[dict]:
    """pipecat's Twilio output: pcm_to_ulaw on 40 ms chunks, a `media` event each over a
    local WebSocket, paced by FastAPIWebsocketOutputTransport._write_audio_sleep itself;
    the caller side as twilio_caller._receive (mu-law decode, audible check on arrival)."""
    from websockets.asyncio.client import connect
    from websockets.asyncio.server import serve

    server_ws: asyncio.Future = asyncio.get_running_loop().create_future()
    heard: dict = {"armed": False, "at": None}

    async def handler(ws) -> None:
        server_ws.set_result(ws)
        await ws.wait_closed()

    results = []
    async with serve(handler, "127.0.0.1", 0) as srv:
        port = srv.sockets[0].getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}") as client:
            async def receive() -> None:
                async for message in client:
                    event = json.loads(message)
                    now = time.time()
                    if heard["armed"] and heard["at"] is None:
                        if is_audible(mulaw_decode(base64.b64decode(event["media"]["payload"])), PHONE_RATE):
                            heard["at"] = now

            receiver = asyncio.ensure_future(receive())
            ws = await server_ws
            # The transport's pacing state, as FastAPIWebsocketOutputTransport.setup computes it.
            chunk = int(PHONE_RATE * 0.01) * OUT_CHUNK_10MS * 2
            pacer = types.SimpleNamespace(_next_send_time=0, _send_interval=(chunk / PHONE_RATE) / 2)
            resampler = create_stream_resampler()
            for i in range(trials):
                onset = PIPER_ONSETS_MS[i % len(PIPER_ONSETS_MS)]
                audio = reply_signal(PHONE_RATE, onset).tobytes()
                heard["armed"], heard["at"] = True, None
                await asyncio.sleep(random.uniform(0, 0.02))
                handed = time.time()
                for k in range(0, len(audio), chunk):
                    payload = await pcm_to_ulaw(audio[k:k + chunk], PHONE_RATE, PHONE_RATE, resampler)
                    await ws.send(json.dumps({"event": "media", "streamSid": "MZbench",
                                              "media": {"payload": base64.b64encode(payload).decode()}}))
                    await FastAPIWebsocketOutputTransport._write_audio_sleep(pacer)
                await asyncio.sleep(0.05)
                heard["armed"] = False
                if heard["at"] is not None:
                    results.append({"onset": onset, "heard": (heard["at"] - handed) * 1000})
                await asyncio.sleep(0.3)  # the reply has ended; the next one starts a new run
            receiver.cancel()
            await asyncio.gather(receiver, return_exceptions=True)
    return results


async def phone_idle_cpu_ms_per_s(seconds: float = 2.0) -> float:
    """An idle phone call, both ends: the caller's 50 silent `media` events a second
    (twilio_caller.PhoneLine), parsed and converted to 16 kHz as the serializer does. The
    server sends nothing while the agent is quiet."""
    from websockets.asyncio.client import connect
    from websockets.asyncio.server import serve

    from latency_bench.callers.twilio_caller import SILENCE_FRAME

    resampler = create_stream_resampler()

    async def handler(ws) -> None:
        async for message in ws:
            event = json.loads(message)
            await ulaw_to_pcm(base64.b64decode(event["media"]["payload"]), PHONE_RATE, PIPELINE_IN_RATE, resampler)

    async with serve(handler, "127.0.0.1", 0) as srv:
        port = srv.sockets[0].getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}") as client:
            message = json.dumps({"event": "media", "streamSid": "MZbench",
                                  "media": {"payload": base64.b64encode(SILENCE_FRAME).decode()}})
            cpu0, wall0 = time.process_time(), time.monotonic()
            next_at = wall0
            while time.monotonic() - wall0 < seconds:
                await client.send(message)
                next_at += 0.02
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            return (time.process_time() - cpu0) / (time.monotonic() - wall0) * 1000


async def phone_input_lag(trials: int) -> list[float]:
    """Twilio frames (20 ms mu-law) through ulaw_to_pcm with the serializer's resampler, as
    one running stream: delay from the frame carrying a sound's start to the first audible
    16 kHz output, for sounds starting at successive frames (the resampler emits in bursts)."""
    import audioop

    n = int(PHONE_RATE * 0.02)
    r = create_stream_resampler(clear_after_secs=None)  # frames every 20 ms: its 0.2 s clear never fires
    silence = audioop.lin2ulaw(bytes(2 * n), 2)
    for _ in range(25):
        await ulaw_to_pcm(silence, PHONE_RATE, PIPELINE_IN_RATE, r)
    lags = []
    for i in range(trials):
        for _ in range(i % 4):  # shift the sound's start against the resampler's burst cycle
            await ulaw_to_pcm(silence, PHONE_RATE, PIPELINE_IN_RATE, r)
        x = reply_signal(PHONE_RATE, 0, chunk_ms=20)
        heard = None
        for k in range(len(x) // n):
            frame = audioop.lin2ulaw(x[k * n:(k + 1) * n].tobytes(), 2)
            out = np.frombuffer(await ulaw_to_pcm(frame, PHONE_RATE, PIPELINE_IN_RATE, r), dtype=np.int16)
            if heard is None and len(out) and is_audible(out, PIPELINE_IN_RATE):
                heard = k
        lags.append(heard * 20.0 if heard is not None else float("nan"))
        for _ in range(20):
            await ulaw_to_pcm(silence, PHONE_RATE, PIPELINE_IN_RATE, r)
    return lags


def _med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


@dataclass(frozen=True)
class Variant:
    label: str
    rate: int = WEBRTC_RATE
    caller_prefetch: int = 4
    server_prefetch: int = 4
    inputs: bool = False
    chunk_10ms: int = OUT_CHUNK_10MS
    frame_ms: int = 10


DEPLOYED = Variant("as deployed: 24 kHz track, 10 ms frames, jitter buffers prefetch 4", inputs=True)
VARIANTS = [
    DEPLOYED,
    Variant("48 kHz track (WEBRTC_OUTPUT_SAMPLE_RATE=48000)", rate=48_000),
    Variant("20 ms track frames (RawAudioTrack subclass), 24 kHz", frame_ms=20),
    Variant("10 ms output chunks (audio_out_10ms_chunks=1)", chunk_10ms=1),
    Variant("jitter buffers prefetch 0 (caller and server), 24 kHz", caller_prefetch=0, server_prefetch=0,
            inputs=True),
    Variant("48 kHz + 20 ms frames + prefetch 0", rate=48_000, frame_ms=20, caller_prefetch=0, server_prefetch=0),
]
LOADED = [DEPLOYED, Variant("20 ms track frames, 24 kHz", frame_ms=20),
          Variant("48 kHz + 20 ms track frames", rate=48_000, frame_ms=20)]


def _beyond(rs: list[dict]) -> list[float]:
    return [o["heard"] - o["onset"] for o in rs]


def _split(rs: list[dict]) -> str:
    return (f"track {_med([o['track'] - o['onset'] for o in rs]):.1f}, "
            f"framing+net {_med([o['arrived'] - o['track'] for o in rs]):.1f}, "
            f"receiver {_med([o['heard'] - o['arrived'] for o in rs]):.1f} ms")


def _saving(base: list[dict], other: list[dict]) -> str:
    if not base or not other:
        return "n/a"
    return (f"saves {_med(_beyond(base)) - _med(_beyond(other)):.1f} ms median / "
            f"{statistics.fmean(_beyond(base)) - statistics.fmean(_beyond(other)):.1f} ms mean")


async def _run_variant(v: Variant, trials: int, load: bool = False):
    return await webrtc_variant(v.label, out_rate=v.rate, caller_prefetch=v.caller_prefetch,
                                server_prefetch=v.server_prefetch, trials=trials, inputs=v.inputs and not load,
                                chunk_10ms=v.chunk_10ms, frame_ms=v.frame_ms, load=load)


async def wall_rows(trials: int, gil_load: bool) -> list[Row]:
    rows: list[Row] = []
    print("wall-time trials:", file=sys.stderr)
    phone = await phone_output_trials(trials)
    print(f"  phone: {len(phone)}/{trials} output trials", file=sys.stderr)
    results = {v.label: await _run_variant(v, trials) for v in VARIANTS}

    outs, ins, cpu = results[DEPLOYED.label]
    onset = [o["onset"] for o in outs]
    rows.append(Row("webrtc", "RawAudioTrack queue + 10 ms recv() grid (beyond real time)",
                    [o["track"] - o["onset"] for o in outs],
                    "handed -> recv() returns the first audible 10 ms frame, minus the onset"))
    rows.append(Row("webrtc", "Opus framing + encode + SRTP + UDP (loopback)",
                    [o["arrived"] - o["track"] for o in outs],
                    "recv() -> RTP packet with audible audio arrives at the caller"))
    rows.append(Row("webrtc", "caller: aiortc jitter buffer (prefetch 4) + decoder thread",
                    [o["heard"] - o["arrived"] for o in outs],
                    "packet arrival -> webrtc_caller's listener gets the decoded frame"))
    rows.append(Row("webrtc", "TOTAL handed -> caller marks audible", [o["heard"] for o in outs],
                    f"includes the reply's onset (Piper-like, median {_med(onset):.0f} ms)"))
    rows.append(Row("webrtc", "TOTAL beyond real time (minus onset)", _beyond(outs),
                    "what the WebRTC path adds over playing the reply in real time"))
    rows.append(Row("webrtc", "handed -> audible packet ARRIVES at caller, minus onset",
                    [o["arrived"] - o["onset"] for o in outs],
                    "like-for-like with twilio_caller, which times a packet's arrival (no playout buffer)"))
    rows.append(Row("phone", "TOTAL handed -> caller marks audible", [p["heard"] for p in phone],
                    "FastAPIWebsocketOutputTransport sends chunks 0 and 1 at once, then one per 40 ms"))
    rows.append(Row("phone", "TOTAL beyond real time (minus onset)", _beyond(phone),
                    "negative: the phone path runs one 40 ms chunk ahead of real time; no jitter buffer "
                    "in twilio_caller"))
    rows.append(Row("gap", "webrtc - phone, same reply (handed -> audible)",
                    [o["heard"] - p["heard"] for o, p in zip(outs, phone)],
                    "the figure the bench reports as the WebRTC output gap (idle process)"))
    for v in VARIANTS[1:]:
        v_outs = results[v.label][0]
        rows.append(Row("alt", f"beyond real time, {v.label}", _beyond(v_outs),
                        f"{_saving(outs, v_outs)} vs as deployed; {_split(v_outs)}"))
    rows.append(Row("webrtc", "CPU of an idle connected call (both ends, this process)", [cpu],
                    "ms CPU per s: silence is encoded, encrypted, sent and decoded 50x/s each way", unit="ms/s"))
    rows.append(Row("phone", "CPU of an idle connected call (both ends, this process)",
                    [await phone_idle_cpu_ms_per_s()], "ms CPU per s: 50 silent media events/s in, nothing out",
                    unit="ms/s"))

    if gil_load:
        n = max(5, trials // 2)
        print("wall-time trials with a GIL-busy thread:", file=sys.stderr)
        with GilLoad():
            phone_l = await phone_output_trials(n)
        rows.append(Row("load", "phone beyond real time, GIL-busy thread", _beyond(phone_l),
                        f"idle: {_med(_beyond(phone)):.1f} ms"))
        base_l = None
        for v in LOADED:
            v_outs, _, speed = await _run_variant(v, n, load=True)
            base_l = v_outs if base_l is None else base_l
            rows.append(Row("load", f"webrtc beyond real time, GIL-busy thread, {v.label}", _beyond(v_outs),
                            f"sender keeps {speed:.2f}x real time; {_split(v_outs)}"
                            + ("" if v is DEPLOYED else f"; {_saving(base_l, v_outs)} vs as deployed under load")))

    # Input direction, for the overall TTFS: the caller's speech reaching the pipeline.
    ins3 = results[VARIANTS[4].label][1]
    rows.append(Row("webrtc in", "mic recv() -> RTP arrives at server (Opus framing + net)",
                    [i["arrived"] for i in ins], ""))
    rows.append(Row("webrtc in", "server aiortc jitter buffer (prefetch 4) + decode + swr -> pipeline",
                    [i["read"] - i["arrived"] for i in ins],
                    f"with prefetch 0: {_med([i['read'] - i['arrived'] for i in ins3]):.1f} ms "
                    f"(saves {_med([i['read'] for i in ins]) - _med([i['read'] for i in ins3]):.1f} ms on every "
                    f"end of turn)"))
    lag = await phone_input_lag(trials)
    rows.append(Row("phone in", "20 ms Twilio frame -> audible 16 kHz out of ulaw_to_pcm (VHQ)", lag,
                    "wall delay in whole 20 ms frames, over the resampler's burst phases"))
    return rows


def print_table(rows: list[Row]) -> None:
    cells = [("path", "stage", "hold-back ms: median (mean) [min..max]", "notes")] + [r.cells() for r in rows]
    w = [max(len(c[i]) for c in cells) for i in range(3)]
    for c in cells:
        print(f"{c[0]:<{w[0]}}  {c[1]:<{w[1]}}  {c[2]:>{w[2]}}  {c[3]}")


async def main_async(args) -> list[Row]:
    rows = await resampling_rows(args.trials)
    rows += opus_rows()
    rows += await input_resampling_rows()
    if not args.no_loopback:
        rows += await wall_rows(args.trials, args.gil_load)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m latency_bench webrtc-path", description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=15, help="wall-time trials per variant (median is printed)")
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--no-loopback", action="store_true", help="signal-level stages only (no aiortc pair)")
    parser.add_argument("--gil-load", action="store_true",
                        help="also rerun the path with a GIL-busy thread in the process (burns a core for ~30 s)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    random.seed(args.seed)
    rows = asyncio.run(main_async(args))
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"path": r.path, "stage": r.stage, "unit": r.unit, "values": r.values,
                        "median": statistics.median(r.values) if r.values else None, "notes": r.notes}
                       for r in rows], f, indent=1)
    return 0
