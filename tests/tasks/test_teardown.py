"""Teardown of the built-in tasks: their data and model go, and a new ``setup`` starts over."""

from __future__ import annotations

from typing import Any

import pytest

from freeride_lab.tasks.device import HostReturningTask
from freeride_lab.tasks.image import ImageTask
from freeride_lab.tasks.inference import InferenceTask
from freeride_lab.tasks.vision import ResNet18Task

CASES: list[tuple[type[HostReturningTask], dict[str, Any], tuple[str, ...]]] = [
    (
        ImageTask,
        {"source_size": 48, "output_size": 96, "logo_size": 24, "margin": 4, "n_sources": 2},
        ("sources", "logo", "last_output"),
    ),
    (
        ResNet18Task,
        {"batch_size": 4, "image_size": 32, "width_mult": 0.25, "n_batches": 1},
        ("model", "optimizer", "images", "labels", "last_loss"),
    ),
    (
        InferenceTask,
        {"vocab_size": 64, "d_model": 32, "layers": 2, "heads": 4, "batch_size": 3,
         "prompt_len": 10, "gen_len": 6, "prefill_chunk": 10, "decode_per_step": 2},
        ("model", "tokens"),
    ),
]  # fmt: skip


@pytest.mark.parametrize(("cls", "options", "dropped"), CASES, ids=[c[0].__name__ for c in CASES])
def test_teardown_drops_the_data_and_model_and_setup_builds_them_again(
    cls: type[HostReturningTask], options: dict[str, Any], dropped: tuple[str, ...]
) -> None:
    task = cls(**options)
    task.setup()
    task.to_device("cpu")
    task.step()
    task.teardown()
    assert {name: getattr(task, name) for name in dropped} == dict.fromkeys(dropped)
    task.setup()
    task.to_device("cpu")
    assert task.step() > 0
