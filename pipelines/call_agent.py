"""The agent as one call runs it: every setting concrete (the server's defaults filled in).

Defined here, beside the pipeline that reads it, and built by `agent.agents.resolve`.
Frozen: a change to the agent's definition, or its deletion, never reaches a call that
already started.
"""

from __future__ import annotations

from dataclasses import dataclass

from models.base import Sampling


@dataclass(frozen=True)
class RetrievalSettings:
    enabled: bool  # search the agent's knowledge for every turn
    top_k: int  # passages retrieved per turn
    max_tokens: int  # prompt tokens the passages may take together


PIPELINES = ("cascade", "openai-realtime")  # what runs between a call's transport input and output


@dataclass(frozen=True)
class SpeechToSpeechSettings:
    """A speech-to-speech model behind OpenAI's Realtime protocol (pipeline "openai-realtime")."""

    base_url: str  # ws(s)://host/v1/realtime: OpenAI's, or any compatible server (another Cadence)
    model: str  # the remote model (for a Cadence server: the agent's name)
    api_key_env: str | None  # the environment variable holding the remote's key; None: no key


@dataclass(frozen=True)
class CallAgent:
    name: str
    system_prompt: str
    greeting: str | None  # spoken when the caller connects
    tts_engine: str
    voice: str
    llm_model: str
    sampling: Sampling
    max_reply_tokens: int
    max_reply_sentences: int  # 0 = no sentence cap
    retrieval: RetrievalSettings
    vad_stop_secs: float
    speculate_after_secs: float  # 0 = no speculative transcripts
    idle_timeout_seconds: float
    # Characters of dialogue (history and the caller's turn) a prompt may hold: llm.max_dialogue_chars,
    # or less where the system prompt leaves less of the LLM's context (pipelines/prompt_budget.py).
    max_dialogue_chars: int
    pipeline: str = "cascade"  # one of PIPELINES
    speech_to_speech: SpeechToSpeechSettings | None = None  # set when pipeline is "openai-realtime"
