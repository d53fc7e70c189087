"""The torch internals ``core.torch_compat`` adapts to are still there, as it expects them.

The project supports one torch release (``SUPPORTED_TORCH``). When torch is upgraded, the first
test says so, and the others name each private class, attribute or positional signature that
moved; ``freeride_lab/core/torch_compat.py`` is the one module to fix.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage

from freeride_lab.core import torch_compat
from freeride_lab.core.schedule import SCHEDULES
from freeride_lab.core.torch_compat import (
    BACKWARD_ONE_CHUNK_PARAMS,
    PRIVATE_NAMES,
    STAGE_VERBS,
    STAND_IN_ATTRIBUTES,
    SUPPORTED_TORCH,
    StandInStage,
    action_parts,
    backward_input,
    backward_weight,
    is_full_backward,
    plan_order,
    schedule_class,
    torchrun_option_strings,
)


def test_the_installed_torch_is_the_supported_release() -> None:
    installed = torch.__version__.split("+")[0]
    assert installed == SUPPORTED_TORCH, (
        f"torch {installed} is installed but freeride_lab supports {SUPPORTED_TORCH}: check "
        "freeride_lab/core/torch_compat.py against it (the tests below name what moved), "
        "then raise SUPPORTED_TORCH"
    )


@pytest.mark.parametrize(("module", "name"), PRIVATE_NAMES, ids=[n for _, n in PRIVATE_NAMES])
def test_each_private_torch_name_the_adapters_read_still_exists(module: str, name: str) -> None:
    assert hasattr(importlib.import_module(module), name), f"{module}.{name} is gone"


def test_torch_actions_have_the_fields_and_letters_action_parts_reads() -> None:
    from torch.distributed.pipelining.schedules import _Action, _ComputationType

    assert {"stage_index", "computation_type", "microbatch_index", "sub_actions"} <= set(
        _Action._fields
    )
    assert {"F", "B", "I", "W"} <= {kind.value for kind in _ComputationType}
    forward = _Action(2, _ComputationType.FORWARD, 3)
    assert action_parts(forward) == ("F", 2, 3)


def test_every_schedule_builds_its_plan_against_stand_in_stages() -> None:
    for spec in SCHEDULES.values():
        cls = schedule_class(spec.torch_class)
        assert cls is not None, f"{spec.torch_class} is not in torch {torch.__version__}"
        v = spec.resolve_chunks(None)
        ranks = 2
        if spec.multi:
            ids = [0, 3] if spec.style == "v" else [0, 2]
            stages: StandInStage | list[StandInStage] = [
                StandInStage(i, ranks * v, 0, ranks) for i in ids
            ]
        else:
            stages = StandInStage(0, ranks, 0, ranks)
        order = plan_order(cls, stages, 4)
        assert any(a is not None for a in order[0]), spec.name


@pytest.fixture
def one_rank_group() -> Iterator[None]:
    """A one-process gloo group in this process, destroyed afterwards."""
    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.usefixtures("one_rank_group")
def test_the_stand_in_stage_has_every_attribute_a_real_stage_gives_a_schedule() -> None:
    x = torch.empty(2, 4, requires_grad=True)  # (B, D)
    real = PipelineStage(
        torch.nn.Linear(4, 4), 0, 1, torch.device("cpu"), input_args=(x,), output_args=(x,)
    )
    stand_in = StandInStage(0, 1, 0, 1)
    for name in STAND_IN_ATTRIBUTES:
        assert hasattr(real, name), f"PipelineStage has no {name!r} any more"
        assert hasattr(stand_in, name), name
    for name in ("stage_index", "num_stages", "group_rank", "group_size", "is_first", "is_last"):
        assert getattr(stand_in, name) == getattr(real, name), name


def test_backward_one_chunk_takes_full_backward_second_after_the_chunk_id() -> None:
    params = list(inspect.signature(PipelineStage.backward_one_chunk).parameters)
    assert tuple(params[1:]) == BACKWARD_ONE_CHUNK_PARAMS, params


@pytest.mark.parametrize("verb", STAGE_VERBS)
def test_each_stage_verb_takes_the_chunk_id_first(verb: str) -> None:
    params = list(inspect.signature(getattr(PipelineStage, verb)).parameters)
    assert params[1].endswith("_chunk_id"), params


def test_a_full_backward_is_read_from_keyword_or_position() -> None:
    assert is_full_backward((), {}) is True
    assert is_full_backward((None, False), {}) is False
    assert is_full_backward((), {"full_backward": False}) is False
    assert is_full_backward((None,), {"last_backward": True}) is True


def test_the_two_backward_halves_give_the_input_gradient_first_and_the_weights_after() -> None:
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    x = torch.randn(4, 3, requires_grad=True)  # (B, D_in)
    y = layer(x)  # (B, D_out)
    g = torch.ones_like(y)
    groups = backward_input([y], [g], [x], layer.parameters())
    assert layer.weight.grad is None  # I computes no weight gradient
    backward_weight(layer.parameters(), groups)
    assert layer.weight.grad is not None
    torch.testing.assert_close(layer.weight.grad, g.T @ x.detach())
    torch.testing.assert_close(layer.bias.grad, g.sum(0))


def test_schedules_still_compute_the_loss_in_their_own_step_after_a_forward() -> None:
    from torch.distributed.pipelining.schedules import _PipelineSchedule

    params = list(inspect.signature(_PipelineSchedule._maybe_compute_loss).parameters)
    assert params[1:5] == ["stage", "output", "target_mbs", "mb_index"], params


def test_torchrun_lists_the_options_the_launcher_passes() -> None:
    known = torchrun_option_strings()
    assert {"--nnodes", "--signals-to-handle", "--shutdown-timeout"} <= known


def test_importing_the_adapters_does_not_import_torch() -> None:
    """``core`` stays torch-free at import: the adapters import torch when called."""
    source = inspect.getsource(torch_compat)
    top_level = [ln for ln in source.splitlines() if ln.startswith(("import ", "from "))]
    assert not [ln for ln in top_level if "torch" in ln], top_level
