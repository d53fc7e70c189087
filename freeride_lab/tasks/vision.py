"""Image-classifier training side tasks: ResNet-18, ResNet-50 and VGG-19 (FreeRide §12).

One ``step()`` is one training iteration (forward, cross-entropy, backward, Adam step) on one
batch of generated images and returns ``batch_size`` samples, or, with ``micro_batches`` k > 1,
one k-th of it (see [Note: micro-batches]). FreeRide trained torchvision
models on MNIST resized to 3x224x224 with batch 64 and Adam lr 1e-3; here the images are made
deterministically from ``seed`` (nothing is downloaded), and the networks come from
``tasks.nets``::

    >>> task = ResNet18Task(batch_size=4, image_size=32, width_mult=0.25)
    >>> task.setup(); task.to_device("cpu")
    >>> task.step()
    4.0

[Note: generated images]
``n_batches`` fixed batches are drawn once in ``setup()`` and cycled. Every class has a smooth
random prototype (a 4x4 pattern upsampled to the image size); an image is its class prototype
plus unit Gaussian noise, so the labels are learnable and the loss falls as training goes on.

[Note: micro-batches]
A step the length of a whole batch (17 ms for ResNet-18 at batch 64 on an H200) does not fit
the shorter bubbles, and the last milliseconds of the longer ones stay empty. With
``micro_batches=k`` the batch is split into k slices (``tensor_split``: sizes differ by at most
one); each ``step()`` runs forward and backward on one slice, summing its loss scaled by
1/batch_size so that the accumulated gradient is the whole batch's mean, and the k-th step
also runs Adam. The model sees the same data and takes the same optimizer steps as with one
step per batch; only BatchNorm's batch statistics are taken per slice, as in any gradient
accumulation. A checkpoint between the slices keeps the accumulated gradients, so a restored
task continues the batch it was in. On a fast GPU a small slice is launch-bound (16 images of
ResNet-18: 10.6 ms eager on an H200); ``cuda_graphs=True`` replays each slice as a CUDA graph
(5.1 ms; [Note: graphed steps] in ``tasks.graphed_step``). With ``fit_slices=True`` a step
may also take several slices at once (``step(size)``: 1, 2, 4, ... slices, never past the
batch's end), so the task host fills a long bubble with large steps and its tail, or a short
bubble, with single slices (``host.iterative`` [Note: step sizes]); the batch and its optimizer
steps stay the same.

[Note: the task's own random stream]
Dropout (VGG-19) draws random numbers. Each step runs inside ``torch.random.fork_rng`` with the
task's saved generator states, which ``state_dict()`` returns, so a task restored from a state
dict takes exactly the steps the original would have, and the process's global RNG is untouched.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from freeride_lab.sidetasks.api import doubling_sizes, host_copies
from freeride_lab.tasks.device import HostReturningTask
from freeride_lab.tasks.graphed_step import GraphedSteps, set_capturable
from freeride_lab.tasks.nets import IMPLS, build_model
from freeride_lab.tasks.options import check_choice, check_float, check_int, resolve_options

__all__ = [
    "ResNet18Task",
    "ResNet50Task",
    "VGG19Task",
    "VGGOptions",
    "VisionOptions",
    "make_image_batches",
]


@dataclass(frozen=True, kw_only=True)
class VisionOptions:
    """Sizes of a classifier-training side task; the defaults are the "cpu" preset's base."""

    batch_size: int = 8  # images per step (FreeRide: 64)
    image_size: int = 64  # px, square inputs (FreeRide: 224)
    num_classes: int = 10  # classifier outputs (FreeRide's MNIST labels: 10)
    width_mult: float = 1.0  # channel-width multiplier; 1.0 is the canonical network
    lr: float = 1e-3  # Adam learning rate (FreeRide: 1e-3)
    n_batches: int = 4  # distinct generated batches, cycled
    seed: int = 0  # weights, images and the task's random stream
    max_steps: int | None = None  # is_finished() after this many batches; None: never
    micro_batches: int = 1  # steps per batch, with gradient accumulation ([Note: micro-batches])
    cuda_graphs: bool = False  # on a GPU, replay each step as a CUDA graph (tasks.graphed_step)
    fit_slices: bool = False  # a step may take 1, 2, 4... slices at once ([Note: micro-batches])
    impl: str = "own"  # "own" (tasks.nets), "torchvision" or "auto"

    def __post_init__(self) -> None:
        check_int("batch_size", self.batch_size)
        check_int("image_size", self.image_size, minimum=32)
        check_int("num_classes", self.num_classes, minimum=2)
        check_float("width_mult", self.width_mult, low=0.0, high=4.0, low_open=True)
        check_float("lr", self.lr, low=0.0, high=1.0, low_open=True)
        check_int("n_batches", self.n_batches)
        check_int("seed", self.seed, minimum=0)
        check_int("max_steps", self.max_steps, optional=True)
        check_int("micro_batches", self.micro_batches)
        if self.micro_batches > 1 and self.batch_size // self.micro_batches < 2:
            raise ValueError(
                f"micro_batches={self.micro_batches} must be at most batch_size // 2 = "
                f"{self.batch_size // 2}: each slice needs two images (BatchNorm's statistics)"
            )
        check_choice("impl", self.impl, IMPLS)
        for name in ("cuda_graphs", "fit_slices"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name}={getattr(self, name)!r} must be True or False")


