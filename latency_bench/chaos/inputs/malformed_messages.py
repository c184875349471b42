"""Malformed WebSocket messages for the Twilio and OpenAI Realtime protocols (pure, seeded).

Each `Fault` is one message a broken or hostile client could send, made by mutating a valid
event of the protocol. Two levels, because the server answers them in different places:

    message  a well-formed WebSocket message whose content is wrong: bad JSON, a JSON
             non-object, a value of the wrong type, an unknown event, bad base64 audio,
             numbers too big to parse or to hold, a binary message. The application answers.
    frame    a frame the WebSocket layer itself must refuse: a reserved opcode, RSV bits with no
             extension, a text frame of invalid UTF-8, a fragmented or oversized control frame,
             a continuation of nothing, a close frame with a bad code. `data` is the raw frame,
             masked as a client's must be, to be written below the client library.
"""

from __future__ import annotations

import base64
import json
import os
import random
import struct
from dataclasses import dataclass
from typing import Literal

Protocol = Literal["twilio", "realtime"]

MESSAGE_KINDS = ("bad_json", "not_object", "wrong_type", "unknown_event", "bad_base64", "huge_number", "binary")
FRAME_KINDS = ("reserved_opcode", "rsv_bits", "invalid_utf8", "fragmented_control", "long_control",
               "orphan_continuation", "bad_close_code")

OPCODE_CONTINUATION, OPCODE_TEXT, OPCODE_BINARY, OPCODE_CLOSE, OPCODE_PING = 0x0, 0x1, 0x2, 0x8, 0x9
RESERVED_OPCODES = (0x3, 0x4, 0x5, 0x6, 0x7, 0xB, 0xC, 0xD, 0xE, 0xF)


@dataclass(frozen=True)
class Fault:
    kind: str
    level: Literal["message", "frame"]
    data: str | bytes  # message level: what ws.send() takes; frame level: raw bytes for the socket


def _audio_b64(rng: random.Random, n: int = 160) -> str:
    return base64.b64encode(rng.randbytes(n)).decode()


def valid_events(protocol: Protocol, rng: random.Random) -> list[tuple[dict, list[tuple]]]:
    """Valid client events, the material mutations start from, each with the paths of the values
    the protocol requires (a wrong type at an optional or ignored field is no fault)."""
    if protocol == "twilio":
        return [
            ({"event": "media", "streamSid": "MZfuzz",
              "media": {"track": "inbound", "chunk": "2", "timestamp": "40", "payload": _audio_b64(rng)}},
             [("event",), ("media",), ("media", "payload")]),
            ({"event": "mark", "streamSid": "MZfuzz", "mark": {"name": "reply-1"}},
             [("event",), ("mark",), ("mark", "name")]),
            ({"event": "dtmf", "streamSid": "MZfuzz", "dtmf": {"track": "inbound_track", "digit": "5"}},
             [("event",), ("dtmf",), ("dtmf", "digit")]),
            ({"event": "start", "start": {"streamSid": "MZfuzz", "callSid": "CAfuzz", "customParameters": {},
                                          "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000,
                                                          "channels": 1}}},
             [("event",), ("start",), ("start", "streamSid"), ("start", "mediaFormat", "encoding"),
              ("start", "mediaFormat", "sampleRate")]),
        ]
    return [
        ({"type": "input_audio_buffer.append", "event_id": "e1", "audio": _audio_b64(rng, 960)},
         [("type",), ("audio",)]),
        ({"type": "session.update", "session": {"instructions": "Be brief.", "voice": "alloy",
                                                "input_audio_format": "pcm16",
                                                "turn_detection": {"type": "server_vad", "silence_duration_ms": 500}}},
         [("type",), ("session",), ("session", "instructions"), ("session", "voice"),
          ("session", "input_audio_format"), ("session", "turn_detection", "type"),
          ("session", "turn_detection", "silence_duration_ms")]),
        ({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "What are your hours?"}]}},
         [("type",), ("item",), ("item", "role"), ("item", "content"), ("item", "content", 0, "text")]),
        ({"type": "conversation.item.truncate", "item_id": "item_1", "content_index": 0, "audio_end_ms": 100},
         [("type",), ("item_id",), ("content_index",), ("audio_end_ms",)]),
        ({"type": "conversation.item.delete", "item_id": "item_1"}, [("type",), ("item_id",)]),
        ({"type": "input_audio_buffer.commit"}, [("type",)]),
        ({"type": "response.cancel"}, [("type",)]),
    ]


def _replace(value, path: tuple, new):
    if not path:
        return new
    head, rest = path[0], path[1:]
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[head] = _replace(value[head], rest, new)
    return copy


def _wrong_type(rng: random.Random, current) -> object:
    choices = [None, True, 0, -1, 3.5, "", "x" * rng.randint(1, 200), [], [1, "a"], {}, {"k": {"k": []}}]
    return rng.choice([c for c in choices if type(c) is not type(current)])


def _event_key(protocol: Protocol) -> str:
    return "event" if protocol == "twilio" else "type"


