"""One Realtime session's conversation, and the server events that tell the client about it.

Plain logic: the glue reports what happened (speech started, a transcript, a chunk of reply
audio) and sends the events returned, in order, as JSON. Ids come from an injectable `new_id`
so that tests see fixed ones. Positions in reply audio are ms of the session's output format.

Bounded: at most MAX_ITEMS items, the oldest (by creation) dropped first; they are gone only
from here (retrieve, delete and truncate no longer find them), not from the LLM's context,
which the pipeline bounds by its own rule. Each item's text and text segments are capped too.
"""

from __future__ import annotations

import math
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from pipecat.services.openai.realtime import events as rt

from agent.transports.realtime_protocol import (
    AudioFormat, RealtimeProtocolError, SessionSettings, client_event_id, format_object)

MAX_ITEMS = 512  # a long call's worth of turns; more is dropped oldest first
# Text deltas recorded with their audio position, per item: a reply's sentences or words for
# minutes. Past this, new text joins the last segment, so a cut after it counts that text heard.
MAX_TEXT_SEGMENTS = 1024
# Per item (~15 minutes of speech); a reply's later text is still sent, not stored.
MAX_ITEM_TEXT_CHARS = 16_000
MAX_ITEM_ID_CHARS = 64  # OpenAI allows 32; some room for clients that prefix their own
# Scripts written without spaces between words (CJK, from U+2E80) give no word edge to find.
_NO_SPACES_FROM = 0x2E80
_TRAILING_WORD = re.compile(r"\S*$")

# The GA content type of each kind of content, by role. Beta clients wrote "text" and "audio",
# and some write input_text for an assistant: each is read as its role's own kind.
_KIND = {"input_text": "text", "text": "text", "output_text": "text",
         "input_audio": "audio", "audio": "audio", "output_audio": "audio"}
_CONTENT_TYPE = {("user", "text"): "input_text", ("user", "audio"): "input_audio",
                 ("system", "text"): "input_text",
                 ("assistant", "text"): "output_text", ("assistant", "audio"): "output_audio"}


def random_id(prefix: str) -> str:
    """'item_' and 20 hex digits: unguessable, and within OpenAI's 32 characters for item ids."""
    return f"{prefix}_{secrets.token_hex(10)}"


@dataclass
class _Part:
    type: str  # GA content type: input_text, input_audio, output_text or output_audio
    text: str  # the text, or the transcript of audio (we keep no audio)

    def as_dict(self) -> dict:
        return {"type": self.type, "transcript" if self.type.endswith("audio") else "text": self.text}


@dataclass
class _Item:
    id: str
    role: str
    parts: list[_Part]
    status: str = "completed"
    audio_ms: float = 0.0  # reply audio sent so far (assistant items we generate)
    # (audio position when the text came, where it starts in parts[0].text), positions rising
    segments: list[tuple[float, int]] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"id": self.id, "object": "realtime.item", "type": "message", "status": self.status,
                "role": self.role, "content": [part.as_dict() for part in self.parts]}


@dataclass
class _Response:
    id: str
    item: _Item
    modality: str  # "audio" or "text", fixed when the response opens
    audio_format: AudioFormat


