"""Shared test configuration: the test tiers, marker-based skips with reasons, and the fixtures
many test folders use (a fresh run directory, a rank's edge writer, task processes to clean up).

[Note: test tiers]
``pytest -m "not slow"`` is the fast tier a developer runs after each change (minutes on two
cores). ``slow`` marks the second tier: tests that start whole runs, Jupyter kernels or a
browser, and ``.ci/run`` runs it after the fast tier. ``soak`` marks soaks and sweeps of tens of
minutes that no CI run waits for; a test marked ``soak``, ``browser`` or ``notebook`` is
``slow`` as well, so the fast tier never starts one.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from freeride_lab.io.rundir import RunDir
from freeride_lab.sidetasks.edges import EdgeWriter, edge_path
from freeride_lab.sidetasks.process import TaskProcess


def _cuda_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:  # [Note: test tiers]
        if any(m in item.keywords for m in ("soak", "browser", "notebook")):
            item.add_marker(pytest.mark.slow)
    wants_gpu = any("gpu" in i.keywords or "multigpu" in i.keywords for i in items)
    cuda = _cuda_count() if wants_gpu else 0  # importing torch costs seconds: only when needed
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    for item in items:
        if "gpu" in item.keywords and cuda < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU; this machine has none"))
        if "multigpu" in item.keywords and cuda < 2:
            item.add_marker(pytest.mark.skip(reason=f"needs >= 2 CUDA GPUs; found {cuda}"))
        if "browser" in item.keywords and not chromium:
            item.add_marker(
                pytest.mark.skip(reason="needs the system Chromium (apt-get install -y chromium)")
            )


@pytest.fixture(autouse=True)
def _task_names_registered_by_a_test_are_forgotten_after_it() -> Iterator[None]:
    """``%%freeride_task`` and ``registry.register`` name tasks for the whole process (a
    kernel); tests share one process, so each test starts from the names it found."""
    from freeride_lab.tasks import registry

    before = registry.registered()
    yield
    for name in set(registry.registered()) - set(before):
        registry.unregister(name)
    for name, ref in before.items():
        if registry.registered().get(name) != ref:
            registry.register(name, ref)


@pytest.fixture
def run_dir(tmp_path: Path) -> RunDir:
    """A fresh, empty run directory (a test that needs a live run defines its own)."""
    run = RunDir(tmp_path / "run")
    run.create()
    return run


@pytest.fixture
def edges(run_dir: RunDir) -> Iterator[EdgeWriter]:
    """The bubble-edge writer of rank 0 in ``run_dir``, as a training rank would own it."""
    writer = EdgeWriter.create(edge_path(run_dir.path, 0))
    yield writer
    writer.close()


@pytest.fixture
def hosts() -> Iterator[list[TaskProcess]]:
    """Task processes a test starts (append them); killed and closed after the test."""
    started: list[TaskProcess] = []
    yield started
    for proc in started:
        if proc.alive:
            proc.kill("test teardown")
            proc.wait_exit(10)
        proc.close()
