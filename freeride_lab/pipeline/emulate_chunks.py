"""Emulate mode's stage chunks: a real GPT chunk on the emulation device that, on a rank
that is not real this step, sleeps its calibrated costs instead (``EmulatedChunk``).
See ``pipeline.emulate`` for the whole harness and [Note: wire width].
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Self

import torch
from torch import nn

from freeride_lab.pipeline.models import StageChunk

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


class _BackwardClock:
    """When the backward of one sleeping forward (one micro-batch) began, plus what its
    halves slept so far: the deadline of the next sleep."""

    __slots__ = ("deadline",)

    def __init__(self) -> None:
        self.deadline = 0.0  # perf_counter seconds


def _sleep_until(deadline: float) -> None:
    left = deadline - time.perf_counter()
    if left > 0:
        time.sleep(left)


class _Wire(torch.autograd.Function):
    """A sleeping chunk's last node: a (B, T) tensor widened into a fresh one of the next
    stage's shape, (B, T, W) or (B, T, 256) logits; its backward (the first of the chunk's)
    starts the backward clock."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, clock: _BackwardClock, width: int) -> torch.Tensor:
        ctx.clock = clock
        out = h.unsqueeze(-1).expand(*h.shape, width)  # (B, T, width), a view
        return out.clone(memory_format=torch.contiguous_format)  # the stage checks strides

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        ctx.clock.deadline = time.perf_counter()
        return grad.sum(-1), None, None  # (B, T)


class _InputSleep(torch.autograd.Function):
    """Identity on the input's path; its backward (I) ends ``input_s`` after the chunk's
    backward began (after the W slept before it in a whole backward), whatever ran between."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, clock: _BackwardClock, input_s: float) -> torch.Tensor:
        ctx.clock, ctx.input_s = clock, input_s
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        ctx.clock.deadline += ctx.input_s
        _sleep_until(ctx.clock.deadline)
        return grad, None, None


class _WeightSleep(torch.autograd.Function):
    """Identity on the weight's path; its backward (W) sleeps ``weight_s``."""

    @staticmethod
    def forward(
        ctx: Any, weight: torch.Tensor, clock: _BackwardClock, weight_s: float
    ) -> torch.Tensor:
        ctx.clock, ctx.weight_s = clock, weight_s
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        ctx.clock.deadline += ctx.weight_s  # a whole backward (B) lasts both halves
        time.sleep(ctx.weight_s)
        # (W,) from the sum's backward is one element expanded; torch adds later micro-batches'
        # gradients into the first one in place, which an expanded tensor cannot take
        return grad.contiguous(), None, None


class EmulatedChunk(nn.Module):
    """One stage chunk: computes on ``device`` while ``is_real``, else sleeps its ``costs``.

    Pipeline tensors are CPU float32: (B, T) int64 tokens into the first stage, (B, T, W) wire
    activations between stages (W = ``wire_d_model``), (B, T, 256) logits out of the last
    (float32 on the device instead when a real last chunk has ``logits_on_device``: they go
    to the loss only, never on the wire).

    [Note: fixed placement]
    The real chunk lives on the emulation device in its dtype for the whole run, while the rank
    moves "its modules" to the pipeline device (the CPU); ``_apply`` (what ``.to``, ``.float``
    and friends call) is therefore a no-op here.

    [Note: a sleeping chunk lasts what the real one did]
    A sleeping chunk still builds tensors of the wire's shape: a (B, T, W) output, the last
    stage's (B, T, 256) logits, their gradients. On some hosts each such megabyte-sized tensor
    costs milliseconds (an H200 host measured 2-6 ms per sleeping forward with zero sleeps,
    against 0.5-1.5 ms on a laptop-class CPU), and a sleep *on top of* that work made every
    peer action 5-10 ms longer than the real action it stands for, so the real rank waited on
    its peers far beyond the schedule. So a sleeping forward sleeps until ``forward_s`` after
    it began, and the input half of its backward (``_InputSleep``) until ``input_s`` after the
    backward began (``_Wire``, the forward's last node), whatever work ran in between; the
    weight half (``_WeightSleep``) does no work but its sleep. The host's costs around the
    chunk (torch's stage, gloo) are not absorbed: the real rank pays them too.
    """

    def __init__(
        self,
        chunk: StageChunk,
        *,
        d_model: int,
        wire_d_model: int,
        device: torch.device,
        dtype: torch.dtype,
        logits_on_device: bool = False,
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
        # a real last chunk hands back its logits on the device, where the loss then runs
        self.logits_on_device = logits_on_device and self.last
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
        """The chunk on the device: (B, T) tokens or (B, T, W) → (B, T, W) or (B, T, 256).

        Its output is a CPU tensor (the copy back waits for the device), except a last chunk's
        logits with ``logits_on_device``: they stay on the device for the loss, which then
        closes the forward (``Emulation.loss``).
        """
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
        if self.logits_on_device:  # the loss runs on the device (Emulation.loss)
            return out.float()
        result: torch.Tensor = out.to("cpu", torch.float32)  # synchronises with the device
        return result

    @property
    def chunk_dtype(self) -> torch.dtype:
        return next(self.chunk.parameters()).dtype

    def _forward_sleep(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T) tokens or (B, T, W) → (B, T, W) or (B, T, 256), lasting the calibrated costs.

        The graph (see [Note: a sleeping chunk lasts what the real one did])::

            x ─ _InputSleep ─ (B, T) ─┬─ add ─ _Wire ─ y        input path: F, then I
            sleep_weight ─ _WeightSleep ─ sum ─┘                weight path: W

        The add, where torch's W resumes the backward, is a small built-in op (torch 2.11's W
        cannot resume from a custom autograd node).
        """
        t0 = time.perf_counter()
        costs = self.costs
        assert costs is not None
        clock = _BackwardClock()
        if self.first:
            x = x.float()  # (B, T)
        if torch.is_grad_enabled() and not x.requires_grad:
            x = x.detach().requires_grad_()  # keep a backward path on the first stage
        h: torch.Tensor = _InputSleep.apply(x, clock, costs.input_s)  # type: ignore[no-untyped-call]
        if not self.first:
            h = h[..., 0]  # (B, T): the wire's first channel carries on
        if costs.weight_s > 0:  # the weight's path, whose backward is W
            w: torch.Tensor = _WeightSleep.apply(self.sleep_weight, clock, costs.weight_s)  # type: ignore[no-untyped-call]
            h = h + w.sum()  # (B, T)
        width = VOCAB if self.last else self.wire_d_model
        y: torch.Tensor = _Wire.apply(h, clock, width)  # type: ignore[no-untyped-call]
        _sleep_until(t0 + costs.forward_s)
        return y

    def extra_repr(self) -> str:
        return f"index={self.chunk.index}, device={self.device}, costs={self.costs}"
