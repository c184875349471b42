"""The SNAC 24 kHz decoder, made fit for streaming: weight norm folded, noise locked to position.

Weights come from the hub (`hubertsiuzdak/snac_24khz`) or a local folder with config.json
and pytorch_model.bin; tests build the same architecture with random weights
(`SNAC_24KHZ_CONFIG`), which measures compute and streaming exactness just as well.

SNAC's decoder adds Gaussian noise after each upsampling (NoiseBlock), drawn afresh on
every call, so two decodes of the same codes differ and a streamed decode could never be
checked against an offline one. Here the noise is read from a fixed table by absolute
sample position: the same codes give the same audio however the stream is windowed,
and the noise keeps the texture the model was trained with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from models.orpheus.tokens import CODEBOOK_SIZE, FRAME_TOKENS, SAMPLES_PER_FRAME

# hubertsiuzdak/snac_24khz config.json: the architecture Orpheus' codes are for.
SNAC_24KHZ_CONFIG = {
    "sampling_rate": 24000, "encoder_dim": 48, "encoder_rates": [2, 4, 8, 8], "decoder_dim": 1024,
    "decoder_rates": [8, 8, 4, 2], "attn_window_size": None, "codebook_size": CODEBOOK_SIZE, "codebook_dim": 8,
    "vq_strides": [4, 2, 1], "noise": True, "depthwise": True,
}
SNAC_24KHZ_REPO = "hubertsiuzdak/snac_24khz"
LATENT_STEPS_PER_FRAME = 4  # L0 stride: one Orpheus frame = 4 latent steps of 512 samples
NOISE_TABLE = 1 << 16


class PositionLockedNoise(nn.Module):
    """SNAC's NoiseBlock with noise taken from a fixed table by absolute position."""

    def __init__(self, linear: nn.Module, samples_per_latent_step: int, table: torch.Tensor) -> None:
        super().__init__()
        self.linear = linear
        self.rate = samples_per_latent_step
        self.register_buffer("table", table, persistent=False)
        self.latent_offsets: torch.Tensor | None = None  # (batch,) window start, in latent steps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        offsets = self.latent_offsets if self.latent_offsets is not None else torch.zeros(x.shape[0], dtype=torch.long)
        return self.at_positions(x, offsets.to(x.device) * self.rate)

    def at_positions(self, x: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
        """`starts` (batch,): each row's absolute position (in samples at this layer) of x[..., 0]."""
        positions = starts.view(-1, 1) + torch.arange(x.shape[-1], device=x.device).view(1, -1)
        noise = self.table[positions % self.table.numel()].unsqueeze(1).to(x.dtype)
        return x + noise * self.linear(x)


@dataclass
class SnacDecoder:
    """codes (batch of windows) -> audio; a plain module call, meant to run off the event loop.

    One thread at a time: each call positions the noise blocks for its batch. The decode
    service gives the decoder a thread of its own."""

    model: nn.Module  # snac.SNAC, eval mode, weight norm folded
    device: torch.device
    noise_blocks: list[PositionLockedNoise]

    @torch.inference_mode()
    def decode(self, frames: torch.Tensor, first_frames: torch.Tensor | None = None) -> torch.Tensor:
        """(batch, n, 7) frame codes -> (batch, n * 2048) float audio in [-1, 1].

        `first_frames` (batch,) is each window's absolute index of its first frame, which
        positions the noise; windows of one stream then join without a seam.
        """
        frames = frames.to(self.device)
        batch, n, _ = frames.shape
        levels = [frames[:, :, [0]].reshape(batch, n), frames[:, :, [1, 4]].reshape(batch, 2 * n),
                  frames[:, :, [2, 3, 5, 6]].reshape(batch, 4 * n)]
        starts = first_frames if first_frames is not None else torch.zeros(batch, dtype=torch.long)
        for block in self.noise_blocks:
            block.latent_offsets = starts.to(self.device) * LATENT_STEPS_PER_FRAME
        audio = self.model.decode(levels)
        return audio.reshape(batch, -1)[:, : n * SAMPLES_PER_FRAME]


def load_snac(source: str | None = None, *, device: str = "cpu", seed: int = 0) -> SnacDecoder:
    """`source`: a hub id or local folder; None builds random weights of the real architecture."""
    from snac import SNAC

    if source is None:
        torch.manual_seed(seed)
        model = SNAC(**SNAC_24KHZ_CONFIG)
    else:
        model = SNAC.from_pretrained(source)
    model.eval()
    del model.encoder  # decode only: the encoder is a third of the weights
    _fold_weight_norm(model)
    blocks = _lock_noise(model, seed)
    model.to(device)
    return SnacDecoder(model, torch.device(device), blocks)


def _fold_weight_norm(model: nn.Module) -> None:
    """Weight norm recomputes w = g * v / |v| on every call; fold it into plain weights once."""
    from torch.nn.utils import parametrize

    for module in model.modules():
        if parametrize.is_parametrized(module, "weight"):
            parametrize.remove_parametrizations(module, "weight", leave_parametrized=True)


def _lock_noise(model: nn.Module, seed: int) -> list[PositionLockedNoise]:
    from snac.layers import DecoderBlock, NoiseBlock

    generator = torch.Generator().manual_seed(seed + 1)
    blocks: list[PositionLockedNoise] = []
    samples_per_step = 1
    for decoder_block in (m for m in model.decoder.modules() if isinstance(m, DecoderBlock)):
        layers = decoder_block.block
        stride = next(m for m in layers if isinstance(m, nn.ConvTranspose1d)).stride[0]
        samples_per_step *= stride
        for i, layer in enumerate(layers):
            if isinstance(layer, NoiseBlock):
                table = torch.randn(NOISE_TABLE, generator=generator)
                locked = PositionLockedNoise(layer.linear, samples_per_step, table)
                layers[i] = locked
                blocks.append(locked)
    return blocks


def frames_tensor(frames: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(np.asarray(frames, dtype=np.int64)).reshape(1, -1, FRAME_TOKENS)


def receptive_field_frames(decoder: SnacDecoder, *, n: int = 24) -> tuple[int, int]:
    """How many frames before and after a frame change its audio (measured, not assumed)."""
    rng = np.random.default_rng(0)
    frames = rng.integers(0, CODEBOOK_SIZE, (n, FRAME_TOKENS))
    base = decoder.decode(frames_tensor(frames))[0]
    middle = n // 2
    changed = frames.copy()
    changed[middle] = rng.integers(0, CODEBOOK_SIZE, FRAME_TOKENS)
    diff = (decoder.decode(frames_tensor(changed))[0] - base).abs().reshape(n, SAMPLES_PER_FRAME).amax(dim=1)
    touched = torch.nonzero(diff > 1e-6).flatten().tolist()
    return middle - min(touched), max(touched) - middle


def snr_db(reference: np.ndarray, estimate: np.ndarray) -> float:
    noise = np.sum((reference - estimate) ** 2)
    signal = np.sum(reference**2)
    return math.inf if noise == 0 else 10 * math.log10(signal / noise)