class RealtimeConversation:
    """Items and the response in progress. Methods return server events (dicts) in protocol order."""

    def __init__(self, settings: SessionSettings = SessionSettings(), *,
                 new_id: Callable[[str], str] = random_id, max_items: int = MAX_ITEMS) -> None:
        if max_items < 2:  # room for the reply in progress and one more
            raise ValueError("max_items must be at least 2")
        self.settings = settings  # the glue replaces it after each applied session.update
        self._new_id = new_id
        self._max_items = max_items
        self._items: dict[str, _Item] = {}  # in creation order, which decides what is dropped
        self._order: list[str] = []  # conversation order
        self._response: _Response | None = None
        self._pending_user_item: str | None = None  # named by speech_started, created on commit
        self._partial_sent = ""  # the user transcript sent so far as deltas
        self._speech_start_ms: int | None = None
        self._speech_end_ms: int | None = None

    def event(self, event_type: str, **fields: object) -> dict:
        """A server event with a fresh event_id; also for the glue's own (session.created, ...)."""
        return {"type": event_type, "event_id": self._new_id("event"), **fields}

    def error_event(self, exc: RealtimeProtocolError, *, error_type: str = "invalid_request_error") -> dict:
        return self.event("error", error={"type": error_type, "code": exc.code, "message": str(exc),
                                          "param": exc.param, "event_id": exc.event_id})

    # The user's side

    def speech_started(self, audio_start_ms: int) -> list[dict]:
        """If a response is in progress the caller barged in; the glue cancels it (response_done)."""
        if self._speech_start_ms is None:  # a turn may hold several stretches of speech
            self._speech_start_ms = int(audio_start_ms)
        return [self.event("input_audio_buffer.speech_started", audio_start_ms=int(audio_start_ms),
                           item_id=self._user_item_id())]

    def speech_stopped(self, audio_end_ms: int) -> list[dict]:
        self._speech_end_ms = int(audio_end_ms)
        return [self.event("input_audio_buffer.speech_stopped", audio_end_ms=int(audio_end_ms),
                           item_id=self._user_item_id())]

    def user_transcript_delta(self, text_so_far: str) -> list[dict]:
        """Sends what `text_so_far` adds to the text sent; a revised partial sends nothing (the
        completed event carries the final text)."""
        if len(text_so_far) <= len(self._partial_sent) or not text_so_far.startswith(self._partial_sent):
            return []
        delta, self._partial_sent = text_so_far[len(self._partial_sent):], text_so_far
        return [self.event("conversation.item.input_audio_transcription.delta", item_id=self._user_item_id(),
                           content_index=0, delta=delta)]

    def user_turn_committed(self, transcript: str) -> list[dict]:
        """The user's turn as an item. Without server VAD (a client commit) the item is named here."""
        item_id = self._user_item_id()
        start, end = self._speech_start_ms, self._speech_end_ms
        seconds = (end - start) / 1000 if start is not None and end is not None and end >= start else 0.0
        self._clear_user_turn()
        item = _Item(item_id, "user", [_Part("input_audio", transcript[:MAX_ITEM_TEXT_CHARS])])
        previous = self._insert(item, None)
        return [self.event("input_audio_buffer.committed", item_id=item_id, previous_item_id=previous),
                *self._item_added_and_done(item, previous),
                self.event("conversation.item.input_audio_transcription.completed", item_id=item_id,
                           content_index=0, transcript=transcript, usage={"type": "duration", "seconds": seconds})]

    def input_cleared(self) -> list[dict]:
        self._clear_user_turn()
        return [self.event("input_audio_buffer.cleared")]

    def _user_item_id(self) -> str:
        if self._pending_user_item is None:
            self._pending_user_item = self._new_id("item")
        return self._pending_user_item

    def _clear_user_turn(self) -> None:
        self._pending_user_item, self._partial_sent = None, ""
        self._speech_start_ms = self._speech_end_ms = None

    # Items the client creates, reads and deletes

    def create_item(self, event: rt.ConversationItemCreateEvent) -> list[dict]:
        """A message item as the client sent it (text only: audio needs its transcript). The glue
        then gives item_text / item_role to the LLM's context."""
        event_id, source = client_event_id(event), event.item

        def error(message: str, code: str, param: str) -> RealtimeProtocolError:
            return RealtimeProtocolError(message, code=code, param=param, event_id=event_id)

        if source.type != "message":
            raise error(f"{source.type} items are not supported: function calling is not supported yet",
                        "unsupported", "item.type")
        if source.role is None or not source.content:
            param = "item.role" if source.role is None else "item.content"
            raise error("a message item needs a role (user, system, assistant) and content", "invalid_value", param)
        parts = [_part(source.role, content, f"item.content.{i}", error) for i, content in enumerate(source.content)]
        if sum(len(part.text) for part in parts) > MAX_ITEM_TEXT_CHARS:
            raise error(f"item text is over {MAX_ITEM_TEXT_CHARS} characters; send less", "too_large", "item.content")
        item_id = source.id if "id" in source.model_fields_set else self._new_id("item")
        if not 0 < len(item_id) <= MAX_ITEM_ID_CHARS:
            raise error(f"item.id must have 1 to {MAX_ITEM_ID_CHARS} characters", "invalid_value", "item.id")
        if item_id in self._items or item_id == self._pending_user_item:
            raise error(f"an item {item_id!r} exists already; use another id", "duplicate_item_id", "item.id")
        after = event.previous_item_id
        if after not in (None, "root") and after not in self._items:
            raise error(f"no item {after[:MAX_ITEM_ID_CHARS]!r} to insert after", "item_not_found", "previous_item_id")
        item = _Item(item_id, source.role, parts)
        return self._item_added_and_done(item, self._insert(item, after))

    def delete_item(self, item_id: str, *, event_id: str | None = None) -> list[dict]:
        self._item(item_id, event_id)
        if self._response and self._response.item.id == item_id:
            raise RealtimeProtocolError("the item is the response in progress; cancel it first",
                                        code="invalid_value", param="item_id", event_id=event_id)
        del self._items[item_id]
        self._order.remove(item_id)
        return [self.event("conversation.item.deleted", item_id=item_id)]

    def retrieve_item(self, item_id: str, *, event_id: str | None = None) -> list[dict]:
        return [self.event("conversation.item.retrieved", item=self._item(item_id, event_id).as_dict())]

    def item_text(self, item_id: str) -> str:
        return "\n".join(part.text for part in self._item(item_id).parts)

    def item_role(self, item_id: str) -> str:
        return self._item(item_id).role

    def item_ids(self) -> list[str]:
        """In conversation order."""
        return list(self._order)

    def _item(self, item_id: str, event_id: str | None = None) -> _Item:
        item = self._items.get(item_id)
        if item is None:
            raise RealtimeProtocolError(f"no item {item_id[:MAX_ITEM_ID_CHARS]!r} in the conversation",
                                        code="item_not_found", param="item_id", event_id=event_id)
        return item

    def _insert(self, item: _Item, after: str | None) -> str | None:
        """Puts `item` after `after` ("root": first, None: last); returns the id before it."""
        index = len(self._order) if after is None else 0 if after == "root" else self._order.index(after) + 1
        previous = self._order[index - 1] if index else None
        self._order.insert(index, item.id)
        self._items[item.id] = item
        while len(self._items) > self._max_items:
            in_progress = self._response.item.id if self._response else None
            oldest = next(i for i in self._items if i != in_progress)
            del self._items[oldest]
            self._order.remove(oldest)
        return previous

    def _previous(self, item_id: str) -> str | None:
        index = self._order.index(item_id)
        return self._order[index - 1] if index else None

    def _item_added_and_done(self, item: _Item, previous: str | None) -> list[dict]:
        return [self.event("conversation.item.added", previous_item_id=previous, item=item.as_dict()),
                self.event("conversation.item.done", previous_item_id=previous, item=item.as_dict())]

    # The agent's side

    @property
    def response_in_progress(self) -> bool:
        return self._response is not None

    @property
    def current_response_item_id(self) -> str | None:
        return self._response.item.id if self._response else None

    def response_started(self, *, modality: Literal["audio", "text"] | None = None) -> list[dict]:
        """Opens a response with one assistant item; [] while one is open. `modality`: a
        response.create's own (realtime_protocol.response_modality); by default the session's."""
        if self._response:
            return []
        modality = modality or self.settings.output_modalities[0]
        part = _Part("output_audio" if modality == "audio" else "output_text", "")
        item = _Item(self._new_id("item"), "assistant", [part], status="in_progress")
        response = _Response(self._new_id("resp"), item, modality, self.settings.audio_format)
        previous = self._insert(item, None)
        self._response = response
        return [self.event("response.created", response=_response_dict(response, "in_progress")),
                self.event("response.output_item.added", response_id=response.id, output_index=0, item=item.as_dict()),
                self.event("conversation.item.added", previous_item_id=previous, item=item.as_dict()),
                self.event("response.content_part.added", **_part_ref(response), part=_content_part(response))]

    def response_audio(self, chunk_b64: str, duration_ms: float) -> list[dict]:
        """A chunk of reply audio (base64 in the output format). A text-only response drops it."""
        events = self.response_started()
        response = self._response
        if response.modality != "audio":
            return events
        response.item.audio_ms += max(0.0, duration_ms)
        return [*events, self.event("response.output_audio.delta", **_part_ref(response), delta=chunk_b64)]

    def response_text(self, text: str) -> list[dict]:
        """Text of the reply, spoken from where the audio has reached now (the truncation point)."""
        events = self.response_started()
        response = self._response
        if not text:
            return events
        item, part = response.item, response.item.parts[0]
        if len(part.text) < MAX_ITEM_TEXT_CHARS:
            if len(item.segments) < MAX_TEXT_SEGMENTS:
                item.segments.append((item.audio_ms, len(part.text)))
            part.text += text[:MAX_ITEM_TEXT_CHARS - len(part.text)]
        kind = ("response.output_audio_transcript.delta" if response.modality == "audio"
                else "response.output_text.delta")
        return [*events, self.event(kind, **_part_ref(response), delta=text)]

    def response_done(self, status: Literal["completed", "cancelled"], *,
                      reason: Literal["turn_detected", "client_cancelled"] | None = None) -> list[dict]:
        """Closes the open response (nothing if none). `reason` says why a cancelled one was."""
        response, self._response = self._response, None
        if response is None:
            return []
        item, ref = response.item, _part_ref(response)
        item.status = "completed" if status == "completed" else "incomplete"
        text = item.parts[0].text
        if response.modality == "audio":
            events = [self.event("response.output_audio.done", **ref),
                      self.event("response.output_audio_transcript.done", **ref, transcript=text)]
        else:
            events = [self.event("response.output_text.done", **ref, text=text)]
        return [*events,
                self.event("response.content_part.done", **ref, part=_content_part(response)),
                self.event("response.output_item.done", response_id=response.id, output_index=0, item=item.as_dict()),
                self.event("conversation.item.done", previous_item_id=self._previous(item.id), item=item.as_dict()),
                self.event("response.done", response=_response_dict(response, status, reason))]

    def truncate(self, item_id: str, content_index: int, audio_end_ms: int, *,
                 event_id: str | None = None) -> tuple[list[dict], str]:
        """Cuts an assistant audio item to what the client played; returns the text heard (text
        that came while the audio was before audio_end_ms), ending at a word's end."""
        item = self._item(item_id, event_id)

        def invalid(message: str, param: str) -> RealtimeProtocolError:
            return RealtimeProtocolError(message, code="invalid_value", param=param, event_id=event_id)

        if item.role != "assistant" or item.parts[0].type != "output_audio":
            raise invalid("only assistant audio items can be truncated", "item_id")
        if content_index != 0:
            raise invalid("an assistant audio item has one content part, index 0", "content_index")
        # Clients count played ms in whole numbers; a chunk's duration may have a fraction.
        if not 0 <= audio_end_ms <= math.ceil(item.audio_ms):
            raise invalid(f"audio_end_ms {audio_end_ms} is outside the item's {math.ceil(item.audio_ms)} ms "
                          f"of audio", "audio_end_ms")
        part = item.parts[0]
        part.text = _heard(part.text, item.segments, audio_end_ms)
        item.segments = [(at, start) for at, start in item.segments if at < audio_end_ms and start < len(part.text)]
        item.audio_ms = min(item.audio_ms, audio_end_ms)
        truncated = self.event("conversation.item.truncated", item_id=item_id, content_index=0,
                               audio_end_ms=audio_end_ms)
        return [truncated], part.text


