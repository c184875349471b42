"""OpenAI Realtime (GA) client events, parsed and checked, and the session settings they carry.

No I/O, no asyncio, no clock: the WebSocket glue feeds text in and gets pipecat's event models
(`pipecat.services.openai.realtime.events`) or a `RealtimeProtocolError` out, which it turns
into an `error` event (see `realtime_conversation.RealtimeConversation.error_event`) and goes on.

Pipecat's models are a client's view of the protocol; here they stand in for a server's. Where
they are stricter or looser than what the official `openai` SDK sends, `parse_client_event`
corrects for it before or after validation; each place says why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Literal

from pipecat.services.openai.realtime import events as rt
from pydantic import ValidationError

from agent.errors import BadInputError

# One event is at most this big. 15 s of 24 kHz PCM16 is 720 KB, ~960 KB as base64: SDK clients
# append 20-100 ms at a time, so this is ample, and it bounds what one message can make us hold.
MAX_CLIENT_EVENT_BYTES = 1 << 20
# Client instructions are appended to the agent's own prompt; ~2k tokens leaves a small model
# room for its prompt, the retrieved passages and the conversation.
MAX_INSTRUCTIONS_CHARS = 8_000
MAX_ECHO_CHARS = 100  # of client input, in any error message or field we send back
DEFAULT_TRANSCRIPTION_MODEL = "cadence-asr"  # what the session object says transcribes the input

AudioFormat = Literal["pcm16", "pcmu"]
ClientEvent = (rt.SessionUpdateEvent | rt.InputAudioBufferAppendEvent | rt.InputAudioBufferCommitEvent
               | rt.InputAudioBufferClearEvent | rt.ConversationItemCreateEvent | rt.ConversationItemTruncateEvent
               | rt.ConversationItemDeleteEvent | rt.ConversationItemRetrieveEvent | rt.ResponseCreateEvent
               | rt.ResponseCancelEvent)
CLIENT_EVENT_MODELS: dict[str, type[rt.ClientEvent]] = {
    "session.update": rt.SessionUpdateEvent,
    "input_audio_buffer.append": rt.InputAudioBufferAppendEvent,
    "input_audio_buffer.commit": rt.InputAudioBufferCommitEvent,
    "input_audio_buffer.clear": rt.InputAudioBufferClearEvent,
    "conversation.item.create": rt.ConversationItemCreateEvent,
    "conversation.item.truncate": rt.ConversationItemTruncateEvent,
    "conversation.item.delete": rt.ConversationItemDeleteEvent,
    "conversation.item.retrieve": rt.ConversationItemRetrieveEvent,
    "response.create": rt.ResponseCreateEvent,
    "response.cancel": rt.ResponseCancelEvent,
}
# In the GA protocol, but only over WebRTC and SIP, where the server holds the playback buffer.
WEBRTC_ONLY_EVENTS = frozenset({"output_audio_buffer.clear"})
# Beta session keys. Pipecat would drop them unread, leaving a beta client sure it had asked for
# G.711 or no VAD while it got neither: refused, so that it learns at once.
BETA_SESSION_KEYS = ("input_audio_format", "output_audio_format", "turn_detection", "modalities",
                     "input_audio_transcription")
# Byte rates of the output audio, for positions in ms: 24 kHz x 2 bytes, and 8 kHz x 1 byte.
BYTES_PER_MS: dict[str, int] = {"pcm16": 48, "pcmu": 8}


class RealtimeProtocolError(BadInputError):
    """A client event we cannot accept; the session goes on. `code` is OpenAI's kind of code
    (invalid_json, unknown_event, invalid_event, unsupported, item_not_found, too_large,
    invalid_value, duplicate_item_id), `param` the field path at fault, `event_id` the client's."""

    def __init__(self, message: str, *, code: str, param: str | None = None, event_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.param = param
        self.event_id = event_id


def parse_client_event(data: str | bytes) -> ClientEvent:
    """One WebSocket message as a pipecat event model; RealtimeProtocolError for anything else."""
    size = len(data)
    if isinstance(data, str) and size * 4 > MAX_CLIENT_EVENT_BYTES:  # UTF-8: up to 4 bytes a char
        size = len(data.encode("utf-8", "surrogatepass"))
    if size > MAX_CLIENT_EVENT_BYTES:
        raise RealtimeProtocolError(f"event is {size} bytes, over the {MAX_CLIENT_EVENT_BYTES} byte limit; "
                                    f"send audio in smaller appends", code="too_large")
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError) as exc:  # ValueError: JSONDecodeError, bad UTF-8, huge ints
        raise RealtimeProtocolError(f"event is not valid JSON: {exc.__class__.__name__}", code="invalid_json") from None
    if not isinstance(raw, dict):
        raise RealtimeProtocolError("event must be a JSON object", code="invalid_json")
    event_id = raw.get("event_id")
    event_id = event_id[:MAX_ECHO_CHARS] if isinstance(event_id, str) else None
    kind = raw.get("type")
    if not isinstance(kind, str):
        raise RealtimeProtocolError("event needs a string 'type'", code="invalid_event", param="type",
                                    event_id=event_id)
    model = CLIENT_EVENT_MODELS.get(kind)
    if model is None:
        code, why = ("unsupported", "is only for WebRTC and SIP") if kind in WEBRTC_ONLY_EVENTS else \
            ("unknown_event", "is not a client event; expected one of " + ", ".join(CLIENT_EVENT_MODELS))
        raise RealtimeProtocolError(f"event type {kind[:MAX_ECHO_CHARS]!r} {why}", code=code, param="type",
                                    event_id=event_id)
    if kind == "session.update" and isinstance(raw.get("session"), dict):
        raw = {**raw, "session": _session_for_pipecat(raw["session"], event_id)}
    if kind == "response.create" and isinstance(raw.get("response"), dict):
        raw = {**raw, "response": _response_for_pipecat(raw["response"], event_id)}
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise _schema_error(exc, raw, event_id) from None


