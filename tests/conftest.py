"""Shared test configuration: marker-based skips with reasons."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest


def _cuda_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
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
