"""One /v1/realtime session: client events into the call's pipeline, server events out.

Client events arrive on the transport's receive task (`on_client_message`, through the
serializer) and are handled in arrival order, each to its end before the next: a
`response.create` that follows a `commit` finds the committed words in the context.
Conversation events arrive from the pipeline (`SpeechEventSink`). Both write server events to
one bounded queue, sent by `write_events`; a client that stops reading fills it, and the call
ends rather than holding an ever-growing backlog.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
from collections.abc import Callable

from fastapi import WebSocket
from pipecat.frames.frames import (
    Frame,
    InputAudioRawFrame,
    LLMConfigureOutputFrame,
    LLMMessagesAppendFrame,
    LLMRunFrame,
)
from pipecat.processors.frame_processor import FrameProcessor
from pipecat.services.openai.realtime import events as rt
from starlette.websockets import WebSocketDisconnect

from agent.calls import ActiveCall
from agent.errors import CadenceError
from agent.transports.audio_pace import AudioPace
from agent.transports.realtime_audio import InboundAudio, OutboundAudio
from agent.transports.realtime_conversation import RealtimeConversation
from agent.transports.realtime_protocol import (
    RealtimeProtocolError, apply_session_update, audio_duration_ms, client_event_id, parse_client_event,
    response_modality, session_object)
from models.base import ASREngine
from pipelines import assistant_context

log = logging.getLogger(__name__)

# Server events waiting for a slow client: ~40 s of reply audio at 25 deltas a second. A client
# that falls this far behind is not reading; the call ends (policy: refuse to buffer more).
MAX_QUEUED_EVENTS = 1024
MAX_PENDING_CUTS = 8  # truncations whose reply has not reached the context yet; older are dropped
# A commit needs some audio: OpenAI refuses less than 100 ms, which Whisper cannot read anyway.
MIN_COMMIT_MS = 100


class RealtimeSession:
    def __init__(self, call: ActiveCall, *, asr: ASREngine, model: str, max_buffer_seconds: float,
                 vad_start_secs: float, pace: AudioPace, on_bad_event: Callable[[CadenceError], None],
                 on_stalled: Callable[[], None], on_truncated: Callable[[object], None]) -> None:
        self.conversation = RealtimeConversation()
        self._call = call
        self._asr = asr
        self._model = model
        self._max_buffer_bytes = int(max_buffer_seconds * 16_000 * 2)  # manual mode keeps 16 kHz PCM16
        self._vad_start_ms = vad_start_secs * 1000.0
        self._pace = pace  # server VAD: audio goes straight into the pipeline, as fast as it comes
        self._on_bad_event = on_bad_event
        self._on_stalled = on_stalled
        self._on_truncated = on_truncated  # a stored turn's reply was cut to what was heard
        self._outbound: asyncio.Queue[dict | None] = asyncio.Queue(MAX_QUEUED_EVENTS)
        self._stalled = False
        self._input: FrameProcessor | None = None
        self._input_rate = 16_000  # the pipeline's input rate, from its StartFrame
        self._input_ms = 0.0  # caller audio received so far
        self._manual_audio = bytearray()  # caller audio since the last commit, when server VAD is off
        self._inbound = InboundAudio(pipeline_rate=16_000)
        self._outbound_audio = OutboundAudio()
        self._response_modality = "audio"
        self._skip_tts = False  # what the LLM was last told
        self._cancel_reason = "turn_detected"  # why the response in progress ends early, if it does
        # Cuts to what the caller heard, waiting for their reply to reach the context (a reply
        # cut while it plays is written there only once the interruption reaches the end).
        self._pending_cuts: list[tuple[str, str]] = []

    # --- wiring -----------------------------------------------------------------------------------

    def attach(self, input_transport: FrameProcessor) -> None:
        """Frames the session makes (context changes, a cancel) enter the pipeline here."""
        self._input = input_transport

    def set_input_sample_rate(self, rate: int) -> None:
        self._input_rate = rate
        self._inbound = InboundAudio(pipeline_rate=rate)

    def opened(self) -> None:
        self._send([self.conversation.event("session.created", session=self._session_object())])

    def close(self) -> None:
        try:
            self._outbound.put_nowait(None)
        except asyncio.QueueFull:
            pass  # the writer is cancelled anyway

    async def write_events(self, websocket: WebSocket) -> None:
        """The one writer of this socket. Ends at close() or when the client goes away."""
        while (event := await self._outbound.get()) is not None:
            try:
                await websocket.send_text(json.dumps(event))
            except (WebSocketDisconnect, RuntimeError):
                return  # the client left; the transport ends the call

    def _send(self, events: list[dict]) -> None:
        for event in events:
            try:
                self._outbound.put_nowait(event)
            except asyncio.QueueFull:
                if not self._stalled:
                    self._stalled = True
                    log.warning("call %s: client not reading; %d events queued", self._call.id, MAX_QUEUED_EVENTS)
                    self._on_stalled()
                return

    def _session_object(self) -> dict:
        return session_object(self.conversation.settings, session_id=f"sess_{self._call.id}", model=self._model)

    # --- client events ----------------------------------------------------------------------------

    async def on_client_message(self, data: str | bytes) -> Frame | None:
        """One client event; a frame for the pipeline (caller audio), or None."""
        try:
            event = parse_client_event(data)
            return await self._handle(event)
        except RealtimeProtocolError as exc:
            self._on_bad_event(exc)
            self._send([self.conversation.error_event(exc)])
            return None
        except Exception:  # noqa: BLE001 - our bug, not the client's: said and logged, the session goes on
            # Raised from here it would end the transport's receive loop: a deaf call, ended as a hang-up.
            log.exception("call %s: a client event failed", self._call.id)
            self._send([self.conversation.error_event(RealtimeProtocolError(
                "the server failed to handle this event", code="server_error"), error_type="server_error")])
            return None

    async def _handle(self, event) -> Frame | None:
        if isinstance(event, rt.InputAudioBufferAppendEvent):
            return await self._append(event)
        if isinstance(event, rt.SessionUpdateEvent):
            await self._update_session(event)
        elif isinstance(event, rt.InputAudioBufferCommitEvent):
            await self._commit(event)
        elif isinstance(event, rt.InputAudioBufferClearEvent):
            self._manual_audio.clear()
            self._send(self.conversation.input_cleared())
        elif isinstance(event, rt.ConversationItemCreateEvent):
            await self._create_item(event)
        elif isinstance(event, rt.ConversationItemTruncateEvent):
            await self._truncate(event)
        elif isinstance(event, rt.ConversationItemDeleteEvent):
            self._delete_item(event)
        elif isinstance(event, rt.ConversationItemRetrieveEvent):
            self._send(self.conversation.retrieve_item(event.item_id, event_id=client_event_id(event)))
        elif isinstance(event, rt.ResponseCreateEvent):
            await self._create_response(event)
        elif isinstance(event, rt.ResponseCancelEvent):
            await self._cancel_response(event)
        return None

    async def _update_session(self, event: rt.SessionUpdateEvent) -> None:
        before = self.conversation.settings
        settings = apply_session_update(before, event)
        self.conversation.settings = settings
        if settings.instructions != before.instructions:
            assistant_context.set_extra_instructions(self._context(), self._call.agent.system_prompt,
                                                     settings.instructions)
        await self._tell_llm(skip_tts=settings.output_modalities == ("text",))
        self._send([self.conversation.event("session.updated", session=self._session_object())])

    async def _append(self, event: rt.InputAudioBufferAppendEvent) -> Frame | None:
        audio_format = self.conversation.settings.audio_format
        try:
            audio = base64.b64decode(event.audio, validate=True)
        except (binascii.Error, ValueError):
            raise RealtimeProtocolError("audio is not valid base64", code="invalid_value", param="audio",
                                        event_id=client_event_id(event)) from None
        if audio_format == "pcm16" and len(audio) % 2:
            raise RealtimeProtocolError("audio/pcm must be whole 16-bit samples (an even number of bytes)",
                                        code="invalid_value", param="audio", event_id=client_event_id(event))
        duration_ms = audio_duration_ms(len(audio), audio_format)
        if self.conversation.settings.server_vad and not self._pace.admit(duration_ms / 1000):
            raise RealtimeProtocolError(f"audio is arriving faster than it is spoken (over {self._pace.max_ahead_s:g} s "
                                        "ahead of real time); this append was dropped", code="rate_limited",
                                        param="audio", event_id=client_event_id(event))
        self._input_ms += duration_ms
        pcm = self._inbound.convert(audio, audio_format)
        if not pcm:
            return None
        if self.conversation.settings.server_vad:
            return InputAudioRawFrame(audio=pcm, sample_rate=self._input_rate, num_channels=1)
        if len(self._manual_audio) + len(pcm) > self._max_buffer_bytes:
            raise RealtimeProtocolError(
                f"the input audio buffer holds at most {self._max_buffer_bytes // 32_000} s; commit it first",
                code="too_large", param="audio", event_id=client_event_id(event))
        self._manual_audio += pcm
        return None

    async def _commit(self, event: rt.InputAudioBufferCommitEvent) -> None:
        if self.conversation.settings.server_vad:
            raise RealtimeProtocolError("with server VAD on, the server commits the audio; set "
                                        "audio.input.turn_detection to null to commit yourself",
                                        code="unsupported", event_id=client_event_id(event))
        if len(self._manual_audio) < MIN_COMMIT_MS * self._input_rate * 2 // 1000:
            raise RealtimeProtocolError(f"the input audio buffer has less than {MIN_COMMIT_MS} ms of audio",
                                        code="input_audio_buffer_commit_empty", event_id=client_event_id(event))
        audio, self._manual_audio = bytes(self._manual_audio), bytearray()
        # Awaited here, not in a task: the next client event (often response.create) must see
        # the words in the context.
        transcript = (await self._asr.transcribe(audio)).text.strip()
        self._send(self.conversation.user_turn_committed(transcript))
        await self._push(LLMMessagesAppendFrame(messages=[{"role": "user", "content": transcript}], run_llm=False))

    async def _create_item(self, event: rt.ConversationItemCreateEvent) -> None:
        events = self.conversation.create_item(event)
        item_id = events[0]["item"]["id"]
        message = {"role": self.conversation.item_role(item_id), "content": self.conversation.item_text(item_id)}
        await self._push(LLMMessagesAppendFrame(messages=[message], run_llm=False))
        self._send(events)

    def _delete_item(self, event: rt.ConversationItemDeleteEvent) -> None:
        role, text = self.conversation.item_role(event.item_id), self.conversation.item_text(event.item_id)
        self._send(self.conversation.delete_item(event.item_id, event_id=client_event_id(event)))
        assistant_context.remove_message(self._context(), role, text)

    async def _truncate(self, event: rt.ConversationItemTruncateEvent) -> None:
        if self.conversation.current_response_item_id == event.item_id:
            self._cancel_reason = "client_cancelled"
            await self._interrupt()  # what plays now is cut; response.done (cancelled) follows
        before = self.conversation.item_text(event.item_id)
        events, heard = self.conversation.truncate(event.item_id, event.content_index, event.audio_end_ms,
                                                   event_id=client_event_id(event))
        self._send(events)
        self._pending_cuts = [*self._pending_cuts[-(MAX_PENDING_CUTS - 1):], (before, heard)]
        self._apply_cuts()

    def _apply_cuts(self) -> None:
        """Cuts each waiting reply, in the context and in the stored turn, once it is there."""
        timeline = self._call.voice.observer.timeline if self._call.voice else None
        waiting = []
        for said, heard in self._pending_cuts:
            turn = timeline.turn_with_reply(said) if timeline else None
            if turn is not None:
                turn.reply_text = heard
                self._on_truncated(turn)
            if not assistant_context.cut_reply(self._context(), said, heard):
                waiting.append((said, heard))
        self._pending_cuts = waiting

    async def _create_response(self, event: rt.ResponseCreateEvent) -> None:
        if self.conversation.response_in_progress:
            raise RealtimeProtocolError("a response is in progress; cancel it or wait for response.done",
                                        code="conversation_already_has_active_response",
                                        event_id=client_event_id(event))
        self._response_modality = response_modality(event, self.conversation.settings)
        await self._tell_llm(skip_tts=self._response_modality == "text")
        await self._push(LLMRunFrame())

    async def _cancel_response(self, event: rt.ResponseCancelEvent) -> None:
        if not self.conversation.response_in_progress:
            raise RealtimeProtocolError("no response is in progress", code="response_cancel_not_active",
                                        event_id=client_event_id(event))
        self._cancel_reason = "client_cancelled"
        await self._interrupt()

    async def _interrupt(self) -> None:
        if self._input is not None:
            await self._input.broadcast_interruption()

    async def _tell_llm(self, *, skip_tts: bool) -> None:
        if skip_tts != self._skip_tts:
            self._skip_tts = skip_tts
            await self._push(LLMConfigureOutputFrame(skip_tts=skip_tts))

    async def _push(self, frame: Frame) -> None:
        if self._input is not None:
            await self._input.push_frame(frame)

    def _context(self):
        return self._call.voice.context if self._call.voice is not None else None

    # --- the conversation, from the pipeline (SpeechEventSink) -----------------------------------

    async def speech_started(self) -> None:
        self._send(self.conversation.speech_started(int(max(0.0, self._input_ms - self._vad_start_ms))))

    async def speech_stopped(self) -> None:
        self._send(self.conversation.speech_stopped(int(self._input_ms)))

    async def user_transcript(self, text: str, *, final: bool) -> None:
        self._send(self.conversation.user_turn_committed(text) if final
                   else self.conversation.user_transcript_delta(text))

    async def reply_started(self) -> None:
        modality, self._response_modality = self._response_modality, self.conversation.settings.output_modalities[0]
        self._send(self.conversation.response_started(modality=modality))

    async def reply_text_generated(self, text: str) -> None:
        if self._skip_tts:  # text responses: the words as written; audio ones send them as spoken
            self._send(self.conversation.response_text(text))

    async def reply_audio(self, pcm16: bytes, sample_rate: int) -> None:
        if self._skip_tts:
            return
        self._send_audio(self._outbound_audio.convert(pcm16, sample_rate, self.conversation.settings.audio_format))

    def _send_audio(self, audio: bytes) -> None:
        if audio:
            self._send(self.conversation.response_audio(
                base64.b64encode(audio).decode("ascii"),
                audio_duration_ms(len(audio), self.conversation.settings.audio_format)))

    async def reply_text_spoken(self, text: str) -> None:
        if not self._skip_tts:
            self._send(self.conversation.response_text(text))

    async def reply_finished(self, *, interrupted: bool, audio_ms: float) -> None:
        reason, self._cancel_reason = self._cancel_reason, "turn_detected"
        rest = self._outbound_audio.flush()
        if not interrupted and not self._skip_tts:
            self._send_audio(rest)
        self._send(self.conversation.response_done("cancelled" if interrupted else "completed",
                                                   reason=reason if interrupted else None))
        # A response.create may have asked for the other modality; the next reply has the session's.
        await self._tell_llm(skip_tts=self.conversation.settings.output_modalities == ("text",))

    async def reply_stored(self) -> None:
        if self._pending_cuts:
            self._apply_cuts()
