"""Transcripts with a second recognizer behind the first: a turn whose ASR worker has died
(refused the connection, lost it mid-request, answered that it is restarting) is transcribed
by the in-process Whisper instead, so the caller gets an answer rather than "Sorry, I didn't
catch that", at once rather than after the worker's restart (2.6-4.6 s on this machine). A
worker that refuses a request as full (503) is passed over the same way: the overflow is
transcribed here, up to the in-process engine's own bounded queue, rather than apologised for.

Only a failure moves a transcript over: a worker that is slow is left to the turn's deadline
(deadlines.asr_*), since a healthy worker under load can be slow, and moving every slow
transcript onto the agent server's CPU would take that CPU from every call. A stuck worker
(stopped, wedged) is a failure once it is found out: the client probes a worker that has not
answered within half a second, and one whose health probe goes unanswered too fails the
request (models/remote.py), so its transcript is made here ~1.5 s into the turn instead of
an apology at the deadline.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from models.base import ASREngine, Transcript
from models.fallback import WithFallback

log = logging.getLogger(__name__)


class FallbackASREngine(WithFallback[ASREngine], ASREngine):
    async def transcribe(self, pcm16: bytes, *, prompt: str | None = None) -> Transcript:
        return await self._either(lambda engine: engine.transcribe(pcm16, prompt=prompt))

    async def transcribe_continuing(self, pcm16: bytes, *, committed: str, prompt: str | None = None) -> Transcript:
        return await self._either(
            lambda engine: engine.transcribe_continuing(pcm16, committed=committed, prompt=prompt))

    async def _either(self, ask: Callable[[ASREngine], Awaitable[Transcript]]) -> Transcript:
        try:
            return await ask(self._primary)
        except Exception as exc:  # whatever failed it; a cancellation (barge-in, hang-up) is not caught
            self.fallbacks += 1
            log.warning("ASR worker failed (%s: %s); this transcript falls back to the in-process Whisper",
                        exc.__class__.__name__, exc)
        return await ask(self._fallback)
