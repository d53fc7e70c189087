"""Emulate mode's stage chunks: a real GPT chunk on the emulation device that, on a rank
that is not real this step, sleeps its calibrated costs instead (``EmulatedChunk``).
See ``pipeline.emulate`` for the whole harness and [Note: wire width].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Self

import torch
from torch import nn

from freeride_lab.pipeline.models import StageChunk
from freeride_lab.pipeline.synthetic import _Sleep  # the synthetic stages' sleep-timed identity

__all__ = ["VOCAB", "ChunkCosts", "EmulatedChunk"]

VOCAB = 256  # core.models' byte vocabulary: the last stage's logits width


@dataclass(frozen=True, slots=True)
class ChunkCosts:
    """Calibrated seconds per micro-batch of one chunk on the device.

    ``backward_s`` is the whole backward (B); ``weight_s`` is the part of it that a
    zero-bubble schedule runs later as W (the weights' gradients), so I costs
    ``backward_s - weight_s``. 0 (schedules that never split the backward) puts all of it in I.
    """

    forward_s: float
    backward_s: float
    weight_s: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.weight_s <= self.backward_s:
            raise ValueError(
                f"weight_s={self.weight_s} must lie in [0, backward_s={self.backward_s}]: "
                "it is the weight-gradient part of the backward"
            )

    @property
    def input_s(self) -> float:
        """The input-gradient part of the backward (torch's I action)."""
        return self.backward_s - self.weight_s


class _SyncOnBackward(torch.autograd.Function):
    """Identity whose backward waits for the device: closes a chunk's backward on the host clock.

    Placed right after the chunk's input enters the device (after the embedding on stage 0),
    so its backward runs once every block's backward has been launched; synchronising there
    makes the B span end when the device work ends (only the embedding's or the first
    LayerNorm's small weight-gradient kernels can follow).
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.device = x.device
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)
        return grad


class EmulatedChunk(nn.Module):
    """One stage chunk: computes on ``device`` while ``is_real``, else sleeps its ``costs``.

    Pipeline tensors are CPU float32: (B, T) int64 tokens into the first stage, (B, T, W) wire
    activations between stages (W = ``wire_d_model``), (B, T, 256) logits out of the last.

    [Note: fixed placement]
    The real chunk lives on the emulation device in its dtype for the whole run, while the rank
    moves "its modules" to the pipeline device (the CPU); ``_apply`` (what ``.to``, ``.float``
    and friends call) is therefore a no-op here.
    """

    def __init__(
        self,
        chunk: StageChunk,
        *,
        d_model: int,
        wire_d_model: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        if d_model % wire_d_model:
            raise ValueError(f"d_model={d_model} must be a multiple of wire_d_model={wire_d_model}")
        self.chunk = chunk.to(device=device, dtype=dtype)
        self.device = device
        self.d_model = d_model  # D of the real model
        self.wire_d_model = wire_d_model
        self.first = chunk.embedding is not None
        self.last = chunk.head is not None
        self.costs: ChunkCosts | None = None
        self.is_real = True
        # the weight a sleeping chunk's W acts on (see _forward_sleep); a CPU float32 (W,)
        self.sleep_weight = nn.Parameter(torch.zeros(wire_d_model))

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Self:
        return self  # see [Note: fixed placement]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.is_real or self.costs is None:
            return self.forward_real(x)
        return self._forward_sleep(x)

    def forward_real(self, x: torch.Tensor) -> torch.Tensor:
        """The chunk on the device: (B, T) tokens or (B, T, W) → (B, T, W) or (B, T, 256)."""
        c = self.chunk
        if c.embedding is not None:
            h = c.embedding(x.to(self.device))  # (B, T) → (B, T, D)
        else:
            w = x.to(self.device, self.chunk_dtype)  # (B, T, W)
            h = w.repeat(1, 1, self.d_model // self.wire_d_model)  # (B, T, D): the wire tiled up
        h = _SyncOnBackward.apply(h)  # type: ignore[no-untyped-call]
        for block in c.blocks:
            h = block(h)  # (B, T, D)
        if c.head is not None:
            out = c.head(h)  # (B, T, 256)
        else:
            B, T, D = h.shape
            out = h.view(B, T, D // self.wire_d_model, self.wire_d_model).mean(2)  # (B, T, W)
        result: torch.Tensor = out.to("cpu", torch.float32)  # synchronises with the device
        return result

    @property
    def chunk_dtype(self) -> torch.dtype:
        return next(self.chunk.parameters()).dtype

    def _forward_sleep(self, x: torch.Tensor) -> torch.Tensor:
        costs = self.costs
        assert costs is not None
        if self.first:
            # (B, T) -> (B, T, W); contiguous: the stage checks strides against its static shapes
            x = x.unsqueeze(-1).expand(*x.shape, self.wire_d_model).float().contiguous()
        if torch.is_grad_enabled() and not x.requires_grad:
            x = x.detach().requires_grad_()  # keep a backward path on the first stage
        # two paths, as in pipeline.synthetic's SleepStage: the input's (F, I) and the
        # weight's (W), so a zero-bubble schedule's I and W each sleep their own part
        y: torch.Tensor = _Sleep.apply(x, costs.forward_s, costs.input_s)  # type: ignore[no-untyped-call]
        if costs.weight_s > 0:
            w: torch.Tensor = _Sleep.apply(self.sleep_weight, 0.0, costs.weight_s)  # type: ignore[no-untyped-call]
            y = y + w  # (B, T, W) + (W,)
        if self.last:
            y = y[..., :1].expand(*y.shape[:-1], VOCAB).contiguous()  # (B, T, 256)
        return y

    def extra_repr(self) -> str:
        return f"index={self.chunk.index}, device={self.device}, costs={self.costs}"