def client_event_id(event: rt.ClientEvent) -> str | None:
    """The event_id the client sent, or None: pipecat makes one up when it is absent, and an
    error must not name an id the client never used."""
    return event.event_id[:MAX_ECHO_CHARS] if "event_id" in event.model_fields_set else None


def _session_for_pipecat(session: dict, event_id: str | None) -> dict:
    """Refuses what pipecat's SessionProperties would let through or reject unclearly, and drops
    the fields we ignore where pipecat is stricter than the SDK."""
    def refuse(message: str, param: str) -> RealtimeProtocolError:
        return RealtimeProtocolError(message, code="unsupported", param=param, event_id=event_id)

    kind = session.get("type")
    if isinstance(kind, str) and kind != "realtime":  # pipecat: a bare literal error
        raise refuse("only 'realtime' sessions are served here, not transcription sessions", "session.type")
    for key in BETA_SESSION_KEYS:
        if key in session:
            raise refuse(f"session.{key} is from the beta protocol; this server speaks the GA one "
                         f"(session.audio.input / session.audio.output, output_modalities)", f"session.{key}")
    # Pipecat runs tool lists through LLMContext's normaliser, which may raise anything, not only
    # ValidationError; it forbids the SDK's forced-tool object for tool_choice. Neither matters:
    # we have no tools to offer.
    tools, tool_choice = session.get("tools"), session.get("tool_choice")
    if tools not in (None, []) or isinstance(tool_choice, dict):
        param = "session.tools" if tools not in (None, []) else "session.tool_choice"
        raise refuse("tools (function calling) are not supported yet; send none", param)
    audio = session.get("audio")
    if not isinstance(audio, dict):
        return session
    audio = dict(audio)
    for side, ignored in (("input", ("noise_reduction", "transcription")), ("output", ("voice",))):
        part = audio.get(side)
        if not isinstance(part, dict):
            continue
        fmt = part.get("format")
        # Pipecat's union of formats fails as three union members' errors; the SDK's AudioPCM
        # also allows only 24000, but a client asking for 16 kHz deserves a plain refusal.
        pcm = isinstance(fmt, dict) and fmt.get("type", "audio/pcm") == "audio/pcm"
        if pcm and fmt.get("rate") not in (None, 24000):
            raise refuse("audio/pcm is served at 24000 Hz only; resample, or use audio/pcmu",
                         f"session.audio.{side}.format.rate")
        # Ignored (we always transcribe, with our ASR; one voice per agent; no noise reduction),
        # and pipecat refuses SDK shapes of them: noise_reduction without a type, voice as {"id"}.
        audio[side] = {k: v for k, v in part.items() if k not in ignored}
    return {**session, "audio": audio}


