"""A tiny random-weight Llama in GGUF with Orpheus' vocabulary, for a real OpenAI-compatible server.

`write_tiny_orpheus_gguf(path)` writes a ~45 MB GGUF that llama.cpp (`llama-server -m PATH`)
loads and serves on CPU, so the client in
`token_source.py` can be tested against a real completions server: vLLM and TensorRT-LLM
cannot be installed here (no GPU), and llama.cpp's server is the OpenAI-compatible server
that runs on this CPU (its completions endpoint takes text, hence `prompt_format="text"`).

Layout, as Orpheus (Llama 3.2 fine-tune) converted to GGUF:
  * architecture "llama" (RMSNorm, rotary attention with grouped KV heads, SwiGLU), a tiny
    width (`TinyGgufConfig`), a separate `output.weight` head;
  * tokenizer "gpt2" (byte-level BPE, pre-tokenizer "llama-bpe") of 156,940 tokens:
    0..255 the GPT-2 byte-level characters (so any text tokenizes), then every pair of them
    with a merge each (text tokenizes into two-byte tokens), then unique fillers up to
    127,999; 128000..128255 Llama 3's special tokens (CONTROL: parsed in prompt text,
    not rendered in output); 128256.. `<custom_token_N>` (USER_DEFINED: matched whole in
    prompt text and rendered as their text in the output, as the public Orpheus GGUFs do).
    BOS 128000 (added by the server), EOS 128258 (end of speech).

Random weights alone would emit arbitrary ids from all 156,940 and break the 7-slot frame
grammar the client checks, so a structure is planted on top of them: seven hidden
dimensions are "slot" directions. The embedding of every audio token of slot i (and of
start of speech, as slot 6) is large on dimension i; the output-head row of every audio
token of slot j is large on dimension (j - 1) mod 7, zero on the other slot dimensions
and small random elsewhere; every other row of the head is small random. The attention
and feed-forward output projections are small, so the residual stream keeps the current
token's slot through the final RMSNorm and the head favours the next slot's 4096 tokens
by ~30 logits over anything else, while the random parts (embedding noise, attention
over the context) spread probability across that slot's codes. Sampling with Orpheus'
defaults (temperature 0.6, top-p 0.8, repeat penalty 1.1) or greedily thus continues the
frame grammar with varied codes. End of speech is never favoured: `max_tokens` ends a
stream.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from models.orpheus.tokens import (AUDIO_TOKEN_BASE, CODEBOOK_SIZE, CUSTOM_TOKEN_BASE, END_OF_SPEECH, FRAME_TOKENS,
                                   START_OF_SPEECH)

ORPHEUS_VOCAB = 156_940
ORDINARY_TOKENS = 128_000  # Llama 3's BPE ids 0..127999
LLAMA3_SPECIAL_TOKENS = CUSTOM_TOKEN_BASE - ORDINARY_TOKENS  # 256: 128000..128255
BEGIN_OF_TEXT = 128_000
END_OF_TEXT = 128_009  # <|eot_id|>

# GGUF token types (gguf.TokenType; the numbers are llama.cpp's).
_NORMAL, _CONTROL, _USER_DEFINED = 1, 3, 4


@dataclass(frozen=True)
class TinyGgufConfig:
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    context: int = 4096
    rope_theta: float = 500_000.0
    rms_eps: float = 1e-5
    # Planted slot structure (see the module docstring).
    slot_embed: float = 1.0  # an audio token's value on its slot dimension
    slot_head: float = 5.0  # an audio token's head weight on the previous slot's dimension
    embed_noise: float = 0.05
    head_noise: float = 0.3  # audio rows, non-slot dimensions: spreads the codes within a slot
    other_head_noise: float = 0.02
    mix_out_scale: float = 0.01  # std of attention/FFN output projections


def byte_level_chars() -> list[str]:
    """GPT-2's byte -> printable character table, in GPT-2's order (printable bytes first)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def llama3_special_token(token_id: int) -> str:
    """Llama 3.1/3.2's name for special id 128000..128255."""
    named = {128000: "<|begin_of_text|>", 128001: "<|end_of_text|>", 128004: "<|finetune_right_pad_id|>",
             128006: "<|start_header_id|>", 128007: "<|end_header_id|>", 128008: "<|eom_id|>",
             128009: "<|eot_id|>", 128010: "<|python_tag|>"}
    if token_id in named:
        return named[token_id]
    reserved = {128002: 0, 128003: 1, 128005: 2}.get(token_id, token_id - 128008)
    return f"<|reserved_special_token_{reserved}|>"


