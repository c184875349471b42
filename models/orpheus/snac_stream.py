"""Exact streaming SNAC decode with cached convolution state.

SNAC's decoder is a stack of zero-padded convolutions, transposed convolutions and
pointwise layers. Each convolution is streamed here by keeping its last (k-1)*d input
samples, each transposed convolution by keeping the half-kernel its last input spills
into the next output block, and each residual skip by a delay line as long as its
branch's padding. Every frame's codes then go through the decoder once (not the 2-4
times of a sliding window), and every sample comes out exactly as the offline decode
of the whole sequence computes it (up to float rounding), `delay_samples` (~2.3 frames)
after the codes that determine it.

Chunks have one fixed lag per layer, so a stream's state has the same shapes after
every step and steps of many streams batch into one forward pass. Positions before the
stream's start (and, while flushing, after its end) are forced to zero after every
layer that could make them non-zero: that is exactly the zero padding offline decode
sees at each layer's edges.

The transposed convolutions (kernel 2s, stride s) run as one matrix product and an
overlap-add of half-kernels: cheaper on CPU than torch's ConvTranspose1d, which falls
back to a slow reference kernel for the short inputs streaming gives it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from models.orpheus.snac_decoder import LATENT_STEPS_PER_FRAME, PositionLockedNoise, SnacDecoder
from models.orpheus.tokens import FRAME_TOKENS, SAMPLES_PER_FRAME


@dataclass
class StreamState:
    """One stream's decoder state. Owned by one stream, stepped by one decode at a time."""

    tensors: list[torch.Tensor]  # per stateful layer, batch dimension 1
    frames_in: int = 0  # frames fed so far (flush frames included)
    total_frames: int | None = None  # set by the final step: the stream's length
    next_sample: int = 0  # the first sample not yet returned (a head start may have covered some)

    @property
    def finished(self) -> bool:
        return self.total_frames is not None and self.next_sample >= self.total_frames * SAMPLES_PER_FRAME


@dataclass
class _Layer:
    """A layer's place in the stream: samples per frame at its output, and its lag there."""

    rate: int
    lag: int

    def starts(self, frames_in: list[int]) -> list[int]:
        """Each stream's position (in this layer's samples) of the first sample of this step."""
        return [f * self.rate - self.lag for f in frames_in]


@dataclass
class _Conv(_Layer):
    weight: torch.Tensor = None
    bias: torch.Tensor | None = None
    dilation: int = 1
    groups: int = 1
    history: int = 0  # (k - 1) * dilation input samples carried between steps
    state_index: int = -1


@dataclass
class _ConvTranspose(_Layer):
    gemm_weight: torch.Tensor = None  # (C_in, C_out * 2s)
    bias: torch.Tensor = None
    stride: int = 1
    out_channels: int = 0
    state_index: int = -1


def snake(x: torch.Tensor, alpha: torch.Tensor, inverse_alpha: torch.Tensor) -> torch.Tensor:
    """x + sin²(αx)/α, as SNAC's Snake1d, computed in one buffer instead of five: on CPU the
    fresh large tensors (page faults) cost more than the arithmetic."""
    y = torch.mul(x, alpha)
    y.sin_().square_().mul_(inverse_alpha)
    return y.add_(x)


@dataclass
class _Snake(_Layer):
    alpha: torch.Tensor = None
    inverse_alpha: torch.Tensor = None


@dataclass
class _Tanh(_Layer):
    pass


@dataclass
class _Noise(_Layer):
    block: PositionLockedNoise = None


@dataclass
class _Residual(_Layer):
    branch: list = field(default_factory=list)
    delay: int = 0
    state_index: int = -1


