"""The caller's turn ends on the VAD's silence; the reply starts at the pause before it.

`SpeechTimeoutUserTurnStopStrategy` (no extra wait) ends the turn when the VAD has heard
its pause and the final transcript is in. This adds pipecat's eager end of turn to it:
when the caller pauses, the STT pushes its transcript so far as an
`EagerTranscriptionFrame`, and the reply is generated from it at once against a
provisional context. The LLM service holds that reply (pipecat's `SpeculationGate`) until
the turn ends. If the final transcript says the same words, the held reply is released
and no second inference runs; if not, or if the caller goes on (the STT then pushes
`EagerEndOfTurnCancelFrame`), it is dropped and the turn is answered as usual. The context
only ever records the final transcript.

Pipecat's own `EagerUserTurnStopStrategy` expects an STT service that decides turns
itself; here the VAD decides (with the pause the turn-end policy chose), so the same
protocol rides on the speech-timeout strategy instead.
"""

from __future__ import annotations

import asyncio
import logging

from pipecat.frames.frames import EagerEndOfTurnCancelFrame, EagerTranscriptionFrame, Frame
from pipecat.turns.types import ProcessFrameResult, UserTurnSpeculation
from pipecat.turns.user_stop.eager_match_policy import EagerMatchPolicy, NormalizedMatch
from pipecat.turns.user_stop.speech_timeout_user_turn_stop_strategy import SpeechTimeoutUserTurnStopStrategy

log = logging.getLogger(__name__)

# A speculation the turn has not settled after this long is withdrawn: a lost turn signal
# must not leave the reply held and the agent silent.
SPECULATION_TIMEOUT_S = 10.0


class EagerSpeechTimeoutStopStrategy(SpeechTimeoutUserTurnStopStrategy):
    def __init__(self, *, match_policy: EagerMatchPolicy | None = None,
                 speculation_timeout_s: float = SPECULATION_TIMEOUT_S,
                 on_outcome=lambda outcome: None, **kwargs) -> None:
        """`on_outcome(outcome)`: told how each speculation ended: "confirmed", "missed"
        (the final words differ), "withdrawn" (the caller went on) or "expired"."""
        super().__init__(user_speech_timeout=0.0, **kwargs)
        self._match_policy = match_policy or NormalizedMatch()
        self._speculation_timeout_s = speculation_timeout_s
        self._speculation: UserTurnSpeculation | None = None
        self._expiry: asyncio.Task | None = None
        self._on_outcome = on_outcome

    async def process_frame(self, frame: Frame) -> ProcessFrameResult:
        if isinstance(frame, EagerTranscriptionFrame):
            await self._speculate(frame.text)
        elif isinstance(frame, EagerEndOfTurnCancelFrame):
            # The STT's frame reaches the LLM on its own and drops the reply there.
            if await self._take_speculation() is not None:
                self._on_outcome("withdrawn")
        return await super().process_frame(frame)

    async def trigger_user_turn_stopped(self, *, enable_user_speaking_frames: bool | None = None) -> None:
        speculation = await self._take_speculation()
        if speculation is not None and self._match_policy.matches(speculation.text, self._text):
            self._on_outcome("confirmed")
            # The reply is already generated: only end the turn. Its UserStoppedSpeakingFrame
            # releases the held reply, and the flag keeps a second inference from running.
            await self.trigger_user_turn_finalized(enable_user_speaking_frames=enable_user_speaking_frames,
                                                   confirms_speculation=True)
            return
        if speculation is not None:
            self._on_outcome("missed")
            await self.trigger_user_turn_speculation_cancelled()
        await super().trigger_user_turn_stopped(enable_user_speaking_frames=enable_user_speaking_frames)

    async def handle_user_turn_started(self) -> None:
        await self._withdraw_unsettled()
        await super().handle_user_turn_started()

    async def handle_user_turn_stopped(self) -> None:
        # Ended some other way (the stop watchdog, an interruption): nothing else withdraws it.
        await self._withdraw_unsettled()
        await super().handle_user_turn_stopped()

    async def cleanup(self) -> None:
        await self._take_speculation()
        await super().cleanup()

    async def _speculate(self, text: str) -> None:
        if not text.strip():
            return
        if await self._take_speculation() is not None:  # a newer guess replaces an older one
            self._on_outcome("withdrawn")
            await self.trigger_user_turn_speculation_cancelled()
        speculation = UserTurnSpeculation(text=(self._text + " " + text).strip())
        self._speculation = speculation
        self._expiry = self.task_manager.create_task(self._expire(speculation), f"{self}::speculation-expiry")
        await self.trigger_user_turn_inference_triggered(speculation=speculation)

    async def _expire(self, speculation: UserTurnSpeculation) -> None:
        await asyncio.sleep(self._speculation_timeout_s)
        self._expiry = None  # this task is ending; nothing to cancel
        if self._speculation is speculation:
            self._speculation = None
            log.warning("eager reply unsettled after %.0f s; dropped", self._speculation_timeout_s)
            self._on_outcome("expired")
            await self.trigger_user_turn_speculation_cancelled()

    async def _withdraw_unsettled(self) -> None:
        if await self._take_speculation() is not None:
            self._on_outcome("withdrawn")
            await self.trigger_user_turn_speculation_cancelled()

    async def _take_speculation(self) -> UserTurnSpeculation | None:
        speculation, self._speculation = self._speculation, None
        if self._expiry is not None:
            expiry, self._expiry = self._expiry, None
            await self.task_manager.cancel_task(expiry)
        return speculation
