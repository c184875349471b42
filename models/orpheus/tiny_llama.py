"""An in-process Orpheus token source for CPU tests: a tiny Llama with Orpheus' vocabulary.

Same layout as Orpheus (Llama 3: RMSNorm, rotary attention with grouped KV heads,
SwiGLU; 156,940-token vocabulary whose audio tokens start at 128266), a tiny width and
random weights. Decoding is constrained to the frame grammar: at audio position i only
the 4096 ids of slot i mod 7 are allowed (plus end of speech at a frame boundary), so
even random weights yield a well-formed stream; only the rows of the output head for the
allowed ids are computed, which is where a small model's CPU time would otherwise go.
Random weights know nothing of speech length: the stream ends after as many frames as
the text would take to say (~14 characters a second).
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from models.orpheus.token_source import OrpheusSampling
from models.orpheus.tokens import AUDIO_TOKEN_BASE, CODEBOOK_SIZE, END_OF_SPEECH, FRAME_TOKENS, SAMPLES_PER_FRAME, \
    SAMPLE_RATE
from models.runner import ModelRunner

ORPHEUS_VOCAB = 156_940
CHARS_PER_SECOND = 14.0
FRAME_SECONDS = SAMPLES_PER_FRAME / SAMPLE_RATE


@dataclass(frozen=True)
class TinyLlamaConfig:
    vocab: int = ORPHEUS_VOCAB
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    rope_theta: float = 500_000.0


class _Attention(nn.Module):
    def __init__(self, c: TinyLlamaConfig) -> None:
        super().__init__()
        self.c = c
        self.head_dim = c.hidden // c.heads
        self.q = nn.Linear(c.hidden, c.heads * self.head_dim, bias=False)
        self.k = nn.Linear(c.hidden, c.kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(c.hidden, c.kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(c.heads * self.head_dim, c.hidden, bias=False)

    def forward(self, x, positions, cache: list | None):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.c.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, t, self.c.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, t, self.c.kv_heads, self.head_dim).transpose(1, 2)
        q, k = _rope(q, positions, self.c.rope_theta), _rope(k, positions, self.c.rope_theta)
        if cache is not None:
            if cache:
                k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
            cache[:] = [k, v]
        repeat = self.c.heads // self.c.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=t > 1)
        return self.o(out.transpose(1, 2).reshape(b, t, -1))


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    half = x.shape[-1] // 2
    freqs = theta ** (-torch.arange(half, dtype=torch.float32) / half)
    angles = positions.float()[:, None] * freqs[None, :]
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class _Block(nn.Module):
    def __init__(self, c: TinyLlamaConfig) -> None:
        super().__init__()
        self.attn_norm, self.mlp_norm = nn.RMSNorm(c.hidden), nn.RMSNorm(c.hidden)
        self.attn = _Attention(c)
        self.gate = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.up = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.down = nn.Linear(c.intermediate, c.hidden, bias=False)

    def forward(self, x, positions, cache):
        x = x + self.attn(self.attn_norm(x), positions, cache)
        h = self.mlp_norm(x)
        return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))


class TinyLlama(nn.Module):
    def __init__(self, c: TinyLlamaConfig = TinyLlamaConfig(), *, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.c = c
        self.embed = nn.Embedding(c.vocab, c.hidden)
        self.blocks = nn.ModuleList(_Block(c) for _ in range(c.layers))
        self.norm = nn.RMSNorm(c.hidden)
        self.head = nn.Linear(c.hidden, c.vocab, bias=False)
        self.eval()

    @torch.inference_mode()
    def hidden(self, ids: torch.Tensor, start: int, caches: list[list]) -> torch.Tensor:
        positions = torch.arange(start, start + ids.shape[1])
        x = self.embed(ids)
        for block, cache in zip(self.blocks, caches):
            x = block(x, positions, cache)
        return self.norm(x[:, -1])

    @torch.inference_mode()
    def logits_for(self, hidden: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return hidden @ self.head.weight[ids].T


class InProcessTokenSource:
    """Generates Orpheus audio tokens with a `TinyLlama`, off the event loop."""

    def __init__(self, model: TinyLlama | None = None, *, seed: int = 0, max_waiting: int = 16) -> None:
        self._model = model or TinyLlama(seed=seed)
        self._runner = ModelRunner("orpheus-tokens", max_waiting=max_waiting)
        self._seed = seed

    def frames_for(self, prompt_ids: list[int]) -> int:
        seconds = max(0.5, len(prompt_ids) / CHARS_PER_SECOND * 3.5)  # ~3.5 characters per prompt token
        return max(2, round(seconds / FRAME_SECONDS))

    async def stream(self, prompt_ids: list[int], sampling: OrpheusSampling = OrpheusSampling()
                     ) -> AsyncIterator[list[int]]:
        if max(prompt_ids, default=0) >= self._model.c.vocab or min(prompt_ids, default=0) < 0:
            raise ValueError("prompt id outside the vocabulary")
        frames = min(self.frames_for(prompt_ids), sampling.max_tokens // FRAME_TOKENS)
        async for token in self._runner.stream(lambda stop: self._generate(prompt_ids, frames, sampling, stop)):
            yield [token]

    def _generate(self, prompt_ids: list[int], frames: int, sampling: OrpheusSampling,
                  stop: threading.Event) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self._seed + len(prompt_ids))
        caches: list[list] = [[] for _ in self._model.blocks]
        hidden = self._model.hidden(torch.tensor([prompt_ids]), 0, caches)
        position = len(prompt_ids)
        recent: list[int] = []
        for i in range(frames * FRAME_TOKENS):
            if stop.is_set():
                return
            allowed = AUDIO_TOKEN_BASE + CODEBOOK_SIZE * (i % FRAME_TOKENS) + torch.arange(CODEBOOK_SIZE)
            logits = self._model.logits_for(hidden, allowed)[0]
            token = int(allowed[_sample(logits, allowed, recent, sampling, generator)])
            recent = (recent + [token])[-64:]
            yield token
            hidden = self._model.hidden(torch.tensor([[token]]), position, caches)
            position += 1
        yield END_OF_SPEECH

    async def close(self) -> None:
        self._runner.shutdown()


def _sample(logits: torch.Tensor, allowed: torch.Tensor, recent: list[int], sampling: OrpheusSampling,
            generator: torch.Generator) -> int:
    if recent and sampling.repetition_penalty != 1.0:
        seen = torch.isin(allowed, torch.tensor(recent))
        logits = torch.where(seen, torch.where(logits > 0, logits / sampling.repetition_penalty,
                                               logits * sampling.repetition_penalty), logits)
    probs = torch.softmax(logits / sampling.temperature, dim=-1)
    ordered, order = probs.sort(descending=True)
    keep = ordered.cumsum(0) - ordered < sampling.top_p  # top-p: the smallest set holding top_p mass
    ordered = ordered * keep
    choice = torch.multinomial(ordered / ordered.sum(), 1, generator=generator)
    return int(order[choice])


def param_count(model: TinyLlama) -> int:
    return sum(p.numel() for p in model.parameters())


