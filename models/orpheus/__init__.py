"""Orpheus TTS: prompts, the token <-> SNAC code mapping, and streaming SNAC decoding."""

from models.orpheus.prompt import EMOTION_TAGS, VOICES, prompt_ids, prompt_text
from models.orpheus.tokens import (
    FrameAssembler,
    OrpheusTokenError,
    snac_codes_to_tokens,
    tokens_to_snac_codes,
)

__all__ = ["EMOTION_TAGS", "VOICES", "FrameAssembler", "OrpheusTokenError", "prompt_ids", "prompt_text",
           "snac_codes_to_tokens", "tokens_to_snac_codes"]