def _part(role: str, content: rt.ItemContent, param: str, error) -> _Part:
    kind = _KIND.get(content.type)
    if kind is None:
        raise error(f"{content.type} content is not supported; send text", "unsupported", f"{param}.type")
    ga_type = _CONTENT_TYPE.get((role, kind))
    if ga_type is None:
        raise error("system messages take text only", "unsupported", f"{param}.type")
    text = content.text if kind == "text" else content.transcript
    if text is None and kind == "audio":
        raise error("audio content needs its transcript: audio in created items is not transcribed",
                    "unsupported", f"{param}.transcript")
    if text is None:
        raise error("text content needs its text", "invalid_value", f"{param}.text")
    return _Part(ga_type, text)


def _heard(text: str, segments: list[tuple[float, int]], audio_end_ms: int) -> str:
    """Text whose segments came before the audio reached audio_end_ms, less a word cut in two."""
    # Text with no recorded position (a created item's) counts as said at the start.
    cut = next((start for at, start in segments or [(0.0, 0)] if at >= audio_end_ms), len(text))
    if cut == len(text):
        return text
    heard = text[:cut]
    if heard and _in_word(heard[-1]) and _in_word(text[cut]):  # "Hel" heard, "lo" not: no word heard
        heard = _TRAILING_WORD.sub("", heard)
    return heard.rstrip()


