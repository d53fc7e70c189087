"""Every reach into torch's private or positional API, in one place, for torch 2.13.0.

freeride_lab builds on ``torch.distributed.pipelining`` and torchrun in ways their public API
does not cover: it builds a schedule's plan against stand-in stages (torch's constructors read a
handful of ``_PipelineStageBase`` attributes), reads the plan's private ``_Action`` tuples,
decodes ``PipelineStage.backward_one_chunk``'s positional arguments, relies on torch computing
the loss in ``_PipelineSchedule._maybe_compute_loss`` right after a forward, runs a zero-bubble
schedule's two backward halves the way a stage does (``_backward.stage_backward_input`` and
``stage_backward_weight``, to time them apart), and asks torchrun's argument parser
(``_actions``) which options it knows. A torch upgrade can change any of these;
``tests/core/test_torch_compat.py`` pins the supported version and checks every name and
signature below, so an upgrade breaks this module and that test, not the timing code.

Importing this module does not import torch (``core`` stays torch-free at import); each function
imports what it needs.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "PRIVATE_NAMES",
    "SUPPORTED_TORCH",
    "StandInStage",
    "action_parts",
    "backward_input",
    "backward_weight",
    "is_full_backward",
    "plan_order",
    "schedule_class",
    "torchrun_option_strings",
]

#: The torch release these adapters are written and tested against.
SUPPORTED_TORCH = "2.13.0"

#: Private names of ``torch.distributed.pipelining`` read here, as ``(module, attribute)``.
PRIVATE_NAMES: tuple[tuple[str, str], ...] = (
    ("torch.distributed.pipelining.stage", "_PipelineStageBase"),
    ("torch.distributed.pipelining.schedules", "_Action"),
    ("torch.distributed.pipelining.schedules", "_ComputationType"),
    ("torch.distributed.pipelining.schedules", "_PipelineSchedule"),
    ("torch.distributed.pipelining._backward", "stage_backward_input"),
    ("torch.distributed.pipelining._backward", "stage_backward_weight"),
)

# What StandInStage provides: the _PipelineStageBase attributes the schedules' constructors
# read to build ``pipeline_order`` (the test checks that each exists on a real stage).
STAND_IN_ATTRIBUTES = (
    "stage_index",
    "num_stages",
    "group_rank",
    "group_size",
    "is_first",
    "is_last",
    "submod",
    "stage_index_to_group_rank",
)

# Positional parameters of the stage verbs TimedPipelineStage overrides (after ``self``).
BACKWARD_ONE_CHUNK_PARAMS = ("bwd_chunk_id", "loss", "full_backward", "last_backward")
STAGE_VERBS = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")


class StandInStage:
    """Just enough of torch's private ``_PipelineStageBase`` for a schedule's constructor to
    build its plan (``pipeline_order``), without a model, a device or a process group."""

    def __init__(self, index: int, num_stages: int, rank: int, ranks: int) -> None:
        self.stage_index = index
        self.num_stages = num_stages
        self.group_rank = rank
        self.group_size = ranks
        self.is_first = index == 0
        self.is_last = index == num_stages - 1
        self.submod = None
        self.stage_index_to_group_rank: dict[int, int] = {}


def schedule_class(torch_class: str) -> Any:
    """Torch's schedule class named ``torch_class`` (e.g. ``"Schedule1F1B"``), or None."""
    from torch.distributed.pipelining import schedules

    return getattr(schedules, torch_class, None)


def plan_order(
    cls: Any, stages: StandInStage | Sequence[StandInStage], microbatches: int
) -> dict[int, list[Any]]:
    """``cls(stages, microbatches).pipeline_order``: rank → torch's ``_Action`` or None.

    ``stages`` is one stand-in for single-stage schedules, a list for multi-stage ones.
    """
    order: dict[int, list[Any]] = cls(stages, microbatches).pipeline_order
    return order


def action_parts(action: Any) -> tuple[str, int, int | None] | list[Any]:
    """One of torch's ``_Action`` tuples as ``(letter, stage_index, microbatch_index)``, or the
    list of its sub-actions for an overlapped action (DualPipeV's OVERLAP_F_B). The letter is
    the computation type's value: F, B, I, W for compute, other strings (communication,
    REDUCE_GRAD, ...) for the rest, whose micro-batch may be None."""
    subs = getattr(action, "sub_actions", None)
    if subs:
        return list(subs)
    kind = action.computation_type
    letter = str(getattr(kind, "value", kind))
    return letter, action.stage_index, action.microbatch_index


def is_full_backward(args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """Whether a ``backward_one_chunk(bwd_chunk_id, *args, **kwargs)`` call is a full backward
    (B) rather than its input half (I): torch passes ``full_backward`` by keyword or as the
    second argument after the chunk id (``BACKWARD_ONE_CHUNK_PARAMS``), default True."""
    full = kwargs.get("full_backward", args[1] if len(args) > 1 else True)
    return bool(full)


def backward_input(
    outputs: Sequence[Any], output_grads: Sequence[Any], inputs: Sequence[Any], weights: Any
) -> list[dict[str, Any]]:
    """A stage's I action, as torch runs it for a zero-bubble schedule: the gradients of
    ``inputs`` from ``outputs`` and ``output_grads`` (computed and dropped: this is for
    timing), keeping the graph for the weight half. Returns what ``backward_weight`` needs
    (torch's param groups).
    """
    from torch.distributed.pipelining._backward import stage_backward_input

    _, groups = stage_backward_input(list(outputs), list(output_grads), list(inputs), weights)
    return list(groups)


def backward_weight(weights: Any, param_groups: list[dict[str, Any]]) -> None:
    """The W action after ``backward_input``: the gradients of ``weights`` (the same module's
    parameters) from the param groups it returned."""
    from torch.distributed.pipelining._backward import stage_backward_weight

    stage_backward_weight(weights, param_groups)


@functools.cache
def torchrun_option_strings() -> frozenset[str]:
    """Options the installed torchrun understands (they vary across torch releases), read from
    its argument parser's private ``_actions``."""
    from torch.distributed.run import get_args_parser

    return frozenset(o for a in get_args_parser()._actions for o in a.option_strings)
