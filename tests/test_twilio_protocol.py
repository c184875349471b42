import base64
import json

import pytest

from agent.errors import BadMediaError, BadSignalingError
from agent.transports import twilio_protocol as proto


def media(payload: str) -> str:
    return json.dumps({"event": "media", "streamSid": "MZ1", "media": {"payload": payload}})


def test_full_handshake_and_media():
    assert proto.parse(json.dumps({"event": "connected", "protocol": "Call"})) == proto.Connected()
    start = proto.parse(json.dumps({"event": "start", "start": {
        "streamSid": "MZ1", "callSid": "CA1", "customParameters": {"agent": "x"},
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}}))
    assert start == proto.Start("MZ1", "CA1", {"agent": "x"})
    assert proto.parse(media(base64.b64encode(b"\xff" * 160).decode())) == proto.Media(b"\xff" * 160)
    assert proto.parse(json.dumps({"event": "mark", "mark": {"name": "m1"}})) == proto.Mark("m1")
    assert proto.parse(json.dumps({"event": "dtmf", "dtmf": {"digit": "5"}})) == proto.Dtmf("5")
    assert proto.parse(json.dumps({"event": "stop"})) == proto.Stop()


@pytest.mark.parametrize("message, error, text", [
    ("not json", BadSignalingError, "not valid JSON"),
    ("[1,2,3]", BadSignalingError, "JSON object"),
    ('"media"', BadSignalingError, "JSON object"),
    ('{"event": "launch"}', BadSignalingError, "unknown event"),
    ('{"no_event": 1}', BadSignalingError, "unknown event"),
    (b"\x00\x01binary", BadSignalingError, "binary"),
    ('{"event": "media"}', BadMediaError, "non-empty base64"),
    ('{"event": "media", "media": "x"}', BadMediaError, "non-empty base64"),
    ('{"event": "media", "media": {"payload": 5}}', BadMediaError, "non-empty base64"),
    ('{"event": "media", "media": {"payload": "!!!not-base64!!!"}}', BadMediaError, "not valid base64"),
    ('{"event": "start"}', BadSignalingError, "'start' object"),
    ('{"event": "start", "start": {}}', BadSignalingError, "streamSid"),
    ('{"event": "start", "start": {"streamSid": "MZ", "mediaFormat": {"encoding": "audio/l16", "sampleRate": 16000}}}',
     BadMediaError, "unsupported mediaFormat"),
    ('{"event": "dtmf", "dtmf": {"digit": "55"}}', BadSignalingError, "dtmf.digit"),
    ('{"event": "mark", "mark": {}}', BadSignalingError, "mark.name"),
    ("[" * 100_000, BadSignalingError, "not valid JSON"),
])
def test_bad_messages_raise_clear_errors(message, error, text):
    with pytest.raises(error, match=None) as info:
        proto.parse(message)
    assert text in str(info.value)


def test_oversized_media_payload_is_refused():
    with pytest.raises(BadMediaError, match="over 1600 bytes"):
        proto.parse(media(base64.b64encode(bytes(proto.MAX_MEDIA_PAYLOAD_BYTES + 300)).decode()))


def test_largest_allowed_payload_passes():
    event = proto.parse(media(base64.b64encode(bytes(proto.MAX_MEDIA_PAYLOAD_BYTES)).decode()))
    assert isinstance(event, proto.Media) and len(event.mulaw) == proto.MAX_MEDIA_PAYLOAD_BYTES


def test_overlong_stream_sid_is_refused():
    with pytest.raises(BadSignalingError, match="at most"):
        proto.parse(json.dumps({"event": "start", "start": {"streamSid": "x" * 500}}))


# --- X-Twilio-Signature -------------------------------------------------------------------------

def test_the_signature_is_hmac_sha1_of_the_url_then_the_sorted_parameters():
    import hashlib
    import hmac

    signed = "https://voice.example.com/ws/twilio?x=1" + "CallSidCA1" + "Digits12"
    expected = base64.b64encode(hmac.new(b"tok", signed.encode(), hashlib.sha1).digest()).decode()
    assert proto.request_signature("tok", "https://voice.example.com/ws/twilio?x=1",
                                   {"Digits": "12", "CallSid": "CA1"}) == expected


def test_a_signature_matches_any_of_the_urls_it_may_have_signed_and_nothing_else():
    urls = ("wss://voice.example.com/ws/twilio", "ws://voice.example.com/ws/twilio")
    signature = proto.request_signature("tok", urls[0])
    assert proto.signature_valid("tok", signature, urls)
    assert proto.signature_valid("tok", signature, urls[::-1])
    assert not proto.signature_valid("other", signature, urls)
    assert not proto.signature_valid("tok", signature, ("wss://voice.example.com/ws/twilio?agent=x",))
    assert not proto.signature_valid("tok", "", urls)
    assert not proto.signature_valid("tok", signature, ())
