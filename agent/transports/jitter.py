"""The caller's audio jitter buffer: each packet goes on as it arrives.

aiortc's buffer hands on an audio frame only when the packet after it is in, and waits for a
missing packet until `capacity` later ones have come; then it drops to make room and hands the
backlog on one frame per packet received (its receiver takes one frame per packet), so it never
catches up. One lost packet made every later frame of the call `capacity` x 20 ms late (16:
320 ms on every end of speech, so on every TTFS), and each later loss dropped a frame more than
the network had: at 10 % loss 75 % of the caller's audio reached the ASR (`latency_bench chaos
lossy`). With one frame out per packet in, any wait for a missing packet becomes lasting delay.

So here a packet goes on at once if it is the newest yet (an Opus packet is a whole frame,
RFC 7587): a lost one costs its own 20 ms and nothing after it; one that comes after a later
one is dropped, as a duplicate is. Speech recognition shrugs at a 20 ms hole and not at delay;
a packet reordered on a real path is rarer than one lost. A jump back of more than
`MAX_MISORDER` packets is a sender that restarted its numbering, and taken as the new start.
"""

from __future__ import annotations

from aiortc.jitterbuffer import MAX_MISORDER, JitterBuffer, JitterFrame
from aiortc.rtp import RtpPacket
from aiortc.utils import uint16_add


class ImmediateAudioJitterBuffer(JitterBuffer):
    def __init__(self) -> None:
        super().__init__(capacity=1, prefetch=0)
        self._next: int | None = None  # the sequence number after the newest packet handed on

    def add(self, packet: RtpPacket) -> tuple[bool, JitterFrame | None]:
        if self._next is not None:
            behind = uint16_add(self._next, -packet.sequence_number)
            if 0 < behind <= MAX_MISORDER:  # late, or a duplicate
                return False, None
        self._next = uint16_add(packet.sequence_number, 1)
        # `_data`: the payload as the receiver depacketized it (what aiortc's buffer joins too).
        data = packet._data  # type: ignore[attr-defined]
        if not data:
            # A padding-only packet (Chromium sends them): an empty packet to the decoder is
            # its end-of-stream, after which it decodes nothing more, so the call went deaf.
            # aiortc's buffer joins it into the frame of the same timestamp, harmlessly.
            return False, None
        return False, JitterFrame(data=data, timestamp=packet.timestamp)
