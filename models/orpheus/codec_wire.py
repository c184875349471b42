"""The SNAC codec worker's wire format: one WebSocket per audio stream.

A stream's decoder state lives in the worker, so a stream is a connection: it opens with
the connection and is released when the connection closes, however it closes (the end of
the utterance, a barge-in, a dead agent server). Messages on it alternate: one request,
then its one answer; a stream's steps must run in order anyway.

Request (binary, little-endian): a 13-byte header, then the codes.
    kind         u8   WINDOW | STEP | FINAL | FLUSH (below)
    first_frame  u32  WINDOW: the stream frame the window starts at (positions the noise)
    skip_to      u32  the first sample the stream still wants (a head start covered the rest)
    frames       u32  n, the frames that follow
    codes        n x 7 x u16, frame-major: each frame's 7 SNAC codes in Orpheus' order
Answer: binary, the audio as float32 little-endian at 24 kHz (possibly empty); or text,
JSON {"error": ..., "retryable": bool} for a request that was refused. A refused request
leaves the stream where it was; a full worker refuses the stream itself, then closes it
with code 1013 (try again later).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

import numpy as np

from models.orpheus.tokens import CODEBOOK_SIZE, FRAME_TOKENS

PATH = "/v1/codec/stream"
WINDOW, STEP, FINAL, FLUSH = 0, 1, 2, 3
KINDS = {WINDOW: "window", STEP: "step", FINAL: "final", FLUSH: "flush"}
TRY_AGAIN_LATER = 1013  # WebSocket close code: the worker is full or not ready
_HEADER = struct.Struct("<BIII")


class CodecWireError(ValueError):
    """A request that does not follow the format; the message says what is wrong."""


@dataclass(frozen=True)
class CodecRequest:
    kind: int
    frames: np.ndarray | None  # (n, 7) int64; None for a flush
    first_frame: int = 0
    skip_to: int = 0


def encode_request(request: CodecRequest) -> bytes:
    frames = np.zeros((0, FRAME_TOKENS), np.int64) if request.frames is None else np.asarray(request.frames)
    header = _HEADER.pack(request.kind, request.first_frame, request.skip_to, len(frames))
    return header + frames.astype("<u2").tobytes()


def decode_request(message: bytes, *, max_frames: int) -> CodecRequest:
    if len(message) < _HEADER.size:
        raise CodecWireError(f"a request needs a {_HEADER.size}-byte header; got {len(message)} bytes")
    kind, first_frame, skip_to, count = _HEADER.unpack_from(message)
    if kind not in KINDS:
        raise CodecWireError(f"request kind {kind} is unknown; known: {KINDS}")
    if count > max_frames:
        raise CodecWireError(f"{count} frames in one request; at most {max_frames}")
    body = message[_HEADER.size:]
    if len(body) != count * FRAME_TOKENS * 2:
        raise CodecWireError(f"{count} frames need {count * FRAME_TOKENS * 2} bytes of codes; got {len(body)}")
    if kind == FLUSH:
        if count:
            raise CodecWireError("a flush carries no frames")
        return CodecRequest(kind, None, first_frame, skip_to)
    if count == 0:
        raise CodecWireError(f"a {KINDS[kind]} needs at least one frame")
    frames = np.frombuffer(body, dtype="<u2").reshape(count, FRAME_TOKENS).astype(np.int64)
    if frames.max() >= CODEBOOK_SIZE:
        raise CodecWireError(f"a SNAC code is at most {CODEBOOK_SIZE - 1}; got {int(frames.max())}")
    return CodecRequest(kind, frames, first_frame, skip_to)


def encode_audio(audio: np.ndarray) -> bytes:
    return np.ascontiguousarray(audio, dtype="<f4").tobytes()


def decode_audio(message: bytes) -> np.ndarray:
    if len(message) % 4:
        raise CodecWireError(f"audio must be whole float32 samples; got {len(message)} bytes")
    return np.frombuffer(message, dtype="<f4").astype(np.float32)


def encode_refusal(error: str, *, retryable: bool) -> str:
    return json.dumps({"error": error, "retryable": retryable})
