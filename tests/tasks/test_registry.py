"""The built-in task registry: names, lazy import, reference keys, option errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from freeride_lab.sidetasks.api import IterativeSideTask
from freeride_lab.tasks import BUILTIN_TASKS, REFERENCE_KEYS, load_task_class, task_path

UNITS = {
    "resnet18": "samples",
    "resnet50": "samples",
    "vgg19": "samples",
    "pagerank": "iterations",
    "sgd_mf": "iterations",
    "image": "images",
}


def test_importing_the_registry_does_not_import_torch() -> None:
    code = "import sys, freeride_lab.tasks; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("name", list(BUILTIN_TASKS))
def test_every_builtin_loads_as_an_iterative_task_with_its_unit_and_key(name: str) -> None:
    cls = load_task_class(name)
    assert issubclass(cls, IterativeSideTask)
    assert cls.unit == UNITS[name]
    assert cls.reference_key == REFERENCE_KEYS[name]  # type: ignore[attr-defined]
    assert set(cls.gpu_defaults) <= {f for f in cls(preset="gpu").config.__dataclass_fields__}  # type: ignore[attr-defined, call-arg]


def test_reference_keys_are_the_cost_models_names() -> None:
    assert sorted(REFERENCE_KEYS.values()) == sorted(
        ["resnet18", "resnet50", "vgg19", "pagerank", "sgd", "image"]
    )


def test_names_match_without_regard_to_case() -> None:
    assert task_path("VGG19") == BUILTIN_TASKS["vgg19"]
    assert task_path("SGD-MF") == BUILTIN_TASKS["sgd_mf"]


def test_an_import_path_passes_through() -> None:
    assert task_path("pkg.mod:Task") == "pkg.mod:Task"


def test_an_unknown_name_lists_the_builtins() -> None:
    with pytest.raises(ValueError, match=r"'bert'; built-in: resnet18, resnet50, vgg19"):
        task_path("bert")


def test_a_missing_class_is_an_import_error() -> None:
    with pytest.raises(ImportError, match="'NoSuchTask'"):
        load_task_class("freeride_lab.tasks.image:NoSuchTask")


def test_the_runtime_loader_knows_the_same_builtins() -> None:
    loader = pytest.importorskip("freeride_lab.sidetasks.loader")
    assert dict(loader.BUILTIN_TASKS) == dict(BUILTIN_TASKS)
