"""The caller's jitter buffer hands each packet on as it arrives (agent/transports/jitter.py)."""

from __future__ import annotations

from aiortc.jitterbuffer import JitterBuffer
from aiortc.rtp import RtpPacket

from agent.transports.jitter import ImmediateAudioJitterBuffer

SAMPLES_PER_PACKET = 960  # 20 ms of Opus at 48 kHz


def packet(sequence: int) -> RtpPacket:
    rtp = RtpPacket(payload_type=111, sequence_number=sequence % 65536,
                    timestamp=(sequence * SAMPLES_PER_PACKET) % 2**32, payload=sequence.to_bytes(4, "big"))
    rtp._data = rtp.payload  # the receiver's depacketized payload, which the buffers hand on
    return rtp


def released(buffer: JitterBuffer, sequences: list[int]) -> list[int | None]:
    """What each arriving packet releases: the sequence number of the frame (from its payload), or None."""
    out = []
    for sequence in sequences:
        _, frame = buffer.add(packet(sequence))
        out.append(None if frame is None else int.from_bytes(frame.data, "big"))
    return out


def test_each_packet_is_handed_on_as_it_arrives():
    assert released(ImmediateAudioJitterBuffer(), [0, 1, 2, 3]) == [0, 1, 2, 3]


def test_a_lost_packet_costs_its_own_frame_and_no_lasting_delay():
    assert released(ImmediateAudioJitterBuffer(), [0, 1, 2, 4, 5, 6]) == [0, 1, 2, 4, 5, 6]


def test_aiortc_own_buffer_stalls_on_a_loss_and_never_catches_up():
    """Why this buffer exists: the same kind of loss stalls aiortc's buffer (as Cadence had it:
    capacity 16, no prefetch) until 16 later packets are in; then it releases one old frame per
    packet received, ~15 packets (300 ms) behind for the rest of the call."""
    arrivals = [0, 1, 2, *range(4, 40)]
    out = released(JitterBuffer(capacity=16, prefetch=0), arrivals)
    assert out[3:17] == [None] * 14
    assert arrivals[-1] - out[-1] >= 14
    assert released(ImmediateAudioJitterBuffer(), arrivals)[-1] == arrivals[-1]


def test_a_late_packet_and_a_duplicate_are_dropped():
    assert released(ImmediateAudioJitterBuffer(), [0, 1, 3, 2, 4, 4, 5]) == [0, 1, 3, None, 4, None, 5]


def test_a_padding_only_packet_is_not_handed_to_the_decoder():
    """An empty packet is the decoder's end of stream: after one, it decoded nothing more (a
    browser call went deaf, 2 calls in 7)."""
    buffer = ImmediateAudioJitterBuffer()
    padding = packet(1)
    padding._data = b""
    assert [buffer.add(p)[1] is not None for p in (packet(0), padding, packet(2))] == [True, False, True]


def test_sequence_numbers_wrap_around():
    assert released(ImmediateAudioJitterBuffer(), [65534, 65535, 65536, 65537]) == [65534, 65535, 65536, 65537]


def test_a_long_outage_and_a_restarted_sender_are_taken_as_a_new_start():
    assert released(ImmediateAudioJitterBuffer(), [0, 1, 2, 300, 301]) == [0, 1, 2, 300, 301]
    assert released(ImmediateAudioJitterBuffer(), [5000, 5001, 10, 11]) == [5000, 5001, 10, 11]