def _in_word(char: str) -> bool:
    return char.isalnum() and ord(char) < _NO_SPACES_FROM


def _part_ref(response: _Response) -> dict:
    return {"response_id": response.id, "item_id": response.item.id, "output_index": 0, "content_index": 0}


def _content_part(response: _Response) -> dict:
    text = response.item.parts[0].text
    return {"type": "audio", "transcript": text} if response.modality == "audio" else {"type": "text", "text": text}


def _response_dict(response: _Response, status: str, reason: str | None = None) -> dict:
    done = status != "in_progress"
    details = None
    if status == "cancelled":
        details = {"type": "cancelled", **({"reason": reason} if reason else {})}
    result = {"object": "realtime.response", "id": response.id, "status": status, "status_details": details,
              "output": [response.item.as_dict()] if done else [], "output_modalities": [response.modality],
              "max_output_tokens": "inf", "usage": _zero_usage() if done else None}
    if response.modality == "audio":
        result["audio"] = {"output": {"format": format_object(response.audio_format)}}
    return result


def _zero_usage() -> dict:
    """We do not count tokens across our engines (yet); zeros, fresh each time."""
    return {"total_tokens": 0, "input_tokens": 0, "output_tokens": 0,
            "input_token_details": {"text_tokens": 0, "audio_tokens": 0, "cached_tokens": 0},
            "output_token_details": {"text_tokens": 0, "audio_tokens": 0}}
