"""The engine contracts: one small async interface per kind of model.

Pipeline processors talk only to these, so an engine can be an in-process model on
the CPU today and a batched worker on its own MIG slice tomorrow without the pipeline
changing. Engines load in `load()` (never at import) and release in `close()`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy stays out of this module's imports, so the contracts load light
    import numpy as np

ChatMessage = dict[str, Any]  # OpenAI-style {"role": ..., "content": ...}


@dataclass(frozen=True)
class Transcript:
    text: str
    audio_seconds: float  # duration of the audio that was transcribed
    compute_seconds: float  # wall time the engine spent on it
    language: str | None = None
    # Mean probability that the audio held no speech; high values flag hallucinated text.
    no_speech_probability: float | None = None


class Engine(ABC):
    """Lifecycle and load shared by all engines.

    `queue_depth` and `batch_size` are what the dashboard and /metrics show per engine; an
    engine that serves one request at a time reports a batch of 1 while it runs.
    """

    @property
    def queue_depth(self) -> int:
        """Requests admitted and not yet finished (waiting + running)."""
        return 0

    @property
    def batch_size(self) -> int | None:
        """Requests in the batch that ran last; None until one has run, or when unknown."""
        return None

    def health(self) -> dict[str, Any]:
        """What an operator's health page shows of this engine. Read on the event loop, so it
        must be cheap and never block; a client of workers adds its replicas' states."""
        return {"queue_depth": self.queue_depth, "batch_size": self.batch_size}

    @abstractmethod
    def load(self) -> None:
        """Loads weights. Blocking; call from a thread or at startup before serving."""

    def warm_up(self) -> None:
        """Runs one tiny inference so the first caller does not pay for lazy init."""

    async def close(self) -> None:
        """Releases threads and memory. Idempotent."""


class ASREngine(Engine):
    sample_rate: int = 16_000  # input is 16-bit mono PCM at this rate

    @abstractmethod
    async def transcribe(self, pcm16: bytes, *, prompt: str | None = None) -> Transcript:
        """Transcribes one utterance. `prompt` is earlier text that conditions the decoder."""

    async def transcribe_continuing(self, pcm16: bytes, *, committed: str, prompt: str | None = None) -> Transcript:
        """The utterance so far, whose transcript is known to begin with `committed` (words
        a streaming pass already settled). The transcript returned is the whole of it;
        an engine that can force the decoder to start with `committed` (Whisper's prefix)
        decodes only what follows. This default decodes everything and puts the settled
        words first where the new text does not begin with them."""
        transcript = await self.transcribe(pcm16, prompt=prompt)
        if not committed or transcript.text.lower().startswith(committed.lower()):
            return transcript
        settled = len(committed.split())
        words = transcript.text.split()
        return replace(transcript, text=" ".join(committed.split() + words[settled:]))


class TurnEndEngine(Engine):
    """Judges from the sound of the caller's voice whether they finished their turn."""

    sample_rate: int = 16_000  # input is 16-bit mono PCM at this rate

    @abstractmethod
    async def probability_complete(self, pcm16: bytes) -> float:
        """How likely (0..1) it is that the turn whose audio ends here is complete."""


@dataclass(frozen=True)
class Sampling:
    """Per-request sampling; each agent brings its own. None leaves the engine's default."""

    temperature: float | None = None
    top_p: float | None = None
    repeat_penalty: float | None = None  # >1 discourages the loops small models fall into

    def over(self, default: Sampling) -> Sampling:
        """These settings, with `default`'s where these leave one unset."""
        return Sampling(
            temperature=default.temperature if self.temperature is None else self.temperature,
            top_p=default.top_p if self.top_p is None else self.top_p,
            repeat_penalty=default.repeat_penalty if self.repeat_penalty is None else self.repeat_penalty,
        )


# What LLMEngine.stream_chat yields for a report of progress through the prompt: no text.
PROMPT_PROGRESS = ""


class LLMEngine(Engine):
    # The tokens one conversation's prompt and reply may hold together at this engine (its
    # context per stream); None where the engine does not say. Prompts are sized to it.
    context_tokens: int | None = None
    # True where stream_chat also yields PROMPT_PROGRESS while the engine reads the prompt, when
    # it starts and after each batch (llama-server's prompt progress): a sign the model is
    # working, carrying no text. A deadline on the first piece then restarts at each report
    # instead of growing with the prompt's length by a guess at the hardware's speed.
    reports_prompt_progress: bool = False

    @abstractmethod
    def stream_chat(self, messages: Sequence[ChatMessage], *, max_tokens: int,
                    sampling: Sampling | None = None) -> AsyncIterator[str]:
        """Streams reply text pieces (PROMPT_PROGRESS where reports_prompt_progress).
        Closing the iterator early stops generation."""

    async def warm_prefix(self, messages: Sequence[ChatMessage], *,
                          on_progress: Callable[[], None] | None = None) -> None:
        """Hint: the next prompt will start with `messages`; an engine with a prefix cache may
        evaluate them now, while the caller is listening, instead of during the next turn. Where
        reports_prompt_progress, `on_progress()` is called at each report while it reads them."""


class TTSEngine(Engine):
    sample_rate: int  # output is 16-bit mono PCM at this rate

    @abstractmethod
    def synthesize(self, text: str) -> AsyncIterator[bytes]:
        """Streams PCM chunks for `text`. Closing the iterator early stops synthesis."""


class EmbeddingEngine(Engine):
    dimensions: int  # length of each vector

    @abstractmethod
    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 array (len(texts), dimensions), each row L2-normalised, so a dot product is the cosine similarity."""

    @abstractmethod
    def embed_blocking(self, texts: Sequence[str]) -> np.ndarray:
        """The same, on the caller's thread (ingestion workers, benchmarks)."""