def _message(kind: str, protocol: Protocol, rng: random.Random) -> str | bytes:
    event, checked = rng.choice(valid_events(protocol, rng))
    text = json.dumps(event)
    if kind == "bad_json":
        return rng.choice([
            text[:rng.randint(0, len(text) - 1)],  # truncated
            text[:-1] + "," + text[-1],  # trailing comma
            text.replace('"', "'"),  # single quotes
            text + rng.choice(["}", "]", "garbage", "\x00"]),
            "[" * rng.randint(2_000, 12_000),  # nesting past the parser's recursion limit
            "",
            "{\"" + "\\u" + "zzzz\": 1}",  # a bad escape
        ])
    if kind == "not_object":
        return rng.choice(["[]", "[" + text + "]", "null", "42", "\"media\"", "true", "1e999"])
    if kind == "wrong_type":
        path = rng.choice(checked)
        return json.dumps(_replace(event, path, _wrong_type(rng, _get(event, path))))
    if kind == "unknown_event":
        name = rng.choice(["teleport", "", "MEDIA", "media ", "session.delete", "response.create.extra",
                           "x" * 10_000, "\u202emedia", "transcript"])
        replaced = dict(event)
        if rng.random() < 0.2:
            replaced.pop(_event_key(protocol))
        else:
            replaced[_event_key(protocol)] = name
        return json.dumps(replaced)
    if kind == "bad_base64":
        bad = rng.choice(["@@@@", "Y", "not base64 at all!", "\u00e9\u00e9\u00e9\u00e9", "====",
                          _audio_b64(rng)[:-3] + "*"])
        if protocol == "twilio":
            return json.dumps({"event": "media", "media": {"payload": bad}})
        return json.dumps({"type": "input_audio_buffer.append", "audio": bad})
    if kind == "huge_number":
        huge = rng.choice(["1" * rng.randint(4_400, 9_000), "1e400", "-1e400", str(2**64), str(-2**63 - 1),
                           "NaN", "Infinity", "-Infinity", "1" + "0" * 400 + ".5"])
        path = rng.choice(checked)
        marker = "\"__HUGE__\""
        return json.dumps(_replace(event, path, "__HUGE__")).replace(marker, huge)
    if kind == "binary":
        # Twilio's protocol is text only; a Realtime server may take JSON in a binary message.
        json_bytes = [text.encode()] if protocol == "twilio" else []
        return rng.choice([*json_bytes, b"\xff" + rng.randbytes(rng.randint(0, 2000)), b""])
    raise ValueError(f"unknown message fault {kind!r}")


def _get(value, path: tuple):
    for key in path:
        value = value[key]
    return value


def client_frame(opcode: int, payload: bytes, *, fin: bool = True, rsv: int = 0) -> bytes:
    """One masked client frame (RFC 6455 section 5.2), any opcode, any bits."""
    first = (0x80 if fin else 0) | (rsv & 0x7) << 4 | (opcode & 0xF)
    length = len(payload)
    if length < 126:
        header = struct.pack("!BB", first, 0x80 | length)
    elif length < 2**16:
        header = struct.pack("!BBH", first, 0x80 | 126, length)
    else:
        header = struct.pack("!BBQ", first, 0x80 | 127, length)
    mask = os.urandom(4)
    return header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def _frame(kind: str, protocol: Protocol, rng: random.Random) -> bytes:
    text = json.dumps(rng.choice(valid_events(protocol, rng))[0]).encode()
    if kind == "reserved_opcode":
        return client_frame(rng.choice(RESERVED_OPCODES), text)
    if kind == "rsv_bits":
        return client_frame(OPCODE_TEXT, text, rsv=rng.randint(1, 7))
    if kind == "invalid_utf8":
        cut = rng.randint(0, len(text))
        return client_frame(OPCODE_TEXT, text[:cut] + rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80",
                                                                  b"\xf8\x88\x80\x80\x80"]) + text[cut:])
    if kind == "fragmented_control":
        return client_frame(rng.choice([OPCODE_PING, OPCODE_CLOSE]), b"", fin=False)
    if kind == "long_control":
        return client_frame(OPCODE_PING, rng.randbytes(rng.randint(126, 1000)))
    if kind == "orphan_continuation":
        return client_frame(OPCODE_CONTINUATION, text)
    if kind == "bad_close_code":
        code = rng.choice([0, 999, 1004, 1005, 1006, 1015, 2999, 5000, 65535])
        return client_frame(OPCODE_CLOSE, struct.pack("!H", code) + b"bye")
    raise ValueError(f"unknown frame fault {kind!r}")


def faults(protocol: Protocol, count: int, *, seed: int, frame_share: float = 0.1) -> list[Fault]:
    """`count` faults for `protocol`: about `frame_share` of them frame level, the rest spread
    evenly over the message-level kinds. The same seed gives the same faults (frame masks aside)."""
    rng = random.Random(f"{protocol}:{seed}")
    out = []
    for n in range(count):
        if rng.random() < frame_share:
            kind = FRAME_KINDS[n % len(FRAME_KINDS)]
            out.append(Fault(kind, "frame", _frame(kind, protocol, rng)))
        else:
            kind = MESSAGE_KINDS[n % len(MESSAGE_KINDS)]
            out.append(Fault(kind, "message", _message(kind, protocol, rng)))
    return out
