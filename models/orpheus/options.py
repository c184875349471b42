"""What the Orpheus voice is built from; `tts.orpheus` in the server's config.

Kept apart from the engine so that reading a config never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OrpheusOptions:
    """The GPU voice: Orpheus tokens from a token source, decoded by a shared SNAC service."""

    voice: str = "tara"  # tara, leah, jess, leo, dan, mia, zac, zoe, or a fine-tune's own names
    # "in-process" (a tiny random-weight Llama: CPU tests only) or the base URL of an
    # OpenAI-compatible server running Orpheus (vLLM, trtllm-serve), e.g. http://orpheus:8000/v1
    token_source: str = "in-process"
    model: str = "canopylabs/orpheus-3b-0.1-ft"  # the model name at that server
    # "token_ids" (vLLM, trtllm-serve) or "text" (servers whose completions take only text: llama.cpp's)
    prompt_format: str = "token_ids"
    # "bytes" (the in-process source's own), or Orpheus' tokenizer: a hub id or folder (transformers)
    tokenizer: str = "bytes"
    snac: str = "random"  # "random" (tests), "hubertsiuzdak/snac_24khz", or a local folder
    # "in-process" (the decode service in this server, on `device`), or the base URL of a
    # codec worker (workers.serve_worker --engine snac), e.g. http://snac:8080
    codec: str = "in-process"
    device: str = "cpu"
    temperature: float = 0.6
    top_p: float = 0.8
    repetition_penalty: float = 1.1
    max_tokens: int = 2048  # 25 s of audio: one request never reaches Orpheus' ~30 s quality cliff
    max_batch: int = 16
    batch_timeout_ms: float = 15.0
    compile: bool = False  # torch.compile the SNAC decoder (GPU hosts)
    fallback_to_piper: bool = True  # a sentence Orpheus cannot say is said by the CPU voice
    # A sentence with no Orpheus audio this long after it was asked for (a stuck worker, a
    # full GPU) is said by the CPU voice instead. Orpheus' first audio takes ~0.2 s on a GPU.
    fallback_after_seconds: float = 1.5
