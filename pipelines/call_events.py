"""What one call tells its owner beside the frame flow: the events the server counts in its
metrics, shows on the call's page and stores.

The owner (agent/calls.py) subclasses `CallEvents` and overrides the events it wants; every
method here does nothing. The stages call them on the event loop, as the event happens: they
must return at once (count, note, hand a write to a task).
"""

from __future__ import annotations

from pipelines.turn_end import PauseVerdict
from pipelines.turn_timeline import Turn


class CallEvents:
    def turn_closed(self, turn: Turn) -> None:
        """A turn is over, its stage times and words complete (`TurnObserver`)."""

    def caller_audio(self, seconds: float) -> None:
        """A frame of the caller's audio, `seconds` long, reached the pipeline (`CallerAudioMeter`)."""

    def partial(self, text: str) -> None:
        """The caller's words so far in the turn under way (streaming partials, or the guess
        made at a pause while partials are on)."""

    def asr_rejected(self, reason: str) -> None:
        """A transcript failed the plausibility check and was dropped (`transcript_check.rejection`'s label)."""

    def long_turn_cut(self, seconds: float) -> None:
        """A turn over the ASR's window was cut while the caller went on; `seconds`: the part cut off."""

    def pause_verdict(self, verdict: PauseVerdict) -> None:
        """The pause judge set how long this pause of the caller may be."""

    def eager_reply(self, outcome: str) -> None:
        """What became of a reply started at a pause (pipelines/eager_turn.py's outcome labels)."""

    def retrieval_missed(self, reason: str) -> None:
        """A turn was answered without passages (reason: timeout or error)."""

    def redacted(self, count: int) -> None:
        """`count` pieces of a reply were withheld by the prompt-leak guard."""

    def model_failed(self, model: str, kind: str) -> None:
        """A model failed a turn (model: asr, llm or tts; kind: stalled or error): the caller
        heard an apology, or (tts) a sentence was skipped."""
