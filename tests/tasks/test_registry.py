"""The task registry: built-in and registered names, lazy import, reference keys, errors."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from freeride_lab.sidetasks.api import IterativeSideTask
from freeride_lab.tasks import BUILTIN_TASKS, REFERENCE_KEYS, load_task_class, registry, task_path

TOY_TASKS = Path(__file__).resolve().parents[1] / "sidetasks" / "tasks_for_tests.py"


def ref(name: str) -> str:
    """The file reference of a toy task class (no torch)."""
    return f"{TOY_TASKS}:{name}"


UNITS = {
    "resnet18": "samples",
    "resnet50": "samples",
    "vgg19": "samples",
    "pagerank": "iterations",
    "sgd_mf": "iterations",
    "image": "images",
    "inference": "output tokens",
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
    # FreeRide's six carry their reference key; inference, which FreeRide did not run, none
    assert getattr(cls, "reference_key", None) == REFERENCE_KEYS.get(name)
    assert set(cls.gpu_defaults) <= {f for f in cls(preset="gpu").config.__dataclass_fields__}  # type: ignore[attr-defined, call-arg]


@pytest.mark.parametrize("name", list(BUILTIN_TASKS))
def test_every_builtin_refuses_a_step_before_setup_saying_to_call_it(name: str) -> None:
    with pytest.raises(RuntimeError, match=r"setup\(\)"):
        load_task_class(name)().step()


def test_reference_keys_are_the_cost_models_names() -> None:
    assert sorted(REFERENCE_KEYS.values()) == sorted(
        ["resnet18", "resnet50", "vgg19", "pagerank", "sgd", "image"]
    )


def test_names_match_without_regard_to_case() -> None:
    assert task_path("VGG19") == BUILTIN_TASKS["vgg19"]
    assert task_path("SGD-MF") == BUILTIN_TASKS["sgd_mf"]


def test_an_import_path_passes_through() -> None:
    assert task_path("pkg.mod:Task") == "pkg.mod:Task"


def test_an_unknown_name_lists_the_known_names_and_a_near_miss() -> None:
    with pytest.raises(ValueError, match=r"'bert'; known: resnet18, resnet50, vgg19"):
        task_path("bert")
    with pytest.raises(ValueError, match=r"'resnet19'; did you mean 'resnet18'\?"):
        task_path("resnet19")


def test_a_missing_class_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="has no class 'NoSuchTask'"):
        load_task_class("freeride_lab.tasks.image:NoSuchTask")


@pytest.fixture
def counting() -> Iterator[str]:
    """The name ``counting`` registered for a test task file, forgotten afterwards."""
    registry.register("Counting", ref("Counting"))
    yield "Counting"
    registry.unregister("Counting")


def test_a_registered_name_resolves_loads_and_is_listed(counting: str) -> None:
    assert registry.resolve("counting") == ref("Counting")
    assert load_task_class(counting).__name__ == "Counting"
    assert registry.names()[-1] == "Counting"
    assert registry.is_known("COUNTING")
    registry.unregister(counting)
    assert not registry.is_known(counting)
    with pytest.raises(ValueError, match="unknown side task 'counting'"):
        registry.resolve("counting")


def test_a_relative_file_reference_is_registered_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mine.py").write_text("x = 1\n")
    monkeypatch.chdir(tmp_path)
    try:
        assert registry.register("mine", "mine.py:Mine") == f"{tmp_path / 'mine.py'}:Mine"
    finally:
        registry.unregister("mine")


@pytest.mark.parametrize(
    ("name", "ref_", "message"),
    [
        ("ResNet18", "pkg.mod:Task", "'ResNet18' is a built-in side task"),
        ("two words", "pkg.mod:Task", "task name 'two words' must be 1-64 letters"),
        ("mine", "mine", "'mine' is not a 'where:Class' reference"),
        ("mine", "/no/such/file.py:Task", "file '/no/such/file.py' does not exist"),
        ("mine", "no_such_pkg_zz.mod:Task", "module 'no_such_pkg_zz.mod' cannot be found"),
    ],
)
def test_registering_a_bad_name_or_reference_is_refused_with_the_rule(
    name: str, ref_: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        registry.register(name, ref_)
    assert not registry.is_known("mine")


def test_the_side_task_loader_below_knows_no_names() -> None:
    """``sidetasks`` sits below ``tasks``: names resolve only here, references load there."""
    from freeride_lab.sidetasks import loader

    assert not hasattr(loader, "BUILTIN_TASKS")
    with pytest.raises(ValueError, match=r"resolves through freeride_lab\.tasks\.registry"):
        loader.load_task_class("pagerank")
    assert loader.load_task_class(task_path("pagerank")) is load_task_class("PageRank")


def test_attach_sends_the_resolved_reference_and_keeps_the_name() -> None:
    """What ``Session.attach`` (CLI, magics, dashboard) sends a worker for a name."""
    from freeride_lab.lab.task_requests import check_task

    assert check_task("SGD-MF") == (BUILTIN_TASKS["sgd_mf"], "sgd_mf", "iterations", None)


def test_attach_resolves_a_registered_name(counting: str) -> None:
    from freeride_lab.lab.task_requests import check_task

    assert check_task("counting") == (ref("Counting"), "counting", "iterations", None)


def test_the_dashboard_palette_lists_registered_tasks(counting: str) -> None:
    pytest.importorskip("ipywidgets")
    from freeride_lab.ui.dashboard import builtin_palette

    names = [entry["name"] for entry in builtin_palette()]
    assert names == [*BUILTIN_TASKS, "Counting"]
