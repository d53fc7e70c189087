"""Sleep-timed synthetic stage modules: exact, contention-free action costs on a busy CPU.

A ``SleepStage`` costs ``forward_s`` in its forward, ``input_grad_s`` in the part of its backward
that computes the gradient of its input (torch's I action) and ``weight_grad_s`` in the part
that computes the gradient of its weight (torch's W action). Costs are sleeps, so they do not
depend on how many other processes share the cores.

[Note: putting the sleeps on the right half of the backward]
Zero-bubble schedules split the backward: ``stage_backward_input`` runs
``torch.autograd.grad(outputs, inputs)``, which executes only the autograd nodes on the paths
from the outputs to the inputs, and records the gradients flowing into the nodes where the
weights' paths join those input paths; ``stage_backward_weight`` later resumes from those
nodes towards the weights. The module therefore has two parallel paths that join in one add::

    y = sleep(x; fwd=t_f, bwd=t_i) + sleep(weight; fwd=0, bwd=t_w)    # (B, T, D)

The first path lies between input and output, so its backward (t_i) runs in I; the second path
touches only the weight, so its backward (t_w) runs in W. A full backward (B) runs both.

Torch quirk: on the *first* stage torch skips the I computation entirely and runs a full
backward inside W (``backward_weight_one_chunk``, stage 0 branch), so there I ≈ 0 and
W ≈ t_i + t_w. The first stage's input never needs a gradient, so the module makes it a
gradient-requiring leaf itself; otherwise a full backward would skip the input path and B on
stage 0 would cost only t_w.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["SleepStage", "build_sleep_chunks"]


class _Sleep(torch.autograd.Function):
    """Identity that sleeps ``forward_s`` in forward and ``backward_s`` in backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, forward_s: float, backward_s: float) -> torch.Tensor:
        if forward_s > 0:
            time.sleep(forward_s)
        ctx.backward_s = backward_s
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        if ctx.backward_s > 0:
            time.sleep(ctx.backward_s)
        return grad, None, None


def _sleep(x: torch.Tensor, forward_s: float, backward_s: float) -> torch.Tensor:
    out: torch.Tensor = _Sleep.apply(x, forward_s, backward_s)  # type: ignore[no-untyped-call]
    return out


class SleepStage(nn.Module):
    """A stage chunk with sleep-timed F, I and W costs (seconds) on ``(B, T, d_model)`` tensors."""

    def __init__(
        self, d_model: int, *, forward_s: float, input_grad_s: float, weight_grad_s: float
    ) -> None:
        super().__init__()
        for name, value in (
            ("forward_s", forward_s),
            ("input_grad_s", input_grad_s),
            ("weight_grad_s", weight_grad_s),
        ):
            if value < 0:
                raise ValueError(f"{name}={value} must be >= 0 (seconds of sleep)")
        self.forward_s = forward_s
        self.input_grad_s = input_grad_s
        self.weight_grad_s = weight_grad_s
        self.weight = nn.Parameter(torch.zeros(d_model))  # (D,), broadcast over (B, T, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and not x.requires_grad:
            x = x.detach().requires_grad_()  # first stage: keep the input path in the graph
        a = _sleep(x, self.forward_s, self.input_grad_s)  # (B, T, D), input path
        b = _sleep(self.weight, 0.0, self.weight_grad_s)  # (D,), weight path
        return a + b  # (B, T, D)

    def extra_repr(self) -> str:
        return (
            f"forward_s={self.forward_s}, input_grad_s={self.input_grad_s}, "
            f"weight_grad_s={self.weight_grad_s}"
        )


def build_sleep_chunks(
    d_model: int, costs_ms: Sequence[tuple[float, float, float]]
) -> list[SleepStage]:
    """One sleep stage per entry of ``costs_ms``: its (F, I, W) ms per micro-batch.

    A rank passes its own stage chunks' entries of ``RunConfig.stage_costs_ms()``, so every
    stage chunk sleeps its own costs (one rank's scalar costs split over its chunks, or the
    per-stage values given).
    """
    return [
        SleepStage(d_model, forward_s=f * 1e-3, input_grad_s=i * 1e-3, weight_grad_s=w * 1e-3)
        for f, i, w in costs_ms
    ]