class SnacStreamer:
    """Steps batches of streams through the SNAC decoder; holds no per-stream data."""

    def __init__(self, decoder: SnacDecoder, *, compile: bool = False) -> None:
        """`compile`: fuse the elementwise work (Snake) with torch.compile, once for all shapes
        (dynamic); matrix products and convolutions are library kernels either way."""
        self._decoder = decoder
        self._snake = torch.compile(snake, dynamic=True) if compile else snake
        self._quantizer = decoder.model.quantizer
        self._state_shapes: list[tuple[int, int]] = []
        self._layers = self._compile(list(decoder.model.decoder.model), _Layer(LATENT_STEPS_PER_FRAME, 0))
        last = self._layers[-1]
        assert last.rate == SAMPLES_PER_FRAME, last.rate
        self.delay_samples = last.lag
        # A flush runs this many zero latent steps (512 samples each) through the decoder.
        self.flush_latent_steps = math.ceil(self.delay_samples / (SAMPLES_PER_FRAME // LATENT_STEPS_PER_FRAME))
        self._latent_channels = self._layers[0].weight.shape[0]
        self._device = decoder.device

    # ---- building the program -------------------------------------------------------
    def _compile(self, modules: list[nn.Module], at: _Layer) -> list[_Layer]:
        from snac.layers import DecoderBlock, ResidualUnit, Snake1d

        layers: list[_Layer] = []
        for module in modules:
            if isinstance(module, DecoderBlock):
                inner = self._compile(list(module.block), at)
                layers += inner
                at = inner[-1]
            elif isinstance(module, ResidualUnit):
                branch = self._compile(list(module.block), at)
                delay = branch[-1].lag - at.lag
                index = self._add_state(branch[-1].weight.shape[0], delay)
                at = _Residual(at.rate, branch[-1].lag, branch=branch, delay=delay, state_index=index)
                layers.append(at)
            elif isinstance(module, nn.ConvTranspose1d):
                s = module.stride[0]
                if module.kernel_size[0] != 2 * s or module.output_padding[0] or module.groups != 1:
                    raise ValueError(f"unsupported transposed convolution {module}")
                c_in, c_out, k = module.weight.shape
                index = self._add_state(c_out, s)
                at = _ConvTranspose(at.rate * s, at.lag * s + module.padding[0],
                                    gemm_weight=module.weight.detach().reshape(c_in, c_out * k).contiguous(),
                                    bias=module.bias.detach().view(1, -1, 1), stride=s, out_channels=c_out,
                                    state_index=index)
                layers.append(at)
            elif isinstance(module, nn.Conv1d):
                (k,), (d,), (pad,) = module.kernel_size, module.dilation, module.padding
                if module.stride[0] != 1 or 2 * pad != (k - 1) * d:
                    raise ValueError(f"unsupported convolution {module}")
                history = (k - 1) * d
                index = self._add_state(module.in_channels, history) if history else -1
                at = _Conv(at.rate, at.lag + pad, weight=module.weight.detach(),
                           bias=None if module.bias is None else module.bias.detach(), dilation=d,
                           groups=module.groups, history=history, state_index=index)
                layers.append(at)
            elif isinstance(module, PositionLockedNoise):
                at = _Noise(at.rate, at.lag, block=module)
                layers.append(at)
            elif isinstance(module, Snake1d):
                alpha = module.alpha.detach()
                at = _Snake(at.rate, at.lag, alpha=alpha, inverse_alpha=(alpha + 1e-9).reciprocal())
                layers.append(at)
            elif isinstance(module, nn.Tanh):
                at = _Tanh(at.rate, at.lag)
                layers.append(at)
            else:
                raise ValueError(f"no streaming rule for {type(module).__name__}")
        return layers

    def _add_state(self, channels: int, length: int) -> int:
        self._state_shapes.append((channels, length))
        return len(self._state_shapes) - 1

    # ---- streams --------------------------------------------------------------------
    def new_state(self) -> StreamState:
        return StreamState([torch.zeros(1, c, n, device=self._device) for c, n in self._state_shapes])

    @torch.inference_mode()
    def step(self, states: list[StreamState], frames: torch.Tensor | None, *, final: bool = False
             ) -> list[torch.Tensor]:
        """Feeds (batch, n, 7) frame codes, one row per stream. `final`: these are the streams'
        last frames; the rest of their audio comes out in the same pass (a flush appended).
        `frames=None` flushes streams whose last frames were already fed. Returns each
        stream's newly final audio (float, may be empty)."""
        if any(s.total_frames is not None for s in states):
            raise ValueError("step of a stream after its end")
        if frames is None:
            n, latent, final = 0, None, True
        else:
            if frames.dim() != 3 or frames.shape[0] != len(states) or frames.shape[2] != FRAME_TOKENS:
                raise ValueError(f"frames must be (streams, n, 7), got {tuple(frames.shape)}")
            n = frames.shape[1]
            latent = self._latent(frames.to(self._device))
        if final:
            # Zeros past the end, as offline padding; enough latent steps to bring out the delay.
            flush = torch.zeros(len(states), self._latent_channels, self.flush_latent_steps, device=self._device)
            latent = flush if latent is None else torch.cat([latent, flush], dim=2)
            for state in states:
                state.total_frames = state.frames_in + n
        frames_in = [s.frames_in for s in states]
        ending = [s.total_frames if s.total_frames is not None else 1 << 40 for s in states]
        batched = [torch.cat([s.tensors[i] for s in states]) for i in range(len(self._state_shapes))]
        audio = self._run(self._layers, latent, batched, frames_in, ending)[:, 0]
        out = []
        for row, state in enumerate(states):
            state.tensors = [] if final else [t[row : row + 1].clone() for t in batched]
            first = state.frames_in * SAMPLES_PER_FRAME - self.delay_samples
            state.frames_in += n
            out.append(self._take(state, audio[row], first))
        return out

    def _take(self, state: StreamState, audio: torch.Tensor, first: int) -> torch.Tensor:
        lo = max(state.next_sample, first)
        hi = first + audio.shape[0]
        if state.total_frames is not None:
            hi = min(hi, state.total_frames * SAMPLES_PER_FRAME)
        if hi <= lo:
            return audio[:0]
        state.next_sample = hi
        return audio[lo - first : hi - first]

    def _latent(self, frames: torch.Tensor) -> torch.Tensor:
        batch, n, _ = frames.shape
        levels = [frames[:, :, [0]].reshape(batch, n), frames[:, :, [1, 4]].reshape(batch, 2 * n),
                  frames[:, :, [2, 3, 5, 6]].reshape(batch, 4 * n)]
        return self._quantizer.from_codes(levels)

    # ---- the forward pass -------------------------------------------------------------
    def _run(self, layers: list[_Layer], x: torch.Tensor, states: list[torch.Tensor], frames_in: list[int],
             ending: list[int]) -> torch.Tensor:
        for layer in layers:
            if isinstance(layer, _Snake):  # zero in, zero out: no mask needed
                x = self._snake(x, layer.alpha, layer.inverse_alpha)
            elif isinstance(layer, _Tanh):
                x = torch.tanh(x)
            elif isinstance(layer, _Noise):
                x = layer.block.at_positions(x, torch.tensor(layer.starts(frames_in), device=x.device))
            elif isinstance(layer, _Conv):
                if layer.history:
                    x = torch.cat([states[layer.state_index], x], dim=2)
                    states[layer.state_index] = x[:, :, -layer.history :]
                x = F.conv1d(x, layer.weight, layer.bias, dilation=layer.dilation, groups=layer.groups)
                x = self._mask(layer, x, frames_in, ending)
            elif isinstance(layer, _ConvTranspose):
                x = self._conv_transpose(layer, x, states)
                x = self._mask(layer, x, frames_in, ending)
            elif isinstance(layer, _Residual):
                skip = torch.cat([states[layer.state_index], x], dim=2)
                y = self._run(layer.branch, x, states, frames_in, ending)
                states[layer.state_index] = skip[:, :, y.shape[2] :]
                x = skip[:, :, : y.shape[2]] + y
        return x

    @staticmethod
    def _conv_transpose(layer: _ConvTranspose, x: torch.Tensor, states: list[torch.Tensor]) -> torch.Tensor:
        """Input sample i spreads over output blocks i and i+1 (kernel 2s, stride s): block i
        = head(i) + tail(i-1), where tail(-1) is the state carried from the last step."""
        batch, _, n = x.shape
        s, c = layer.stride, layer.out_channels
        z = (x.transpose(1, 2) @ layer.gemm_weight).view(batch, n, c, 2 * s)
        carried = states[layer.state_index].unsqueeze(1)  # (batch, 1, c, s)
        tails = torch.cat([carried, z[:, :-1, :, s:]], dim=1)
        states[layer.state_index] = z[:, -1, :, s:]
        blocks = z[:, :, :, :s] + tails  # (batch, n, c, s)
        return blocks.permute(0, 2, 1, 3).reshape(batch, c, n * s) + layer.bias

    @staticmethod
    def _mask(layer: _Layer, x: torch.Tensor, frames_in: list[int], ending: list[int]) -> torch.Tensor:
        """Zero the samples before the stream's start and after its end: the zero padding the
        next layer would see offline. Most steps have none and skip the work."""
        starts = layer.starts(frames_in)
        ends = [e * layer.rate for e in ending]
        n = x.shape[2]
        if min(starts) >= 0 and all(s + n <= e for s, e in zip(starts, ends)):
            return x
        positions = torch.tensor(starts, device=x.device).view(-1, 1) + torch.arange(n, device=x.device)
        keep = (positions >= 0) & (positions < torch.tensor(ends, device=x.device).view(-1, 1))
        return x * keep.unsqueeze(1).to(x.dtype)
