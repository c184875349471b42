"""The Realtime protocol core, driven without sockets.

Client events are made by the official `openai` SDK's own resources and serialisation, so the
parser is tested on what real clients send. Every server event any test produces goes through
the SDK's pydantic types in strict mode, with no field the types do not declare: the SDK itself
reads events with construct() (no validation), and its models allow extra fields, so plain
validation would pass misspelt or misshapen events.
"""

from __future__ import annotations

import json
import random
from collections import Counter

import pydantic
import pytest
from openai.resources.realtime.realtime import (
    RealtimeConnection, RealtimeConversationItemResource, RealtimeInputAudioBufferResource,
    RealtimeResponseResource, RealtimeSessionResource)
from openai.types.realtime import RealtimeServerEvent
from openai.types.realtime import SessionUpdateEvent as SdkSessionUpdateEvent
from openai.types.realtime.realtime_session_create_response import RealtimeSessionCreateResponse
from pipecat.services.openai.realtime import events as rt

from agent.errors import BadInputError
from agent.transports import realtime_conversation as conv_module
from agent.transports import realtime_protocol as proto
from agent.transports.realtime_conversation import RealtimeConversation, random_id
from agent.transports.realtime_protocol import RealtimeProtocolError, SessionSettings

SERVER_EVENT = pydantic.TypeAdapter(RealtimeServerEvent)
# The GA server sends the session's id and object; only the SDK's response model declares them.
SESSION_EVENT_EXTRAS = ["session.id", "session.object"]


def undeclared_fields(model: pydantic.BaseModel, path: str = "") -> list[str]:
    found = [path + key for key in (model.__pydantic_extra__ or {})]
    for name in type(model).model_fields:
        value = getattr(model, name)
        for child in value if isinstance(value, list) else [value]:
            if isinstance(child, pydantic.BaseModel):
                found += undeclared_fields(child, f"{path}{name}.")
    return found


def check_session(session: dict) -> None:
    model = RealtimeSessionCreateResponse.model_validate(session, strict=True)
    assert undeclared_fields(model) == []
    assert model.model_dump(mode="json", exclude_unset=True) == session


def check_server_event(event: dict) -> None:
    assert json.loads(json.dumps(event)) == event  # JSON-ready, nothing lost on the way
    model = SERVER_EVENT.validate_python(event, strict=True)
    assert model.type == event["type"]
    allowed = SESSION_EVENT_EXTRAS if event["type"].startswith("session.") else []
    assert sorted(undeclared_fields(model)) == allowed, event["type"]
    assert model.model_dump(mode="json", exclude_unset=True) == event  # nothing coerced
    if "session" in event:
        check_session(event["session"])


class FakeIds:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def __call__(self, prefix: str) -> str:
        self.counts[prefix] += 1
        return f"{prefix}_{self.counts[prefix]}"


class CheckedConversation(RealtimeConversation):
    """The real conversation, validating every event it makes against the SDK's types."""

    def event(self, event_type: str, **fields: object) -> dict:
        made = super().event(event_type, **fields)
        check_server_event(made)
        return made


def conversation(settings: SessionSettings = SessionSettings(), **kwargs) -> CheckedConversation:
    return CheckedConversation(settings, new_id=FakeIds(), **kwargs)


class SdkWire:
    """Stands in for the socket under the SDK's RealtimeConnection: its resources call send(),
    which serialises exactly as the SDK does, and the text lands here."""

    send = RealtimeConnection.send

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.session = RealtimeSessionResource(self)
        self.input_audio_buffer = RealtimeInputAudioBufferResource(self)
        self.item = RealtimeConversationItemResource(self)
        self.response = RealtimeResponseResource(self)

    def _send(self, data: str | bytes) -> None:  # what WebSocketConnectionBase.send_raw calls
        self.sent.append(data)

    def last(self) -> str:
        return self.sent[-1]


def refusal(data, code: str, param: str | None = None) -> RealtimeProtocolError:
    with pytest.raises(RealtimeProtocolError) as info:
        proto.parse_client_event(data if isinstance(data, (str, bytes)) else json.dumps(data))
    assert info.value.code == code, str(info.value)
    if param is not None:
        assert info.value.param == param, str(info.value)
    return info.value


def update(session: dict, settings: SessionSettings = SessionSettings(),
           event_id: str | None = "ev1") -> SessionSettings:
    raw = {"type": "session.update", "session": {"type": "realtime", **session}}
    if event_id:
        raw["event_id"] = event_id
    return proto.apply_session_update(settings, proto.parse_client_event(json.dumps(raw)))


# The SDK's types really reject wrong shapes (so the checks above mean something)

SPEECH_STARTED = {"type": "input_audio_buffer.speech_started", "event_id": "e", "audio_start_ms": 0, "item_id": "i"}
USER_ITEM = {"id": "i", "object": "realtime.item", "type": "message", "status": "completed", "role": "user",
             "content": [{"type": "input_text", "text": "hi"}]}


def test_the_server_event_check_passes_a_good_event():
    check_server_event(SPEECH_STARTED)
    check_server_event({"type": "conversation.item.added", "event_id": "e", "previous_item_id": None,
                        "item": USER_ITEM})


@pytest.mark.parametrize("broken", [
    {k: v for k, v in SPEECH_STARTED.items() if k != "item_id"},  # a required field missing
    {**SPEECH_STARTED, "type": "input_audio_buffer.speech_begun"},  # no such event
    {**SPEECH_STARTED, "audio_start_ms": "0"},  # a number as a string: lax pydantic would coerce it
    {**SPEECH_STARTED, "item_idd": "x"},  # a misspelt extra field: the SDK's models allow extras
    {"type": "conversation.item.added", "event_id": "e",  # a user message with assistant content
     "item": {**USER_ITEM, "content": [{"type": "output_text", "text": "hi"}]}},
    {"type": "response.content_part.added", "event_id": "e", "response_id": "r", "item_id": "i",
     "output_index": 0, "content_index": 0, "part": {"type": "output_audio", "transcript": ""}},  # item type, not part
])
def test_the_server_event_check_rejects_broken_events(broken):
    with pytest.raises((pydantic.ValidationError, AssertionError)):
        check_server_event(broken)


