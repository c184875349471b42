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
