"""What a training rank builds before its first step, from its ``RunConfig``: its modules, the
(timed or plain) ``PipelineStage`` around each, the schedule, the batches, the loss and the
live bubble-edge receiver.

``pipeline.runner.RankRunner.setup`` calls these in order; they hold no state of their own.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterator, Sequence
from itertools import pairwise
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage

from freeride_lab.core.bubble_prediction import Predictor
from freeride_lab.core.config import RunConfig
from freeride_lab.core.runtime_options import PREDICTORS
from freeride_lab.core.schedule import Schedule
from freeride_lab.core.torch_compat import schedule_class
from freeride_lab.io.rundir import RunDir
from freeride_lab.pipeline.data import SyntheticBatches, TextBatches
from freeride_lab.pipeline.models import GPTConfig, build_stage_chunks
from freeride_lab.pipeline.synthetic import build_sleep_chunks
from freeride_lab.pipeline.timed_stage import (
    ActionRecorder,
    BubbleEdges,
    SettledStage,
    TimedPipelineStage,
)

log = logging.getLogger(__name__)

__all__ = [
    "build_modules",
    "check_torch_supports_layout",
    "example_io",
    "gpt_chunks",
    "loss_function",
    "make_batches",
    "make_edges",
    "make_predictor",
    "make_schedule",
    "make_stage",
    "text_loss",
]

Batches = Iterator[tuple[torch.Tensor, torch.Tensor]]


def check_torch_supports_layout(
    stage_ids: Sequence[int], *, rank: int, schedule: str, backend: str | None
) -> None:
    """Refuse a layout that older torch cannot run on gloo, before any process group.

    [Note: adjacent stages on one rank]
    When a rank holds two adjacent stages (V schedules; or any multi-stage schedule on one
    rank), torch 2.13 hands the activation over locally. Torch 2.11 sent it to the same
    rank through gloo instead, which fails with "Pair is not connected" (seen with ZBV,
    DualPipeV and a one-rank Interleaved1F1B); 2.13 runs all seven schedules on gloo.
    """
    ids = list(stage_ids)
    adjacent = any(b - a == 1 for a, b in pairwise(ids))
    version = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    if adjacent and backend == "gloo" and version < (2, 13):
        raise RuntimeError(
            f"rank {rank} holds adjacent stages {ids} ({schedule}); torch "
            f"{torch.__version__} on gloo sends between them through itself and fails "
            "('Pair is not connected'): use torch >= 2.13, NCCL, or a loop-style schedule "
            "with more ranks"
        )


def build_modules(config: RunConfig, stage_ids: Sequence[int], n_stages: int) -> list[nn.Module]:
    """The rank's stage chunks, one per index in ``stage_ids``: sleep-timed modules for the
    synthetic workload, the GPT's chunks for the text one (emulate mode builds its own)."""
    if config.workload == "synthetic":
        costs = config.stage_costs_ms()  # per global stage: each chunk its own costs
        return list(build_sleep_chunks(config.d_model, [costs[s] for s in stage_ids]))
    return gpt_chunks(config, stage_ids, n_stages, d_model=config.d_model, heads=config.heads)


def gpt_chunks(
    config: RunConfig, stage_ids: Sequence[int], n_stages: int, *, d_model: int, heads: int
) -> list[nn.Module]:
    """The GPT's chunks ``stage_ids`` of ``n_stages``, ``d_model`` wide with ``heads`` heads
    and ``config``'s context, depth and seed: the text workload builds them at the config's
    width, emulate mode at its own."""
    gpt = GPTConfig(
        seq_len=config.seq_len,
        layers=config.layers,
        d_model=d_model,
        heads=heads,
        seed=config.seed,
    )
    chunks = build_stage_chunks(gpt, n_stages, only=stage_ids)
    return [chunks[i] for i in stage_ids]