def _response_for_pipecat(response: dict, event_id: str | None) -> dict:
    """Pipecat's ResponseProperties drops `conversation` and `input` unread: an out-of-band
    response ("none") or one over chosen items would silently become an ordinary reply."""
    def refuse(message: str, param: str) -> RealtimeProtocolError:
        return RealtimeProtocolError(message, code="unsupported", param=param, event_id=event_id)

    if response.get("conversation", "auto") != "auto":
        raise refuse("only responses in the conversation are supported (conversation 'auto')", "response.conversation")
    if "input" in response:
        raise refuse("responses over chosen items (response.input) are not supported", "response.input")
    if response.get("tools") not in (None, []) or isinstance(response.get("tool_choice"), dict):
        raise refuse("tools (function calling) are not supported yet; send none", "response.tools")
    modalities = response.get("output_modalities")
    if modalities is not None and modalities not in (["audio"], ["text"]):
        raise refuse('output_modalities must be ["audio"] or ["text"]', "response.output_modalities")
    audio = response.get("audio")
    output = audio.get("output") if isinstance(audio, dict) else None
    if isinstance(output, dict) and "voice" in output:  # ignored; pipecat refuses the SDK's {"id"} form
        response = {**response, "audio": {**audio, "output": {k: v for k, v in output.items() if k != "voice"}}}
    return response


def response_modality(event: rt.ResponseCreateEvent, settings: SessionSettings) -> str:
    """"audio" or "text" for this response. Pipecat's ResponseProperties defaults
    output_modalities to ["audio"]: only a value the client sent overrides the session's."""
    props = event.response
    if props is not None and "output_modalities" in props.model_fields_set and props.output_modalities:
        return props.output_modalities[0]
    return settings.output_modalities[0]


def _schema_error(exc: ValidationError, raw: dict, event_id: str | None) -> RealtimeProtocolError:
    """Names the field path and what was wrong, never the value sent (it may be megabytes)."""
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    first = errors[0]
    param = _field_path(raw, first)
    more = len(errors) - 1
    # Several errors under one path are the members of a union, each saying why it did not match.
    shape = " (matches none of its accepted forms)" if more and all(
        _field_path(raw, e) == param for e in errors) else (f" (and {more} more)" if more else "")
    message = f"{param or 'event'}: {first['msg'][:MAX_ECHO_CHARS]}{shape}"
    return RealtimeProtocolError(message, code="invalid_event", param=param or None, event_id=event_id)


def _field_path(raw: Any, error: dict) -> str:
    """The part of the error's `loc` that names fields of the input: union members' tags in it
    ('PCMAudioFormat', 'list[dict[any,any]]') are not keys of the data, and end the path."""
    path, node, loc = [], raw, error["loc"]
    for depth, part in enumerate(loc):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif error["type"] == "missing" and depth == len(loc) - 1 and isinstance(node, dict):
            pass  # a missing field: its name is the path's end
        else:
            break
        path.append(str(part))
    return ".".join(path)[:MAX_ECHO_CHARS]


@dataclass(frozen=True)
class SessionSettings:
    """What a session.update may change, as we act on it. Everything else we accept and ignore."""

    # Input and output alike: pcm16 is PCM16 24 kHz mono little-endian, pcmu G.711 mu-law 8 kHz.
    audio_format: AudioFormat = "pcm16"
    # Our VAD and turn-end model decide turns (semantic_vad is read as server_vad); False: the
    # client commits and asks for responses itself (turn_detection null).
    server_vad: bool = True
    # Appended to the agent's prompt; at most MAX_INSTRUCTIONS_CHARS.
    instructions: str | None = None
    # ("audio",): speech plus its transcript; ("text",): text only (no TTS runs).
    output_modalities: tuple[str, ...] = ("audio",)
    # We always transcribe the caller (the LLM reads text); said so in the session object.
    input_transcription: bool = True

    def __post_init__(self) -> None:
        if self.audio_format not in BYTES_PER_MS:
            raise ValueError(f"audio_format must be pcm16 or pcmu, not {self.audio_format!r}")
        if self.output_modalities not in (("audio",), ("text",)):
            raise ValueError("output_modalities must be ('audio',) or ('text',)")
        if self.instructions is not None and len(self.instructions) > MAX_INSTRUCTIONS_CHARS:
            raise ValueError(f"instructions are over {MAX_INSTRUCTIONS_CHARS} characters")