def orpheus_vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, GGUF token types, merges) of the 156,940-token Orpheus vocabulary."""
    chars = byte_level_chars()
    pairs = [a + b for a in chars for b in chars]
    merges = [f"{a} {b}" for a in chars for b in chars]
    fillers = [f"~{i:06d}" for i in range(len(chars) + len(pairs), ORDINARY_TOKENS)]
    tokens = chars + pairs + fillers
    tokens += [llama3_special_token(i) for i in range(ORDINARY_TOKENS, CUSTOM_TOKEN_BASE)]
    tokens += [f"<custom_token_{n}>" for n in range(ORPHEUS_VOCAB - CUSTOM_TOKEN_BASE)]
    types = [_NORMAL] * ORDINARY_TOKENS + [_CONTROL] * LLAMA3_SPECIAL_TOKENS + \
        [_USER_DEFINED] * (ORPHEUS_VOCAB - CUSTOM_TOKEN_BASE)
    assert len(tokens) == len(set(tokens)) == ORPHEUS_VOCAB
    return tokens, types, merges


def tiny_orpheus_weights(c: TinyGgufConfig = TinyGgufConfig(), *, seed: int = 0) -> dict[str, np.ndarray]:
    """GGUF tensor name -> array (numpy shape [out, in]), random with the planted slot structure."""
    if c.hidden < FRAME_TOKENS + 8 or c.hidden % c.heads or c.heads % c.kv_heads:
        raise ValueError(f"unsupported shape: {c}")
    rng = np.random.default_rng(seed)
    head_dim = c.hidden // c.heads
    audio = np.arange(AUDIO_TOKEN_BASE, AUDIO_TOKEN_BASE + FRAME_TOKENS * CODEBOOK_SIZE)
    audio_slot = (audio - AUDIO_TOKEN_BASE) // CODEBOOK_SIZE
    rest = slice(FRAME_TOKENS, c.hidden)  # the non-slot dimensions

    embed = (rng.standard_normal((ORPHEUS_VOCAB, c.hidden), dtype=np.float32) * c.embed_noise)
    embed[:, :FRAME_TOKENS] = 0.0
    embed[audio, audio_slot] = c.slot_embed
    embed[START_OF_SPEECH, FRAME_TOKENS - 1] = c.slot_embed  # the first audio token is slot 0

    head = rng.standard_normal((ORPHEUS_VOCAB, c.hidden), dtype=np.float32) * c.other_head_noise
    head[audio] = 0.0
    head[audio, rest] = rng.standard_normal((len(audio), c.hidden - FRAME_TOKENS), dtype=np.float32) * c.head_noise
    head[audio, (audio_slot - 1) % FRAME_TOKENS] = c.slot_head

    def linear(out: int, inp: int, std: float | None = None) -> np.ndarray:
        return (rng.standard_normal((out, inp), dtype=np.float32) * (std or inp ** -0.5)).astype(np.float32)

    tensors = {"token_embd.weight": embed.astype(np.float16),
               "output_norm.weight": np.ones(c.hidden, dtype=np.float32),
               "output.weight": head.astype(np.float16)}
    for layer in range(c.layers):
        p = f"blk.{layer}."
        tensors.update({
            p + "attn_norm.weight": np.ones(c.hidden, dtype=np.float32),
            p + "attn_q.weight": linear(c.heads * head_dim, c.hidden),
            p + "attn_k.weight": linear(c.kv_heads * head_dim, c.hidden),
            p + "attn_v.weight": linear(c.kv_heads * head_dim, c.hidden),
            p + "attn_output.weight": linear(c.hidden, c.heads * head_dim, c.mix_out_scale),
            p + "ffn_norm.weight": np.ones(c.hidden, dtype=np.float32),
            p + "ffn_gate.weight": linear(c.intermediate, c.hidden),
            p + "ffn_up.weight": linear(c.intermediate, c.hidden),
            p + "ffn_down.weight": linear(c.hidden, c.intermediate, c.mix_out_scale),
        })
    return tensors


def write_tiny_orpheus_gguf(path: str | os.PathLike[str], *, seed: int = 0,
                            config: TinyGgufConfig = TinyGgufConfig()) -> None:
    """Write the tiny Orpheus-vocabulary Llama to `path` (a .gguf file, ~45 MB)."""
    import gguf  # the `test` extra; imported here so the module imports without it

    c = config
    tokens, types, merges = orpheus_vocab()
    writer = gguf.GGUFWriter(os.fspath(path), "llama")
    writer.add_name("tiny-orpheus-random")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_context_length(c.context)
    writer.add_embedding_length(c.hidden)
    writer.add_block_count(c.layers)
    writer.add_feed_forward_length(c.intermediate)
    writer.add_head_count(c.heads)
    writer.add_head_count_kv(c.kv_heads)
    writer.add_rope_dimension_count(c.hidden // c.heads)
    writer.add_rope_freq_base(c.rope_theta)
    writer.add_layer_norm_rms_eps(c.rms_eps)
    writer.add_vocab_size(ORPHEUS_VOCAB)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("llama-bpe")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(BEGIN_OF_TEXT)
    writer.add_eos_token_id(END_OF_SPEECH)
    writer.add_eot_token_id(END_OF_TEXT)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    for name, tensor in tiny_orpheus_weights(c, seed=seed).items():
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
