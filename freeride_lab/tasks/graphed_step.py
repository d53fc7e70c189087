"""A classifier's training step replayed as a CUDA graph: one launch instead of hundreds.

[Note: graphed steps]
A ResNet-18 step on 16 images takes 10-13 ms on an H200 against 17 ms for 64: the host's
kernel launches, not the GPU, set the pace of a small step, so the slices that would fit the
short bubbles and the tails of the long ones ([Note: micro-batches] in ``tasks.vision``) cost
almost as much as the whole batch. Captured once as a CUDA graph, a step is one launch and
runs at the GPU's pace.

``GraphedSteps`` keeps one graph per (slice size, last slice of the batch): forward,
cross-entropy (summed, scaled by 1/batch_size) and backward into the parameters' gradients,
which are allocated once and accumulate across the slices of a batch, and, in the last slice's
graph, Adam's step and the zeroing of those gradients. The slices are copied into static input
buffers before each replay. The graphs share one memory pool and run one after another on the
caller's stream. The task keeps every graph's numbers equal to its eager step's: the same
slices, the same loss scaling, the same optimizer; only BatchNorm and dropout kernels may
differ in the last bits.

Capture records launches without running them; a graph is captured the first time its key is
met and replayed at once, or ahead of use (``prepare``: a task whose steps take slices of
several sizes captures every size at once, so that no later step pays a capture and the
profile's peak memory holds the largest graph's). Capturing needs a warm optimizer (Adam's
state exists) and a device that has run the step eagerly (cuDNN has picked its algorithms),
so the task runs its first batch on a device eagerly (``arm``). Adam runs with
``capturable=True`` while graphed: its step counts live on the device. Anything that replaces
the tensors a graph refers to (moving the task, loading a state dict) drops the graphs
(``reset``); the next batch recaptures them.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GraphedSteps", "set_capturable"]


def set_capturable(optimizer: torch.optim.Optimizer, device: torch.device, on: bool) -> None:
    """Switch ``optimizer`` (Adam) to device-side step counts (``on``) or back to host ones.

    A captured Adam step may not read its step count on the host; eager Adam on the CPU may not
    hold it on a GPU. The count moves with the flag, as a float32 scalar.
    """
    for group in optimizer.param_groups:
        group["capturable"] = on
    for state in optimizer.state.values():
        step = state.get("step")
        if isinstance(step, torch.Tensor):
            state["step"] = step.to(device if on else "cpu", dtype=torch.float32)


class GraphedSteps:
    """The CUDA graphs of one classifier's training step (see [Note: graphed steps]).

    Args:
        model: the network, on a CUDA device.
        optimizer: its Adam, whose state exists (one eager step has run).
        batch_size: images per optimizer step; a slice's summed loss is divided by it.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, batch_size: int) -> None:
        self.model = model
        self.optimizer = optimizer
        self.batch_size = batch_size
        self.device = next(model.parameters()).device
        self._pool = torch.cuda.graph_pool_handle()
        self._graphs: dict[tuple[int, bool], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._inputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        params = [p for p in model.parameters() if p.requires_grad]
        for p in params:  # static gradients: allocated once, outside every graph's pool
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            else:
                p.grad.zero_()
        set_capturable(optimizer, self.device, True)

    def __repr__(self) -> str:
        keys = ", ".join(f"{n}{'/last' if last else ''}" for n, last in sorted(self._graphs))
        return f"GraphedSteps(device={str(self.device)!r}, graphs=[{keys}])"

    @property
    def captured(self) -> int:
        """How many graphs exist (one per slice size and last-slice flag met so far)."""
        return len(self._graphs)

    def step(self, x: torch.Tensor, y: torch.Tensor, *, last: bool) -> torch.Tensor:
        """Run one slice ``x`` (b, 3, H, W), labels ``y`` (b,): forward and backward, and with
        ``last`` Adam's step; returns the slice's mean loss (a tensor the next replay of the
        same graph overwrites)."""
        size = len(y)
        sx, sy = self._static_inputs(size, x, y)
        sx.copy_(x, non_blocking=True)
        sy.copy_(y, non_blocking=True)
        if (size, last) not in self._graphs:
            self._graphs[size, last] = self._capture(sx, sy, last)
        graph, loss = self._graphs[size, last]
        graph.replay()
        return loss

    def prepare(self, keys: Iterable[tuple[int, bool]], x: torch.Tensor, y: torch.Tensor) -> None:
        """Capture the graphs of ``keys`` (slice size, last slice of the batch) not captured
        yet, without running them; ``x`` (n, 3, H, W) and ``y`` (n,) give the shapes beyond
        the first dimension, the dtypes and the device."""
        for size, last in sorted(set(keys)):
            if (size, last) not in self._graphs:
                sx, sy = self._static_inputs(size, x, y)
                self._graphs[size, last] = self._capture(sx, sy, last)

    def _static_inputs(
        self, size: int, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The input buffers of slices of ``size`` images, made like ``x`` and ``y``."""
        if size not in self._inputs:
            self._inputs[size] = (
                torch.empty((size, *x.shape[1:]), dtype=x.dtype, device=x.device),
                torch.empty((size, *y.shape[1:]), dtype=y.dtype, device=y.device),
            )
        return self._inputs[size]

    def _capture(
        self, sx: torch.Tensor, sy: torch.Tensor, last: bool
    ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Record one slice's step on the static inputs ``sx``, ``sy``; nothing runs yet."""
        graph = torch.cuda.CUDAGraph()
        # thread_local: the task host's other threads may query events while this one captures
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            logits = self.model(sx)  # (b, classes)
            loss = F.cross_entropy(logits, sy, reduction="sum") / self.batch_size
            loss.backward()  # type: ignore[no-untyped-call]
            if last:
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=False)
            mean = loss.detach() * (self.batch_size / len(sy))
        return graph, mean