def apply_session_update(settings: SessionSettings, event: rt.SessionUpdateEvent) -> SessionSettings:
    """`settings` with what the update sets; fields it leaves out keep their values."""
    session, event_id = event.session, client_event_id(event)

    def refuse(message: str, param: str) -> RealtimeProtocolError:
        return RealtimeProtocolError(message, code="unsupported", param=param, event_id=event_id)

    if session.tools:  # parse_client_event refuses these first; events built in code may have them
        raise refuse("tools (function calling) are not supported yet; send none", "session.tools")
    changes: dict[str, Any] = {}
    if session.output_modalities is not None:
        if session.output_modalities not in (["audio"], ["text"]):
            raise refuse('output_modalities must be ["audio"] or ["text"]', "session.output_modalities")
        changes["output_modalities"] = tuple(session.output_modalities)
    if "instructions" in session.model_fields_set:  # null clears them
        if session.instructions is not None and len(session.instructions) > MAX_INSTRUCTIONS_CHARS:
            raise refuse(f"instructions are {len(session.instructions)} characters, over the "
                         f"{MAX_INSTRUCTIONS_CHARS} allowed; shorten them", "session.instructions")
        changes["instructions"] = session.instructions
    audio_in = session.audio.input if session.audio else None
    audio_out = session.audio.output if session.audio else None
    formats = {side: _audio_format(part.format, f"session.audio.{side}.format.type", refuse)
               for side, part in (("input", audio_in), ("output", audio_out)) if part and part.format}
    if formats:
        input_format = formats.get("input", settings.audio_format)
        if formats.get("output", settings.audio_format) != input_format:
            side = "output" if "output" in formats else "input"
            raise refuse("input and output audio formats must match; set both to the same format",
                         f"session.audio.{side}.format")
        changes["audio_format"] = input_format
    if audio_in is not None and "turn_detection" in audio_in.model_fields_set:
        # Pipecat also takes a bool here, False being its own spelling of null; True reads as "on".
        changes["server_vad"] = audio_in.turn_detection not in (None, False)
    return replace(settings, **changes)


def _audio_format(fmt: rt.AudioFormat, param: str, refuse) -> AudioFormat:
    if isinstance(fmt, rt.PCMUAudioFormat):
        return "pcmu"
    if isinstance(fmt, rt.PCMAudioFormat):
        return "pcm16"
    raise refuse("audio/pcma (G.711 A-law) is not supported; use audio/pcmu or audio/pcm at 24000 Hz", param)


def audio_duration_ms(num_bytes: int, audio_format: AudioFormat) -> float:
    """How long `num_bytes` of audio in `audio_format` play, in ms."""
    return num_bytes / BYTES_PER_MS[audio_format]


def format_object(audio_format: AudioFormat) -> dict:
    return {"type": "audio/pcm", "rate": 24000} if audio_format == "pcm16" else {"type": "audio/pcmu"}


def session_object(settings: SessionSettings, *, session_id: str, model: str,
                   transcription_model: str = DEFAULT_TRANSCRIPTION_MODEL) -> dict:
    """The `session` of session.created / session.updated, as the GA server sends it (with id and
    object, as RealtimeSessionCreateResponse has them). It reports what we do, not what was asked:
    semantic_vad reads back as server_vad, a voice asked for is not echoed."""
    fmt = format_object(settings.audio_format)
    turn_detection = ({"type": "server_vad", "create_response": True, "interrupt_response": True}
                      if settings.server_vad else None)
    return {
        "type": "realtime",
        "object": "realtime.session",
        "id": session_id,
        "model": model,
        "output_modalities": list(settings.output_modalities),
        "instructions": settings.instructions,
        "tools": [],
        "tool_choice": "auto",
        "max_output_tokens": "inf",
        "tracing": None,
        "audio": {
            "input": {
                "format": dict(fmt),
                "transcription": {"model": transcription_model} if settings.input_transcription else None,
                "noise_reduction": None,
                "turn_detection": turn_detection,
            },
            "output": {"format": dict(fmt), "speed": 1.0},
        },
    }