def example_io(
    config: RunConfig, stage: int, n_stages: int, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Static example input/output of a stage for one micro-batch.

    [Note: static stage metadata]
    Given these, torch skips shape inference (which hangs with backward on gloo in torch
    2.13). In static mode torch copies each example's ``requires_grad`` into the metadata:
    an activation example without ``requires_grad=True`` makes the received activation a
    non-grad tensor and drops the output-gradient receive, so the previous stage backs
    up with a ``None`` gradient. Float activations and outputs therefore require grad.
    """
    mb, T, D = config.microbatch_size, config.seq_len, config.d_model
    hidden = torch.empty(mb, T, D, dtype=dtype, device=device, requires_grad=True)  # (mb, T, D)
    if config.workload == "synthetic":
        return hidden, hidden
    tokens = torch.empty(mb, T, dtype=torch.int64, device=device)  # (mb, T)
    logits = torch.empty(mb, T, 256, dtype=dtype, device=device, requires_grad=True)  # (mb, T, V)
    return (
        tokens if stage == 0 else hidden,
        logits if stage == n_stages - 1 else hidden,
    )


def make_stage(
    module: nn.Module,
    stage: int,
    n_stages: int,
    device: torch.device,
    example: tuple[torch.Tensor, torch.Tensor],
    *,
    recorder: ActionRecorder | None,
    settle: Callable[[], None] | None = None,
) -> PipelineStage:
    """A ``TimedPipelineStage`` reporting to ``recorder``, or a plain stage (None).

    ``settle``: called at the end of every W (``SettledStage``, [Note: settled W]).
    """
    inp, out = example
    args = (module, stage, n_stages, device)
    inputs, outputs = (inp,), (out,)
    if recorder is not None:
        return TimedPipelineStage(
            *args, input_args=inputs, output_args=outputs, recorder=recorder, settle=settle
        )
    if settle is not None:
        return SettledStage(*args, input_args=inputs, output_args=outputs, settle=settle)
    return PipelineStage(*args, input_args=inputs, output_args=outputs)


def make_schedule(
    spec: Schedule,
    stages: list[PipelineStage],
    *,
    microbatches: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Any:
    """Torch's schedule object for ``spec`` over this rank's stages."""
    cls = schedule_class(spec.torch_class)
    if cls is None:
        raise RuntimeError(
            f"schedule {spec.name} ({spec.torch_class}) is not in torch "
            f"{torch.__version__}; pick another schedule or upgrade torch"
        )
    if spec.multi:
        return cls(stages, n_microbatches=microbatches, loss_fn=loss_fn)
    return cls(stages[0], n_microbatches=microbatches, loss_fn=loss_fn)


def make_batches(
    config: RunConfig, *, has_first: bool, has_last: bool, dtype: torch.dtype
) -> Batches | None:
    """The step's inputs and targets, for a rank holding the first or the last stage."""
    if not (has_first or has_last):
        return None  # middle ranks get activations, not data
    batch = config.microbatch_size * config.microbatches
    if config.workload == "synthetic":
        return SyntheticBatches(
            seq_len=config.seq_len,
            batch=batch,
            d_model=config.d_model,
            seed=config.seed,
            dtype=dtype,
        )
    return TextBatches(
        seq_len=config.seq_len, batch=batch, seed=config.seed, text_path=config.text_path
    )


def make_edges(
    spec: str | None, *, run_dir: RunDir, rank: int, clock_offset_ns: int
) -> BubbleEdges | None:
    """The live bubble-edge receiver from a ``"module:callable"`` factory, or None."""
    if not spec:
        return None
    module_name, _, attr = str(spec).partition(":")
    if not attr:
        raise ValueError(
            f"edges_factory={spec!r} is not 'module:callable'; "
            "e.g. 'freeride_lab.sidetasks.client:open_edges'"
        )
    factory = getattr(importlib.import_module(module_name), attr)
    edges: BubbleEdges = factory(run_dir=run_dir, rank=rank)
    set_offset = getattr(edges, "set_clock_offset", None)
    if callable(set_offset):  # edges carry run-clock times, like the events
        set_offset(clock_offset_ns)
    return edges


def make_predictor(kind: str = "min") -> Predictor:
    """The bubble-end predictor the live edges carry (``RuntimeOptions.predictor``): "min",
    FreeRide's minimum of a slot's last five; "feedback", ``core.bubble_prediction``'s;
    "peers", the awaited peer's published end, else the minimum of five
    (``core.peer_prediction``)."""
    from freeride_lab.core.bubble_prediction import FeedbackSlotPredictor
    from freeride_lab.core.bubbles import SlotPredictor
    from freeride_lab.core.peer_prediction import AwaitedPeerPredictor

    if kind == "feedback":
        return FeedbackSlotPredictor()
    if kind == "peers":
        return AwaitedPeerPredictor(SlotPredictor(k=5, method="min"))
    if kind == "min":
        return SlotPredictor(k=5, method="min")
    raise ValueError(f"predictor={kind!r}; valid: {', '.join(PREDICTORS)}")


def loss_function(config: RunConfig) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The last stage's loss for the run's workload."""
    return text_loss if config.workload == "text" else _synthetic_loss


def text_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-byte cross-entropy: logits (B, T, V), targets (B, T) int64 (moved to the
    logits' device)."""
    targets = targets.to(logits.device)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _synthetic_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error on (B, T, D) tensors (its value is meaningless; its backward is not)."""
    return F.mse_loss(output.float(), target.float())