def test_the_session_check_rejects_a_wrong_session():
    session = proto.session_object(SessionSettings(), session_id="sess_1", model="m")
    for broken in ({**session, "type": "realtime2"}, {**session, "voices": "x"},
                   {**session, "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}):
        with pytest.raises((pydantic.ValidationError, AssertionError)):
            check_session(broken)


# Parsing what the official SDK sends

GA_SESSION = {
    "type": "realtime",
    "instructions": "Be brief.",
    "output_modalities": ["audio"],
    "audio": {
        "input": {"format": {"type": "audio/pcm", "rate": 24000},
                  "transcription": {"model": "gpt-4o-transcribe", "language": "en"},
                  "noise_reduction": {"type": "near_field"},
                  "turn_detection": {"type": "server_vad", "threshold": 0.6, "silence_duration_ms": 400,
                                     "create_response": True, "interrupt_response": True, "idle_timeout_ms": 6000}},
        "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "marin", "speed": 1.1},
    },
    "tools": [], "tool_choice": "auto", "max_output_tokens": 4096, "tracing": "auto", "truncation": "auto",
    "include": ["item.input_audio_transcription.logprobs"], "prompt": {"id": "pmpt_1"},
}


def test_sdk_session_update_with_every_common_field_parses_and_applies():
    wire = SdkWire()
    wire.session.update(session=GA_SESSION, event_id="ev_1")
    event = proto.parse_client_event(wire.last())
    assert isinstance(event, rt.SessionUpdateEvent) and proto.client_event_id(event) == "ev_1"
    assert proto.apply_session_update(SessionSettings(), event) == SessionSettings(instructions="Be brief.")


def test_sdk_shapes_that_pipecat_alone_would_refuse_are_accepted():
    # A custom voice by id, and noise reduction without a type: valid for the SDK, not for
    # pipecat's models; we ignore both anyway.
    wire = SdkWire()
    wire.session.update(session={"type": "realtime", "audio": {
        "input": {"noise_reduction": {"strength": 0.5}}, "output": {"voice": {"id": "voice_1234"}}}})
    assert proto.apply_session_update(SessionSettings(), proto.parse_client_event(wire.last())) == SessionSettings()
    wire.response.create(response={"audio": {"output": {"voice": {"id": "voice_1234"}}}})
    assert isinstance(proto.parse_client_event(wire.last()), rt.ResponseCreateEvent)


def test_sdk_session_update_sent_as_a_model_parses():
    wire = SdkWire()
    wire.send(SdkSessionUpdateEvent.model_validate(
        {"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}}}))
    assert update_from(wire.last()).server_vad is False


def update_from(data: str) -> SessionSettings:
    return proto.apply_session_update(SessionSettings(), proto.parse_client_event(data))


def test_every_other_sdk_client_event_parses_to_its_pipecat_model():
    wire = SdkWire()
    wire.input_audio_buffer.append(audio="AAAA", event_id="a")
    wire.input_audio_buffer.commit()
    wire.input_audio_buffer.clear()
    wire.item.create(item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                     previous_item_id="root")
    wire.item.truncate(item_id="item_1", content_index=0, audio_end_ms=1500)
    wire.item.delete(item_id="item_1")
    wire.item.retrieve(item_id="item_1")
    wire.response.create(response={"instructions": "Say hi.", "output_modalities": ["text"]})
    wire.response.cancel(response_id="resp_1")
    parsed = [proto.parse_client_event(data) for data in wire.sent]
    assert [type(e) for e in parsed] == [
        rt.InputAudioBufferAppendEvent, rt.InputAudioBufferCommitEvent, rt.InputAudioBufferClearEvent,
        rt.ConversationItemCreateEvent, rt.ConversationItemTruncateEvent, rt.ConversationItemDeleteEvent,
        rt.ConversationItemRetrieveEvent, rt.ResponseCreateEvent, rt.ResponseCancelEvent]
    assert parsed[0].audio == "AAAA" and proto.client_event_id(parsed[0]) == "a"
    assert proto.client_event_id(parsed[1]) is None  # pipecat invented one; it is not the client's
    assert parsed[3].previous_item_id == "root" and parsed[4].audio_end_ms == 1500
    assert proto.response_modality(parsed[7], SessionSettings()) == "text"


def test_response_modality_is_the_sessions_unless_the_response_sets_it():
    plain = proto.parse_client_event('{"type": "response.create", "response": {"instructions": "x"}}')
    bare = proto.parse_client_event('{"type": "response.create"}')
    text_session = SessionSettings(output_modalities=("text",))
    # pipecat defaults ResponseProperties.output_modalities to ["audio"]: not the client's choice
    assert proto.response_modality(plain, text_session) == "text"
    assert proto.response_modality(bare, text_session) == "text"
    assert proto.response_modality(bare, SessionSettings()) == "audio"


def test_bytes_messages_parse_too():
    assert isinstance(proto.parse_client_event(b'{"type": "response.cancel"}'), rt.ResponseCancelEvent)


@pytest.mark.parametrize("data, code, param, text", [
    ("not json", "invalid_json", None, "not valid JSON"),
    (b"\xff\xfe\x00garbage", "invalid_json", None, "not valid JSON"),
    ("[" * 100_000, "invalid_json", None, "not valid JSON"),
    ('"session.update"', "invalid_json", None, "JSON object"),
    ("[1, 2]", "invalid_json", None, "JSON object"),
    ('{"event_id": "e"}', "invalid_event", "type", "'type'"),
    ('{"type": 5}', "invalid_event", "type", "'type'"),
    ('{"type": "session.create"}', "unknown_event", "type", "'session.create' is not a client event"),
    ('{"type": "output_audio_buffer.clear"}', "unsupported", "type", "WebRTC and SIP"),
    ('{"type": "input_audio_buffer.append"}', "invalid_event", "audio", "audio: Field required"),
    ('{"type": "input_audio_buffer.append", "audio": 5}', "invalid_event", "audio", "valid string"),
    ('{"type": "conversation.item.truncate", "item_id": "i", "content_index": 0}',
     "invalid_event", "audio_end_ms", "Field required"),
    ('{"type": "conversation.item.delete", "item_id": "i", "event_id": 7}', "invalid_event", "event_id", "string"),
    ('{"type": "session.update"}', "invalid_event", "session", "Field required"),
    ('{"type": "session.update", "session": {"output_modalities": ["video"]}}',
     "invalid_event", "session.output_modalities.0", "'text' or 'audio'"),
    ('{"type": "session.update", "session": {"audio": {"input": {"turn_detection": {"type": "bogus"}}}}}',
     "invalid_event", "session.audio.input.turn_detection", "none of its accepted forms"),
    ('{"type": "conversation.item.create", "item": {"type": "mcp_call"}}', "invalid_event", "item.type", "'message'"),
    ('{"type": "session.update", "session": {"type": "transcription"}}',
     "unsupported", "session.type", "transcription"),
    ('{"type": "session.update", "session": {"input_audio_format": "g711_ulaw"}}',
     "unsupported", "session.input_audio_format", "beta"),
    ('{"type": "session.update", "session": {"modalities": ["text"]}}', "unsupported", "session.modalities", "beta"),
    ('{"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}}',
     "unsupported", "session.audio.input.format.rate", "24000"),
    ('{"type": "session.update", "session": {"audio": {"output": {"format": {"rate": 48000}}}}}',
     "unsupported", "session.audio.output.format.rate", "24000"),
    ('{"type": "session.update", "session": {"tools": [{"type": "function", "name": "f"}]}}',
     "unsupported", "session.tools", "not supported yet"),
    ('{"type": "session.update", "session": {"tools": "weird"}}', "unsupported", "session.tools", "not supported yet"),
    ('{"type": "session.update", "session": {"tool_choice": {"type": "function", "name": "f"}}}',
     "unsupported", "session.tool_choice", "not supported yet"),
    ('{"type": "response.create", "response": {"conversation": "none"}}', "unsupported", "response.conversation", ""),
    ('{"type": "response.create", "response": {"input": []}}', "unsupported", "response.input", ""),
    ('{"type": "response.create", "response": {"tools": [{"type": "function"}]}}', "unsupported", "response.tools", ""),
    ('{"type": "response.create", "response": {"output_modalities": ["audio", "text"]}}',
     "unsupported", "response.output_modalities", ""),
])
def test_bad_events_are_refused_with_code_and_field_path(data, code, param, text):
    exc = refusal(data, code, param)
    assert isinstance(exc, BadInputError) and text in str(exc)


def test_refusals_carry_the_clients_event_id():
    assert refusal({"type": "nope", "event_id": "ev_9"}, "unknown_event").event_id == "ev_9"
    assert refusal({"type": "input_audio_buffer.append", "event_id": "ev_8"}, "invalid_event").event_id == "ev_8"
    assert refusal({"type": "session.update", "event_id": "ev_7", "session": {"type": "transcription"}},
                   "unsupported").event_id == "ev_7"
    assert refusal({"type": "nope"}, "unknown_event").event_id is None


def test_oversized_events_are_refused_before_parsing():
    audio = "A" * (proto.MAX_CLIENT_EVENT_BYTES + 1)
    assert "limit" in str(refusal(json.dumps({"type": "input_audio_buffer.append", "audio": audio}), "too_large"))
    # counted in bytes: 300k four-byte characters are 1.2 MB
    refusal(json.dumps({"type": "x", "a": "\U0001F600" * 300_000}, ensure_ascii=False), "too_large")
    refusal(("{" + " " * proto.MAX_CLIENT_EVENT_BYTES).encode(), "too_large")


def test_fifteen_seconds_of_audio_fit_in_one_append():
    audio = "A" * (24_000 * 2 * 15 * 4 // 3)
    event = proto.parse_client_event(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
    assert len(event.audio) == 960_000


def test_errors_never_echo_more_than_a_hundred_characters_of_input():
    long = "x" * 5000
    for raw in ({"type": long}, {"type": "conversation.item.delete", "item_id": 5, "event_id": long},
                {"type": "session.update", "session": {long: 1, "output_modalities": [long]}},
                {"type": "session.update", "session": {"instructions": 5, "audio": {long: {}}}}):
        exc = refusal(json.dumps(raw), "unknown_event" if raw["type"] == long else "invalid_event")
        for said in (str(exc), exc.param or "", exc.event_id or ""):
            assert "x" * 101 not in said


# A fuzzer over arbitrary input and over mutations of real SDK events (hypothesis is not in the
# venv; a seeded generator keeps failures reproducible).

KEYS = ["type", "event_id", "session", "audio", "input", "output", "format", "rate", "turn_detection", "item",
        "content", "text", "transcript", "role", "id", "previous_item_id", "item_id", "audio_end_ms",
        "content_index", "response", "tools", "voice", "instructions", "output_modalities", "conversation"]
SCALARS = [None, True, False, 0, -1, 24000, 16000, 2 ** 70, 1.5, float("inf"), "", "audio/pcm", "audio/pcmu",
           "audio/pcma", "realtime", "message", "user", "assistant", "system", "function_call", "input_text",
           "input_audio", "output_audio", "server_vad", "semantic_vad", "root", "x" * 300, "\ud800", "\U0001F600"]


def random_json(rng: random.Random, depth: int = 0):
    kind = rng.randrange(3 if depth < 4 else 1)
    if kind == 0:
        return rng.choice(SCALARS)
    if kind == 1:
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(KEYS): random_json(rng, depth + 1) for _ in range(rng.randrange(5))}


def mutate(rng: random.Random, value):
    if isinstance(value, dict) and value and rng.random() < 0.8:
        key, action = rng.choice(list(value)), rng.random()
        if action < 0.2:
            return {k: v for k, v in value.items() if k != key}
        if action < 0.4:
            return {**value, key: random_json(rng, 2)}
        return {**value, key: mutate(rng, value[key])}
    if isinstance(value, list) and value and rng.random() < 0.8:
        i = rng.randrange(len(value))
        return [*value[:i], mutate(rng, value[i]), *value[i + 1:]]
    return random_json(rng, 2)


def valid_sdk_events() -> list[dict]:
    wire = SdkWire()
    wire.session.update(session=GA_SESSION)
    wire.item.create(item={"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "x"}]})
    wire.item.truncate(item_id="item_1", content_index=0, audio_end_ms=10)
    wire.response.create(response={"output_modalities": ["text"], "audio": {"output": {"voice": "marin"}}})
    wire.input_audio_buffer.append(audio="AAAA")
    return [json.loads(data) for data in wire.sent]


def test_fuzzed_input_raises_only_protocol_errors_through_parse_apply_and_create():
    rng = random.Random(20250613)
    seeds = valid_sdk_events()
    outcomes = Counter()
    for n in range(3000):
        raw = mutate(rng, rng.choice(seeds)) if n % 3 else random_json(rng)
        try:
            data = json.dumps(raw, ensure_ascii=rng.random() < 0.5)
        except (ValueError, UnicodeEncodeError):
            continue
        conv = RealtimeConversation(new_id=FakeIds())
        try:
            event = proto.parse_client_event(data.encode("utf-8", "surrogatepass") if n % 2 else data)
            if isinstance(event, rt.SessionUpdateEvent):
                proto.apply_session_update(SessionSettings(), event)
            elif isinstance(event, rt.ConversationItemCreateEvent):
                conv.create_item(event)
            elif isinstance(event, rt.ConversationItemTruncateEvent):
                conv.truncate(event.item_id, event.content_index, event.audio_end_ms)
            outcomes["ok"] += 1
        except RealtimeProtocolError as exc:
            outcomes[exc.code] += 1
            assert len(str(exc)) < 400 and "x" * 101 not in str(exc)
    assert outcomes["ok"] > 100 and outcomes["invalid_event"] > 100 and outcomes["unsupported"] > 10


# Session settings

def test_default_session_object_is_the_ga_shape():
    session = proto.session_object(SessionSettings(), session_id="sess_1", model="cadence")
    check_session(session)
    assert session["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert session["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    assert session["audio"]["input"]["transcription"] == {"model": proto.DEFAULT_TRANSCRIPTION_MODEL}
    assert session["output_modalities"] == ["audio"] and session["id"] == "sess_1"


@pytest.mark.parametrize("settings", [
    SessionSettings(),
    SessionSettings(audio_format="pcmu", server_vad=False, instructions="Be kind.", output_modalities=("text",),
                    input_transcription=False),
])
def test_session_events_validate(settings):
    conv = conversation(settings)
    for kind in ("session.created", "session.updated"):
        conv.event(kind, session=proto.session_object(settings, session_id="sess_1", model="m",
                                                      transcription_model="whisper-1"))


def test_updates_are_partial():
    settings = update({"instructions": "Be brief."})
    assert settings == SessionSettings(instructions="Be brief.")
    settings = update({"audio": {"input": {"turn_detection": None}}}, settings)
    assert settings == SessionSettings(instructions="Be brief.", server_vad=False)
    settings = update({"output_modalities": ["text"]}, settings)
    assert settings == SessionSettings(instructions="Be brief.", server_vad=False, output_modalities=("text",))
    assert update({}, settings) == settings
    # input only, with turn_detection absent: VAD stays off
    assert update({"audio": {"input": {"noise_reduction": None}}}, settings).server_vad is False
    assert update({"instructions": None}, settings).instructions is None  # null clears
    assert update({"instructions": ""}, settings).instructions == ""  # the SDK's way to clear them


def test_mu_law_for_input_and_output():
    settings = update({"audio": {"input": {"format": {"type": "audio/pcmu"}},
                                 "output": {"format": {"type": "audio/pcmu"}}}})
    assert settings.audio_format == "pcmu"
    session = proto.session_object(settings, session_id="s", model="m")
    assert session["audio"]["input"]["format"] == session["audio"]["output"]["format"] == {"type": "audio/pcmu"}
    check_session(session)
    # once both are mu-law, an update that names one side only keeps them matched
    assert update({"audio": {"output": {"format": {"type": "audio/pcmu"}}}}, settings).audio_format == "pcmu"
    assert proto.audio_duration_ms(800, "pcmu") == 100 and proto.audio_duration_ms(4800, "pcm16") == 100


@pytest.mark.parametrize("turn_detection, server_vad", [
    (None, False), (False, False), (True, True), ({"type": "server_vad"}, True),
    ({"type": "semantic_vad", "eagerness": "low"}, True),
])
def test_turn_detection(turn_detection, server_vad):
    before = SessionSettings(server_vad=not server_vad)
    settings = update({"audio": {"input": {"turn_detection": turn_detection}}}, before)
    assert settings.server_vad is server_vad
    reported = proto.session_object(settings, session_id="s", model="m")["audio"]["input"]["turn_detection"]
    assert (reported or {}).get("type") == ("server_vad" if server_vad else None)  # semantic reads back as server


def test_fields_we_ignore_are_accepted_and_change_nothing():
    ignored = {"audio": {"input": {"noise_reduction": {"type": "far_field"}, "transcription": None},
                         "output": {"voice": "cedar", "speed": 1.5}},
               "tracing": {"workflow_name": "w"}, "max_output_tokens": "inf", "truncation": "disabled",
               "include": [], "tool_choice": "none", "tools": [], "reasoning": {"effort": "low"}}
    assert update(ignored) == SessionSettings()


@pytest.mark.parametrize("session, param, text", [
    ({"audio": {"input": {"format": {"type": "audio/pcmu"}}, "output": {"format": {"type": "audio/pcm"}}}},
     "session.audio.output.format", "must match"),
    ({"audio": {"input": {"format": {"type": "audio/pcmu"}}}}, "session.audio.input.format", "must match"),
    ({"audio": {"output": {"format": {"type": "audio/pcmu"}}}}, "session.audio.output.format", "must match"),
    ({"audio": {"input": {"format": {"type": "audio/pcma"}}, "output": {"format": {"type": "audio/pcma"}}}},
     "session.audio.input.format.type", "A-law"),
    ({"output_modalities": ["audio", "text"]}, "session.output_modalities", '["audio"] or ["text"]'),
    ({"output_modalities": []}, "session.output_modalities", '["audio"] or ["text"]'),
    ({"instructions": "x" * (proto.MAX_INSTRUCTIONS_CHARS + 1)}, "session.instructions", "shorten"),
])
def test_session_updates_we_cannot_honour_are_refused(session, param, text):
    with pytest.raises(RealtimeProtocolError) as info:
        update(session)
    assert (info.value.code, info.value.param, info.value.event_id) == ("unsupported", param, "ev1")
    assert text in str(info.value) and "x" * 101 not in str(info.value)


def test_refusal_without_a_client_event_id_names_none():
    with pytest.raises(RealtimeProtocolError) as info:
        update({"output_modalities": ["audio", "text"]}, event_id=None)
    assert info.value.event_id is None


def test_tools_in_an_event_built_in_code_are_refused_too():
    event = rt.SessionUpdateEvent(session=rt.SessionProperties(tools=[{"type": "function", "name": "f"}]))
    with pytest.raises(RealtimeProtocolError, match="not supported yet") as info:
        proto.apply_session_update(SessionSettings(), event)
    assert info.value.param == "session.tools"


def test_the_longest_instructions_are_accepted():
    longest = "y" * proto.MAX_INSTRUCTIONS_CHARS
    assert update({"instructions": longest}).instructions == longest


@pytest.mark.parametrize("fields", [{"audio_format": "pcma"}, {"output_modalities": ("audio", "text")},
                                    {"instructions": "z" * (proto.MAX_INSTRUCTIONS_CHARS + 1)}])
def test_session_settings_validate_themselves(fields):
    with pytest.raises(ValueError):
        SessionSettings(**fields)


# The user's side

def test_a_spoken_turn():
    conv = conversation()
    started = conv.speech_started(100)
    assert [e["type"] for e in started] == ["input_audio_buffer.speech_started"]
    item_id = started[0]["item_id"]
    assert conv.speech_stopped(1600)[0] == {"type": "input_audio_buffer.speech_stopped", "event_id": "event_2",
                                            "audio_end_ms": 1600, "item_id": item_id}
    committed = conv.user_turn_committed("hello world")
    assert [e["type"] for e in committed] == [
        "input_audio_buffer.committed", "conversation.item.added", "conversation.item.done",
        "conversation.item.input_audio_transcription.completed"]
    assert {e.get("item_id", e.get("item", {}).get("id")) for e in committed} == {item_id}
    assert committed[1]["item"]["content"] == [{"type": "input_audio", "transcript": "hello world"}]
    assert committed[0]["previous_item_id"] is None
    assert committed[3]["transcript"] == "hello world" and committed[3]["usage"] == {"type": "duration", "seconds": 1.5}
    assert (conv.item_text(item_id), conv.item_role(item_id), conv.item_ids()) == ("hello world", "user", [item_id])
    second = conv.speech_started(5000)[0]["item_id"]
    assert second != item_id and conv.user_turn_committed("again")[0]["previous_item_id"] == item_id


def test_transcript_deltas_carry_only_the_new_suffix():
    conv = conversation()
    item_id = conv.speech_started(0)[0]["item_id"]
    deltas = []
    for partial in ["hel", "hello", "help", "hello wor", "hello wor", "", "hello world"]:
        deltas += [(e["delta"], e["item_id"]) for e in conv.user_transcript_delta(partial)]
    assert deltas == [("hel", item_id), ("lo", item_id), (" wor", item_id), ("ld", item_id)]
    conv.user_turn_committed("Hello, world.")  # the truth, whatever the partials said
    assert conv.item_text(item_id) == "Hello, world."
    assert conv.user_transcript_delta("next")[0]["delta"] == "next"  # a new turn starts from nothing


def test_a_turn_of_several_stretches_of_speech_is_one_item():
    conv = conversation()
    first = conv.speech_started(0)[0]["item_id"]
    conv.speech_stopped(500)
    assert conv.speech_started(900)[0]["item_id"] == first
    conv.speech_stopped(2000)
    assert conv.user_turn_committed("one two")[3]["usage"]["seconds"] == 2.0


def test_manual_commit_without_speech_events_names_the_item_then():
    conv = conversation()
    delta = conv.user_transcript_delta("hi")[0]
    committed = conv.user_turn_committed("hi there")
    assert committed[0]["item_id"] == delta["item_id"] == "item_1"
    assert committed[3]["usage"]["seconds"] == 0.0


def test_clearing_the_input_forgets_the_pending_turn():
    conv = conversation()
    first = conv.speech_started(0)[0]["item_id"]
    conv.user_transcript_delta("abc")
    assert conv.input_cleared() == [{"type": "input_audio_buffer.cleared", "event_id": "event_3"}]
    assert conv.speech_started(100)[0]["item_id"] != first
    assert conv.user_transcript_delta("abc")[0]["delta"] == "abc"
    assert conv.item_ids() == []


def test_barge_in_leaves_cancelling_to_the_glue():
    conv = conversation()
    conv.response_text("Let me tell you")
    conv.speech_started(300)
    assert conv.response_in_progress
    assert conv.response_done("cancelled", reason="turn_detected")[-1]["response"]["status_details"] == {
        "type": "cancelled", "reason": "turn_detected"}


# Items the client creates

def create(conv: RealtimeConversation, item: dict, **event) -> list[dict]:
    return conv.create_item(proto.parse_client_event(json.dumps({"type": "conversation.item.create",
                                                                  "item": {"type": "message", **item}, **event})))


def create_refused(item: dict, code: str, param: str, conv: RealtimeConversation | None = None, **event):
    with pytest.raises(RealtimeProtocolError) as info:
        create(conv or conversation(), item, **event)
    assert (info.value.code, info.value.param) == (code, param), str(info.value)
    return info.value


def test_created_items_of_each_role_echo_in_ga_shape():
    conv = conversation()
    user = create(conv, {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]})
    assert [e["type"] for e in user] == ["conversation.item.added", "conversation.item.done"]
    assert user[0]["item"] == {"id": "item_1", "object": "realtime.item", "type": "message", "status": "completed",
                               "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}
    system = create(conv, {"role": "system", "content": [{"type": "text", "text": "Be terse."}]})
    assert system[0]["item"]["content"] == [{"type": "input_text", "text": "Be terse."}]
    assistant = create(conv, {"role": "assistant", "content": [{"type": "text", "text": "Hello"}]}, event_id="e")
    assert assistant[0]["item"]["content"] == [{"type": "output_text", "text": "Hello"}]
    spoken = create(conv, {"role": "user", "content": [{"type": "input_audio", "audio": "AAAA", "transcript": "yes"},
                                                      {"type": "input_text", "text": "and more"}]})
    assert spoken[0]["item"]["content"] == [{"type": "input_audio", "transcript": "yes"},  # audio not kept
                                            {"type": "input_text", "text": "and more"}]
    assert [conv.item_role(i) for i in conv.item_ids()] == ["user", "system", "assistant", "user"]
    assert conv.item_text("item_4") == "yes\nand more"
    assert [e["previous_item_id"] for e in user + system + assistant + spoken] == [
        None, None, "item_1", "item_1", "item_2", "item_2", "item_3", "item_3"]


def test_previous_item_id_places_the_item():
    conv = conversation()
    for text in "ab":
        create(conv, {"id": text, "role": "user", "content": [{"type": "input_text", "text": text}]})
    assert create(conv, {"id": "first", "role": "user", "content": [{"type": "input_text", "text": "0"}]},
                  previous_item_id="root")[0]["previous_item_id"] is None
    assert create(conv, {"id": "mid", "role": "user", "content": [{"type": "input_text", "text": "m"}]},
                  previous_item_id="a")[0]["previous_item_id"] == "a"
    assert conv.item_ids() == ["first", "a", "mid", "b"]
    exc = create_refused({"role": "user", "content": [{"type": "input_text", "text": "x"}]}, "item_not_found",
                         "previous_item_id", conv, previous_item_id="nope", event_id="ev_5")
    assert exc.event_id == "ev_5"


@pytest.mark.parametrize("item, code, param", [
    ({"type": "function_call", "name": "f", "arguments": "{}"}, "unsupported", "item.type"),
    ({"type": "function_call_output", "call_id": "c", "output": "{}"}, "unsupported", "item.type"),
    ({"content": [{"type": "input_text", "text": "x"}]}, "invalid_value", "item.role"),
    ({"role": "user", "content": []}, "invalid_value", "item.content"),
    ({"role": "user"}, "invalid_value", "item.content"),
    ({"role": "user", "content": [{"type": "input_audio", "audio": "AAAA"}]},
     "unsupported", "item.content.0.transcript"),
    ({"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_image", "image_url": "data:"}]},
     "unsupported", "item.content.1.type"),
    ({"role": "system", "content": [{"type": "input_audio", "transcript": "x"}]}, "unsupported", "item.content.0.type"),
    ({"role": "user", "content": [{"type": "input_text"}]}, "invalid_value", "item.content.0.text"),
    ({"role": "user", "content": [{"type": "input_text", "text": "x" * (conv_module.MAX_ITEM_TEXT_CHARS + 1)}]},
     "too_large", "item.content"),
    ({"id": "i" * (conv_module.MAX_ITEM_ID_CHARS + 1), "role": "user",
      "content": [{"type": "input_text", "text": "x"}]},
     "invalid_value", "item.id"),
])
def test_items_we_cannot_take_are_refused(item, code, param):
    item = {"type": "message", **item}
    exc = create_refused(item, code, param, event_id="ev_3")
    assert exc.event_id == "ev_3" and "x" * 101 not in str(exc)


def test_an_item_id_in_use_is_refused():
    conv = conversation()
    create(conv, {"id": "dup", "role": "user", "content": [{"type": "input_text", "text": "x"}]})
    create_refused({"id": "dup", "role": "user", "content": [{"type": "input_text", "text": "y"}]},
                   "duplicate_item_id", "item.id", conv)
    pending = conv.speech_started(0)[0]["item_id"]  # named already, created on commit
    create_refused({"id": pending, "role": "user", "content": [{"type": "input_text", "text": "y"}]},
                   "duplicate_item_id", "item.id", conv)


def test_delete_and_retrieve():
    conv = conversation()
    create(conv, {"id": "a", "role": "user", "content": [{"type": "input_text", "text": "x"}]})
    retrieved = conv.retrieve_item("a")
    assert retrieved[0]["type"] == "conversation.item.retrieved" and retrieved[0]["item"]["id"] == "a"
    assert conv.delete_item("a") == [{"type": "conversation.item.deleted", "event_id": "event_4", "item_id": "a"}]
    for call in (conv.delete_item, conv.retrieve_item, conv.item_text, conv.item_role):
        with pytest.raises(RealtimeProtocolError) as info:
            call("a")
        assert (info.value.code, info.value.param) == ("item_not_found", "item_id")
    with pytest.raises(RealtimeProtocolError) as info:
        conv.delete_item("b" * 500, event_id="ev_2")
    assert info.value.event_id == "ev_2" and "b" * 101 not in str(info.value)


def test_the_response_in_progress_cannot_be_deleted():
    conv = conversation()
    conv.response_started()
    with pytest.raises(RealtimeProtocolError, match="cancel it first"):
        conv.delete_item(conv.current_response_item_id)
    item_id = conv.current_response_item_id
    conv.response_done("cancelled")
    assert conv.delete_item(item_id)[0]["item_id"] == item_id


# The agent's side

def test_an_audio_response_from_start_to_done():
    conv = conversation()
    assert not conv.response_in_progress and conv.current_response_item_id is None
    started = conv.response_started()
    assert [e["type"] for e in started] == ["response.created", "response.output_item.added",
                                            "conversation.item.added", "response.content_part.added"]
    assert started[0]["response"]["id"] == "resp_1" and started[0]["response"]["status"] == "in_progress"
    assert started[3]["part"] == {"type": "audio", "transcript": ""}
    assert conv.response_started() == [] and conv.current_response_item_id == "item_1"
    events = conv.response_text("Hello there. ") + conv.response_audio("AAAA", 500) + conv.response_text("Bye.")
    assert [(e["type"], e["delta"]) for e in events] == [
        ("response.output_audio_transcript.delta", "Hello there. "), ("response.output_audio.delta", "AAAA"),
        ("response.output_audio_transcript.delta", "Bye.")]
    done = conv.response_done("completed")
    assert [e["type"] for e in done] == [
        "response.output_audio.done", "response.output_audio_transcript.done", "response.content_part.done",
        "response.output_item.done", "conversation.item.done", "response.done"]
    assert done[1]["transcript"] == "Hello there. Bye."
    assert done[2]["part"] == {"type": "audio", "transcript": "Hello there. Bye."}
    response = done[-1]["response"]
    assert response["status"] == "completed" and response["output"] == [done[3]["item"]]
    assert response["output"][0]["status"] == "completed" and response["usage"]["total_tokens"] == 0
    assert response["audio"] == {"output": {"format": {"type": "audio/pcm", "rate": 24000}}}
    assert not conv.response_in_progress and conv.response_done("completed") == []
    assert conv.item_text("item_1") == "Hello there. Bye." and conv.item_role("item_1") == "assistant"


def test_audio_before_any_start_opens_the_response():
    conv = conversation(SessionSettings(audio_format="pcmu"))
    events = conv.response_audio("////", 20)
    assert [e["type"] for e in events] == ["response.created", "response.output_item.added",
                                           "conversation.item.added", "response.content_part.added",
                                           "response.output_audio.delta"]
    assert events[0]["response"]["audio"]["output"]["format"] == {"type": "audio/pcmu"}
    assert [e["type"] for e in conv.response_audio("////", 20)] == ["response.output_audio.delta"]


def test_a_text_response():
    conv = conversation(SessionSettings(output_modalities=("text",)))
    events = conv.response_text("Hi")
    assert events[3]["part"] == {"type": "text", "text": ""}
    assert events[2]["item"]["content"][0]["type"] == "output_text"
    assert events[-1]["type"] == "response.output_text.delta"
    assert conv.response_audio("AAAA", 100) == []  # a text response carries no audio
    done = conv.response_done("completed")
    assert [e["type"] for e in done] == ["response.output_text.done", "response.content_part.done",
                                         "response.output_item.done", "conversation.item.done", "response.done"]
    assert done[0]["text"] == "Hi" and "audio" not in done[-1]["response"]


def test_a_response_keeps_the_modality_it_opened_with():
    conv = conversation()
    conv.response_started(modality="text")
    conv.settings = SessionSettings(output_modalities=("audio",))
    assert conv.response_text("x")[0]["type"] == "response.output_text.delta"
    conv.response_done("completed")
    conv.settings = SessionSettings(output_modalities=("text",))
    conv.response_started()
    assert conv.response_text("x")[0]["type"] == "response.output_text.delta"


def test_a_cancelled_response_is_incomplete():
    conv = conversation()
    conv.user_turn_committed("hi")
    conv.response_text("Well, ")
    done = conv.response_done("cancelled")
    assert done[-1]["response"]["status"] == "cancelled"
    assert done[-1]["response"]["status_details"] == {"type": "cancelled"}
    assert done[3]["item"]["status"] == "incomplete" and done[4]["previous_item_id"] == "item_1"


def test_empty_text_sends_no_delta():
    conv = conversation()
    conv.response_started()
    assert conv.response_text("") == []


# Truncation

def spoken_reply(conv: RealtimeConversation, chunks: list[tuple[str, float]]) -> str:
    """Each chunk's text comes, then its audio plays for the given ms."""
    for text, ms in chunks:
        conv.response_text(text)
        conv.response_audio("AAAA", ms)
    conv.response_done("cancelled", reason="turn_detected")
    return conv.item_ids()[-1]


SENTENCES = [("Hello there. ", 1000), ("How are you ", 800), ("today?", 500)]


@pytest.mark.parametrize("audio_end_ms, heard", [
    (0, ""), (1, "Hello there."), (1000, "Hello there."), (1001, "Hello there. How are you"),
    (1800, "Hello there. How are you"), (1801, "Hello there. How are you today?"),
    (2300, "Hello there. How are you today?"),
])
def test_truncation_keeps_the_text_that_was_heard(audio_end_ms, heard):
    conv = conversation()
    item_id = spoken_reply(conv, SENTENCES)
    events, text = conv.truncate(item_id, 0, audio_end_ms)
    assert text == heard and conv.item_text(item_id) == heard
    assert events == [{"type": "conversation.item.truncated", "event_id": events[0]["event_id"], "item_id": item_id,
                       "content_index": 0, "audio_end_ms": audio_end_ms}]
    assert conv.retrieve_item(item_id)[0]["item"]["content"] == [{"type": "output_audio", "transcript": heard}]


@pytest.mark.parametrize("chunks, audio_end_ms, heard", [
    ([("Hel", 100), ("lo wor", 100), ("ld", 100)], 150, "Hello"),  # "wor|ld": half a word is no word
    ([("Hel", 100), ("lo", 100)], 50, ""),
    ([("Hello", 100), (", world", 100)], 50, "Hello"),  # punctuation next: the word was whole
    ([("Hello ", 100), ("world", 100)], 50, "Hello"),
    ([("你好", 100), ("世界", 100)], 50, "你好"),  # no spaces between words: cut at the segment
    ([("(wor", 100), ("ld)", 100)], 50, ""),
])
def test_truncation_cuts_at_a_word_boundary(chunks, audio_end_ms, heard):
    conv = conversation()
    assert conv.truncate(spoken_reply(conv, chunks), 0, audio_end_ms)[1] == heard


def test_truncation_twice_and_then_beyond_the_new_end():
    conv = conversation()
    item_id = spoken_reply(conv, SENTENCES)
    conv.truncate(item_id, 0, 1500)
    with pytest.raises(RealtimeProtocolError) as info:
        conv.truncate(item_id, 0, 1600)
    assert (info.value.code, info.value.param) == ("invalid_value", "audio_end_ms")
    assert conv.truncate(item_id, 0, 500)[1] == "Hello there."


def test_truncation_allows_whole_ms_past_a_fractional_duration():
    conv = conversation()
    item_id = spoken_reply(conv, [("a b", 20.5)])
    assert conv.truncate(item_id, 0, 21)[1] == "a b"


def test_the_response_in_progress_may_be_truncated():
    conv = conversation()
    conv.response_text("One. ")
    conv.response_audio("AAAA", 400)
    conv.response_text("Two.")
    conv.response_audio("AAAA", 400)
    assert conv.truncate(conv.current_response_item_id, 0, 400)[1] == "One."
    assert conv.response_done("cancelled")[1]["transcript"] == "One."


def test_truncation_refusals():
    conv = conversation()
    conv.user_turn_committed("hi")
    audio_item = spoken_reply(conv, SENTENCES)
    conv.response_started(modality="text")
    conv.response_text("text only")
    text_item = conv.current_response_item_id
    conv.response_done("completed")
    for args, param in [(("item_1", 0, 0), "item_id"), ((text_item, 0, 0), "item_id"),
                        ((audio_item, 1, 0), "content_index"), ((audio_item, 0, -1), "audio_end_ms"),
                        ((audio_item, 0, 2301), "audio_end_ms")]:
        with pytest.raises(RealtimeProtocolError) as info:
            conv.truncate(*args, event_id="ev_4")
        assert (info.value.code, info.value.param, info.value.event_id) == ("invalid_value", param, "ev_4")
    with pytest.raises(RealtimeProtocolError) as info:
        conv.truncate("nope", 0, 0)
    assert info.value.code == "item_not_found"
    assert conv.item_text(audio_item) == "Hello there. How are you today?"  # nothing changed


def test_a_created_assistant_audio_item_has_no_audio_to_cut():
    conv = conversation()
    create(conv, {"id": "a", "role": "assistant", "content": [{"type": "output_audio", "transcript": "Hi"}]})
    with pytest.raises(RealtimeProtocolError):
        conv.truncate("a", 0, 10)
    assert conv.truncate("a", 0, 0)[1] == ""


# Bounds

def test_the_oldest_items_are_dropped_past_the_limit():
    conv = conversation(max_items=3)
    for text in "abc":
        create(conv, {"id": text, "role": "user", "content": [{"type": "input_text", "text": text}]})
    create(conv, {"id": "z", "role": "user", "content": [{"type": "input_text", "text": "z"}]}, previous_item_id="root")
    assert conv.item_ids() == ["z", "b", "c"]  # oldest by creation, not by place
    conv.response_started()
    reply = conv.current_response_item_id
    for text in "de":
        create(conv, {"id": text, "role": "user", "content": [{"type": "input_text", "text": text}]})
    assert conv.item_ids() == [reply, "d", "e"]  # the reply in progress is kept, though oldest
    assert conv.response_done("completed")[-1]["response"]["output"][0]["id"] == reply
    with pytest.raises(RealtimeProtocolError):
        conv.retrieve_item("a")


def test_text_segments_are_bounded_and_later_text_joins_the_last(monkeypatch):
    monkeypatch.setattr(conv_module, "MAX_TEXT_SEGMENTS", 2)
    conv = conversation()
    item_id = spoken_reply(conv, [("One. ", 100), ("Two. ", 100), ("Three. ", 100), ("Four.", 100)])
    assert conv.item_text(item_id) == "One. Two. Three. Four."
    assert conv.truncate(item_id, 0, 150)[1] == "One. Two. Three. Four."  # heard with "Two."
    assert conv.truncate(item_id, 0, 50)[1] == "One."


def test_item_text_is_bounded_but_every_delta_is_sent(monkeypatch):
    monkeypatch.setattr(conv_module, "MAX_ITEM_TEXT_CHARS", 10)
    conv = conversation()
    deltas = [e["delta"] for text in ("123456", "789abc", "def") for e in conv.response_text(text)
              if e["type"].endswith(".delta")]
    assert deltas == ["123456", "789abc", "def"]
    assert conv.response_done("completed")[1]["transcript"] == "123456789a"
    conv.user_turn_committed("x" * 50)
    assert conv.item_text(conv.item_ids()[-1]) == "x" * 10


# Errors, ids

def test_error_event_is_the_ga_shape():
    conv = conversation()
    exc = RealtimeProtocolError("no item 'x'", code="item_not_found", param="item_id", event_id="ev_1")
    assert conv.error_event(exc) == {"type": "error", "event_id": "event_1", "error": {
        "type": "invalid_request_error", "code": "item_not_found", "message": "no item 'x'", "param": "item_id",
        "event_id": "ev_1"}}
    conv.error_event(RealtimeProtocolError("bad", code="invalid_json"))  # param and event_id null


def test_ids_come_from_the_injected_source():
    conv = conversation()
    events = conv.speech_started(0) + conv.user_turn_committed("hi") + conv.response_text("ok")
    assert [e["event_id"] for e in events] == [f"event_{n}" for n in range(1, 11)]
    assert events[0]["item_id"] == "item_1" and events[5]["response"]["id"] == "resp_1"
    assert conv.current_response_item_id == "item_2"


def test_default_ids_are_random_and_fit_openais_item_id_limit():
    ids = {random_id("item") for _ in range(100)}
    assert len(ids) == 100 and all(i.startswith("item_") and len(i) <= 32 for i in ids)
    assert RealtimeConversation().speech_started(0)[0]["event_id"].startswith("event_")
