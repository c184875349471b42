"""The speech adapter interface: what answers the caller, between a call's transport input and
output. An agent's `pipeline` setting picks the adapter; nothing else in a call changes.

The contract is pipecat's frame vocabulary:

  in   InputAudioRawFrame: the caller, at the pipeline's input rate (16 kHz)
  out  reply audio ........... TTSAudioRawFrame (any rate; the output transport converts)
       the caller's words .... InterimTranscriptionFrame (revisable), TranscriptionFrame (final)
       the reply's words ..... LLMTextFrame as written, TTSTextFrame as spoken
       turn events ........... VADUserStartedSpeakingFrame / VADUserStoppedSpeakingFrame,
                               CallerSpeechEndFrame (where the caller's speech ended: TTFS starts
                               there), LLMFullResponseStartFrame / LLMFullResponseEndFrame (a
                               response starts / is complete), InterruptionFrame (barge-in)

Cadence's own frames (CallerSpeechEndFrame and the rest) are all in pipelines/frames.py.

Everything around an adapter reads only that vocabulary: the transports, barge-in (pipecat's
interruptions), `TurnObserver` (per-turn stage times, TTFS, stored turns, metrics) and
`SpeechEventObserver` (the conversation as events, e.g. for /v1/realtime clients, including
where in the reply audio an interruption came).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.frame_processor import FrameProcessor

from models.base import ASREngine, EmbeddingEngine, LLMEngine, TTSEngine, TurnEndEngine


@dataclass(frozen=True)
class Engines:
    asr: ASREngine
    llm: LLMEngine
    tts: TTSEngine
    embedder: EmbeddingEngine | None = None  # agents' knowledge search; None: no retrieval
    turn_end: TurnEndEngine | None = None  # the voice's end-of-turn judge; None: words alone

    def all(self) -> tuple:
        return tuple(e for e in (self.asr, self.llm, self.tts, self.embedder, self.turn_end) if e is not None)


@dataclass(frozen=True)
class SpeechStages:
    """One call's adapter, built: the processors before the transport's output, those after
    it (they see only what was sent: the assistant's side of the context), and the context."""

    before_output: tuple[FrameProcessor, ...]
    after_output: tuple[FrameProcessor, ...]
    context: LLMContext
