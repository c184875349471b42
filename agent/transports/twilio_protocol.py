"""Twilio Media Streams messages, parsed and validated (no I/O, no pipecat).

Inbound events: connected, start, media, mark, dtmf, stop. Anything else, or anything
malformed, raises a `BadInputError` saying what was wrong; the caller of `parse` decides
whether the call goes on (see `TwilioCallGuard`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass

from agent.errors import BadMediaError, BadSignalingError

# Twilio sends 20 ms (160 bytes of 8 kHz mu-law) per media event. Allow bursts of up to
# 200 ms per event from other providers speaking the protocol; more is not a phone line.
MAX_MEDIA_PAYLOAD_BYTES = 1600
MAX_ID_CHARS = 128  # streamSid / callSid are 34 characters


@dataclass(frozen=True)
class Connected:
    pass


@dataclass(frozen=True)
class Start:
    stream_sid: str
    call_sid: str | None
    custom_parameters: dict[str, str]


@dataclass(frozen=True)
class Media:
    mulaw: bytes  # 8 kHz mu-law


@dataclass(frozen=True)
class Mark:
    name: str


@dataclass(frozen=True)
class Dtmf:
    digit: str


@dataclass(frozen=True)
class Stop:
    pass


TwilioEvent = Connected | Start | Media | Mark | Dtmf | Stop


def parse(message: str | bytes) -> TwilioEvent:
    if isinstance(message, bytes):
        raise BadSignalingError("binary WebSocket messages are not part of the Twilio protocol; send JSON text")
    try:
        data = json.loads(message)
    except (ValueError, RecursionError) as exc:  # ValueError: bad JSON, or an int of over 4,300 digits
        raise BadSignalingError(f"message is not valid JSON: {exc.__class__.__name__}") from None
    if not isinstance(data, dict):
        raise BadSignalingError("message must be a JSON object")
    event = data.get("event")
    if event == "media":
        return Media(_media_payload(data.get("media")))
    if event == "start":
        return _start(data)
    if event == "connected":
        return Connected()
    if event == "mark":
        mark = data.get("mark")
        return Mark(_short_str(mark.get("name") if isinstance(mark, dict) else None, "mark.name"))
    if event == "dtmf":
        dtmf = data.get("dtmf")
        digit = dtmf.get("digit") if isinstance(dtmf, dict) else None
        if not isinstance(digit, str) or len(digit) != 1 or digit not in "0123456789*#ABCD":
            raise BadSignalingError("dtmf.digit must be one of 0-9 * # A-D")
        return Dtmf(digit)
    if event == "stop":
        return Stop()
    raise BadSignalingError(f"unknown event {str(event)[:32]!r}; expected connected, start, media, mark, dtmf or stop")


def _start(data: dict) -> Start:
    start = data.get("start")
    if not isinstance(start, dict):
        raise BadSignalingError("start event needs a 'start' object")
    stream_sid = _short_str(start.get("streamSid") or data.get("streamSid"), "start.streamSid")
    call_sid = start.get("callSid")
    fmt = start.get("mediaFormat")
    if isinstance(fmt, dict):
        encoding, rate = fmt.get("encoding"), fmt.get("sampleRate")
        if encoding not in (None, "audio/x-mulaw") or rate not in (None, 8000):
            raise BadMediaError(f"unsupported mediaFormat {str(encoding)[:32]}@{str(rate)[:8]}; only audio/x-mulaw@8000")
    params = start.get("customParameters")
    custom = {str(k)[:64]: str(v)[:256] for k, v in params.items()} if isinstance(params, dict) else {}
    return Start(stream_sid, _short_str(call_sid, "start.callSid") if call_sid else None, custom)


def _media_payload(media: object) -> bytes:
    payload = media.get("payload") if isinstance(media, dict) else None
    if not isinstance(payload, str) or not payload:
        raise BadMediaError("media event needs a non-empty base64 'media.payload'")
    if len(payload) > (MAX_MEDIA_PAYLOAD_BYTES * 4) // 3 + 4:
        raise BadMediaError(f"media payload over {MAX_MEDIA_PAYLOAD_BYTES} bytes; send 20 ms (160 bytes) per event")
    try:
        audio = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise BadMediaError("media.payload is not valid base64") from None
    if not audio:
        raise BadMediaError("media payload decoded to no audio")
    return audio


def _short_str(value: object, name: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_ID_CHARS:
        raise BadSignalingError(f"{name} must be a non-empty string of at most {MAX_ID_CHARS} characters")
    return value


def request_signature(auth_token: str, url: str, params: dict[str, str] | None = None) -> str:
    """Twilio's `X-Twilio-Signature`: base64 HMAC-SHA1, keyed by the account's auth token, of the
    full URL Twilio requested followed by each POST parameter's name and value, sorted by name.
    A Media Streams WebSocket has no POST parameters: the URL (with its query) is all it signs."""
    signed = url + "".join(f"{name}{value}" for name, value in sorted((params or {}).items()))
    digest = hmac.new(auth_token.encode(), signed.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def signature_valid(auth_token: str, signature: str, urls: tuple[str, ...]) -> bool:
    """True if `signature` signs one of `urls`: the URL Twilio used is not known exactly behind a
    TLS proxy (wss:// outside, ws:// here), so the caller passes each form it could have been.
    Every candidate is compared, in constant time, whichever matches."""
    presented = signature.encode()
    matched = False
    for url in urls:
        matched |= hmac.compare_digest(request_signature(auth_token, url).encode(), presented)
    return matched
