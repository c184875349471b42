"""Cadence's own frames: what the stages of one turn tell each other beyond pipecat's vocabulary.

One turn in frames (the cascade, pipelines/cascade.py; pipecat's frames in plain words):

    caller audio -> STT: at a pause .............. SpeculativeTranscriptFrame (a guess)
                         at the turn's end ........ CallerSpeechEndFrame, then the transcript:
                                                   TranscriptionFrame, or TurnPartTranscriptionFrame
                                                   for each cut of a long turn before it, or
                                                   TranscriptLostFrame (and an apology to speak)
    -> user aggregator (the turn's context) -> retrieval: for the guess . PrefetchedPassagesFrame
                                                          at the turn's end TurnContextFrame
    -> LLM (reply text) -> TTS: per sentence ............... TTSSentenceTimingFrame
    -> the transport's output

System frames jump the queue: a mark of time (where speech ended, how long a sentence took)
must not wait behind the audio it describes, and an interruption does not discard it.
`TurnObserver` (pipelines/turn_observer.py) reads most of them to time and store each turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipecat.frames.frames import LLMContextFrame, SystemFrame, TranscriptionFrame
from pipecat.processors.aggregators.llm_context import LLMContext

from pipelines.knowledge_context import Passage


@dataclass
class CallerSpeechEndFrame(SystemFrame):
    """The caller's turn ended; `last_voiced_at` is the wall-clock time of its last voiced audio.

    Made by the STT (`EngineSTTService`, measured on the turn's audio) when the VAD says the
    caller stopped, or, for adapters without our STT, by `SpeechEndMarker` from the VAD's own
    estimate (pipelines/openai_realtime.py). Read by `TurnObserver`: the turn's TTFS starts here."""

    last_voiced_at: float = 0.0


@dataclass
class SpeculativeTranscriptFrame(SystemFrame):
    """A plausible transcript of the caller's turn so far, taken at a pause; the turn may go on.

    Made by the STT when its speculative pass finishes. Read (and consumed) by
    `RetrievalProcessor`, which starts the search for it so passages are ready when the turn ends."""

    text: str = ""


@dataclass
class TranscriptLostFrame(SystemFrame):
    """The turn's words could not be transcribed (the ASR failed or stalled): the turn ends
    here, and the STT's NOT_HEARD_REPLY, pushed next, is its reply.

    Made by the STT. Read by `TurnObserver`, which closes the turn as lost."""

    error: str = ""


class TurnPartTranscriptionFrame(TranscriptionFrame):
    """The transcript of part of a turn too long for one window, cut while the caller went on:
    the turn's own transcript (the last part) follows.

    Made by the STT at each cut of a long turn. Read by the user aggregator, which aggregates
    it as any transcript, and by `TurnObserver`, which keeps the parts with the turn."""


@dataclass
class TurnContextFrame(LLMContextFrame):
    """The turn's context with the passages retrieved for it (used for this request only).

    Made by `RetrievalProcessor` from the user aggregator's `LLMContextFrame`. Read by the LLM
    service (`EngineLLMService`), which fences the passages into this one request, and by
    `TurnObserver` (the turn's retrieval stage)."""

    passages: list[Passage] = field(default_factory=list)
    retrieval_missed: bool = False  # the search failed or ran out of time; no passages
    # (`speculation`, inherited: an eager reply to a turn not yet over; the LLM holds it.)


@dataclass
class PrefetchedPassagesFrame(SystemFrame):
    """Passages found for a speculative transcript, while the VAD still waits out the pause.

    Made by `RetrievalProcessor` when such a search returns passages (retrieval.warm_llm_on_guess).
    Read (and consumed) by the LLM service (`EngineLLMService`), which has its engine read the
    prompt up to them (`context`'s dialogue, then the passages) so the turn's prefill is short. A
    system frame: it reaches the LLM at once, even while the LLM is still speaking a reply."""

    passages: list[Passage] = field(default_factory=list)
    context: LLMContext | None = None  # the call's context, as the LLM will be asked it


@dataclass
class TTSSentenceTimingFrame(SystemFrame):
    """One sentence's synthesis latency (request to first audio out of the engine).

    Made by the TTS service (`EngineTTSService`) for every sentence: pipecat's own TTFB metric
    covers only a reply's first. Read by `TurnObserver`."""

    text: str = ""
    ttfb_seconds: float = 0.0