@dataclass(frozen=True, kw_only=True)
class VGGOptions(VisionOptions):
    """``VisionOptions`` plus VGG's optional BatchNorm."""

    batch_norm: bool = False  # vgg19_bn when True

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.batch_norm, bool):
            raise TypeError(f"batch_norm={self.batch_norm!r} must be True or False")


def make_image_batches(
    *, n_batches: int, batch_size: int, image_size: int, num_classes: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic labelled images (see [Note: generated images]).

    Returns:
        images (n_batches, batch_size, 3, image_size, image_size) float32, about unit scale,
        and labels (n_batches, batch_size) int64 in ``[0, num_classes)``.
    """
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(num_classes, (n_batches, batch_size), generator=g)  # (N, B)
    prototypes = torch.randn(num_classes, 3, 4, 4, generator=g)  # (K, 3, 4, 4)
    images = torch.randn(n_batches, batch_size, 3, image_size, image_size, generator=g)
    for n in range(n_batches):  # upsample per batch: bounded temporary memory
        smooth = F.interpolate(
            prototypes[labels[n]], size=(image_size, image_size), mode="bilinear"
        )  # (B, 3, H, W)
        images[n] += smooth
    return images, labels


class _VisionTask(HostReturningTask):
    """Shared training loop; subclasses name the architecture and their presets."""

    unit: ClassVar[str] = "samples"
    state_dict_is_copy: ClassVar[bool] = True  # host copies (``host_copies``)
    arch: ClassVar[str]
    #: Key of FreeRide's reference throughput (paper §13) for cost accounting.
    reference_key: ClassVar[str]
    options_type: ClassVar[type[VisionOptions]] = VisionOptions
    #: preset="cpu": overrides of the ``VisionOptions`` defaults, sized for a CPU step.
    cpu_defaults: ClassVar[Mapping[str, Any]] = MappingProxyType({})
    #: preset="gpu": FreeRide's sizes (batch 64 at 224², 1000-way head, full width).
    gpu_defaults: ClassVar[Mapping[str, Any]] = MappingProxyType(
        {"batch_size": 64, "image_size": 224, "num_classes": 1000, "width_mult": 1.0,
         "n_batches": 8}
    )  # fmt: skip
    #: ``teardown`` drops model, optimizer and data.
    _dropped = ("_graphs", "model", "optimizer", "images", "labels", "_last_loss")

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        presets = {"cpu": self.cpu_defaults, "gpu": self.gpu_defaults}
        self.config: VisionOptions = resolve_options(
            type(self).__name__, self.options_type, presets, options
        )
        self.steps_done = 0  # whole batches (optimizer steps)
        self.micro_done = 0  # slices of the current batch done ([Note: micro-batches])
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.images: torch.Tensor | None = None  # (N, B, 3, H, W) float32
        self.labels: torch.Tensor | None = None  # (N, B) int64
        self._rng_cpu: torch.Tensor | None = None
        self._rng_cuda: torch.Tensor | None = None
        self._last_loss: torch.Tensor | None = None
        self._graphs: GraphedSteps | None = None  # [Note: graphed steps]
        self._eager_batches = 0  # whole batches run eagerly on the current device

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} batch_size={self.config.batch_size} "
            f"image_size={self.config.image_size} steps_done={self.steps_done} "
            f"device={self.device!r}>"
        )

    @property
    def last_loss(self) -> float | None:
        """Cross-entropy of the latest step (reading it waits for that step on a GPU)."""
        return None if self._last_loss is None else float(self._last_loss)

    def setup(self) -> None:
        """Build the model, Adam and the generated batches in host memory."""
        cfg = self.config
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            self.model = build_model(
                self.arch,
                num_classes=cfg.num_classes,
                width_mult=cfg.width_mult,
                batch_norm=getattr(cfg, "batch_norm", False),
                impl=cfg.impl,
            )
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr)
        self.images, self.labels = make_image_batches(
            n_batches=cfg.n_batches,
            batch_size=cfg.batch_size,
            image_size=cfg.image_size,
            num_classes=cfg.num_classes,
            seed=cfg.seed + 1,
        )
        self._rng_cpu = torch.Generator().manual_seed(cfg.seed + 2).get_state()
        self.device = "cpu"

    def to_device(self, device: str) -> None:
        """Move model, optimizer state and batches onto ``device`` ("cpu", "cuda", "cuda:1")."""
        model, optimizer, images, labels = self._require_setup()
        target = torch.device(device)
        self._drop_graphs()
        model.to(target)
        _move_optimizer_state(optimizer, target)
        self.images, self.labels = images.to(target), labels.to(target)
        self.device = str(target)

    @property
    def step_sizes(self) -> tuple[int, ...]:
        """With ``fit_slices``: 1, 2, 4, ... slices, as many as the batch has left; else (1,)."""
        if not self.config.fit_slices:
            return (1,)
        return doubling_sizes(self.config.micro_batches - self.micro_done)

    def step(self, size: int = 1) -> float:
        """One training iteration on the next batch, or its next slice with ``micro_batches``
        > 1, or its next ``size`` slices with ``fit_slices`` ([Note: micro-batches]); returns
        the samples it trained on.

        Raises:
            ValueError: a ``size`` that is not one of ``step_sizes``.
        """
        if size != 1 and size not in self.step_sizes:
            raise ValueError(f"size={size!r}; valid now: {self.step_sizes}")
        model, optimizer, images, labels = self._require_setup()
        cfg = self.config
        i = self.steps_done % cfg.n_batches
        x, y = images[i], labels[i]  # (B, 3, H, W), (B,)
        if cfg.micro_batches > 1:
            lo, hi = _slice_bounds(cfg.batch_size, cfg.micro_batches, self.micro_done, size)
            x, y = x[lo:hi], y[lo:hi]  # (b, 3, H, W), (b,)
        last = self.micro_done + size == cfg.micro_batches
        graphs = self._graphed()
        with self._own_rng():
            model.train()
            if graphs is not None:
                self._last_loss = graphs.step(x, y, last=last)
                self._advance(size)
                return float(len(y))
            if self.micro_done == 0:
                optimizer.zero_grad(set_to_none=True)
            logits = model(x)  # (b, classes)
            loss = F.cross_entropy(logits, y, reduction="sum") / cfg.batch_size
            loss.backward()  # type: ignore[no-untyped-call]
            if last:
                optimizer.step()
                self._eager_batches += 1
            self._advance(size)
        self._last_loss = loss.detach() * (cfg.batch_size / len(y))  # the slices' mean
        return float(len(y))

    @property
    def warmup_steps(self) -> int:
        """With ``cuda_graphs`` on a GPU: two batches' steps (one eager, one capturing), which
        with ``fit_slices`` are two steps of the largest size, the ones a profile samples."""
        cfg = self.config
        if not (cfg.cuda_graphs and torch.device(self.device).type == "cuda"):
            return 0
        return 2 if cfg.fit_slices else 2 * cfg.micro_batches

    def _advance(self, slices: int = 1) -> None:
        """Count ``slices`` slices done; the batch's last one completes an optimizer step."""
        self.micro_done += slices
        if self.micro_done == self.config.micro_batches:
            self.micro_done = 0
            self.steps_done += 1

    def _graphed(self) -> GraphedSteps | None:
        """The step's graphs once they may be used: ``cuda_graphs`` on, a CUDA device, one
        eager batch done there, and a batch boundary ([Note: graphed steps]); else None."""
        cfg = self.config
        if self._graphs is None and (
            cfg.cuda_graphs
            and torch.device(self.device).type == "cuda"
            and self._eager_batches > 0
            and self.micro_done == 0
        ):
            model, optimizer, images, labels = self._require_setup()
            self._graphs = GraphedSteps(model, optimizer, cfg.batch_size)
            if cfg.fit_slices:  # every size now, not in a later bubble ([Note: graphed steps])
                self._graphs.prepare(_graph_keys(cfg), images[0], labels[0])
        return self._graphs

    def _drop_graphs(self) -> None:
        """Forget the graphs (they refer to tensors about to be replaced) and put Adam's step
        counts back on the host; the next batch on a GPU runs eagerly again."""
        self._eager_batches = 0
        if self._graphs is not None:
            self._graphs = None
            if self.optimizer is not None:
                set_capturable(self.optimizer, torch.device(self.device), False)

    def is_finished(self) -> bool:
        """True once ``max_steps`` batches are done (never when it is None)."""
        return self.config.max_steps is not None and self.steps_done >= self.config.max_steps

    def state_dict(self) -> dict[str, Any]:
        """Host copies of model, Adam state, step count and random streams: exact resume."""
        model, optimizer, _, _ = self._require_setup()
        state: dict[str, Any] = host_copies(
            {
                "progress": self.progress,
                "steps_done": self.steps_done,
                "micro_done": self.micro_done,
                # mid-batch: the gradients accumulated so far ([Note: micro-batches])
                "grads": [p.grad for p in model.parameters()] if self.micro_done else None,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "rng_cpu": self._rng_cpu,
                "rng_cuda": self._rng_cuda,
            }
        )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict()`` (after ``setup()``, on any device)."""
        model, optimizer, _, _ = self._require_setup()
        self._drop_graphs()
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        set_capturable(optimizer, torch.device(self.device), False)  # saved while graphed?
        self.progress = float(state.get("progress", 0.0))
        self.steps_done = int(state["steps_done"])
        self.micro_done = int(state.get("micro_done", 0))
        grads = state.get("grads")
        for p, g in zip(model.parameters(), grads or [], strict=bool(grads)):
            p.grad = None if g is None else g.to(p.device)
        self._rng_cpu = state["rng_cpu"].clone()
        rng_cuda = state.get("rng_cuda")
        self._rng_cuda = None if rng_cuda is None else rng_cuda.clone()

    def _require_setup(
        self,
    ) -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor]:
        if (
            self.model is None
            or self.optimizer is None
            or self.images is None
            or self.labels is None
        ):
            raise RuntimeError(f"{type(self).__name__} has no model yet; call setup() first")
        return self.model, self.optimizer, self.images, self.labels

    @contextmanager
    def _own_rng(self) -> Iterator[None]:
        """Run the body on the task's random streams (see [Note: the task's own random stream])."""
        device = torch.device(self.device)
        cuda = device.type == "cuda"
        index = (device.index or 0) if cuda else None
        with torch.random.fork_rng(devices=[index] if cuda else []):
            assert self._rng_cpu is not None  # set by setup()
            torch.set_rng_state(self._rng_cpu)
            if cuda:
                if self._rng_cuda is None:
                    g = torch.Generator(device=device).manual_seed(self.config.seed + 3)
                    self._rng_cuda = g.get_state()
                torch.cuda.set_rng_state(self._rng_cuda, device)
            yield
            self._rng_cpu = torch.get_rng_state()
            if cuda:
                self._rng_cuda = torch.cuda.get_rng_state(device)


class ResNet18Task(_VisionTask):
    """Train ResNet-18 on generated images; one step = one batch (unit: samples)."""

    arch = "resnet18"
    reference_key = "resnet18"
    cpu_defaults = MappingProxyType({"width_mult": 1.0})


class ResNet50Task(_VisionTask):
    """Train ResNet-50 on generated images; one step = one batch (unit: samples)."""

    arch = "resnet50"
    reference_key = "resnet50"
    cpu_defaults = MappingProxyType({"width_mult": 0.5})


class VGG19Task(_VisionTask):
    """Train VGG-19 (``batch_norm`` option) on generated images; one step = one batch."""

    arch = "vgg19"
    reference_key = "vgg19"
    options_type = VGGOptions
    cpu_defaults = MappingProxyType({"width_mult": 0.25})


def _graph_keys(cfg: VisionOptions) -> set[tuple[int, bool]]:
    """Every (images, last slice of the batch) a ``fit_slices`` step can take.

    >>> sorted(_graph_keys(VisionOptions(batch_size=8, micro_batches=4, fit_slices=True)))
    [(2, False), (2, True), (4, False), (4, True), (8, True)]
    """
    keys = set()
    k = cfg.micro_batches
    for first in range(k):
        for size in (2**j for j in range((k - first).bit_length())):
            lo, hi = _slice_bounds(cfg.batch_size, k, first, size)
            keys.add((hi - lo, first + size == k))
    return keys


def _slice_bounds(batch_size: int, slices: int, first: int, count: int) -> tuple[int, int]:
    """Where slices ``first`` to ``first + count - 1`` of a batch in ``slices`` lie: the same
    cut as ``tensor_split`` (the first ``batch_size % slices`` slices one longer).

        >>> _slice_bounds(10, 4, 0, 1), _slice_bounds(10, 4, 1, 2), _slice_bounds(10, 4, 3, 1)
        ((0, 3), (3, 8), (8, 10))
    """
    base, extra = divmod(batch_size, slices)

    def edge(k: int) -> int:
        return k * base + min(k, extra)

    return edge(first), edge(first + count)


def _move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Move optimizer state tensors to ``device``; Adam's scalar ``step`` stays on the host."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key != "step":
                state[key] = value.to(device)
