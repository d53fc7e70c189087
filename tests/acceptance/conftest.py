"""Fixtures of the acceptance tests: farms of real runs, one of each per test session."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from acceptance_runs import FinishedRun, RunFarm, Shape
from gated_runs import GatedFarm, GatedRun


@pytest.fixture(scope="session")
def farm(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunFarm]:
    """Runs shared by the acceptance modules; knows every selected acceptance module's ``RUNS``
    (modules elsewhere may use the name for something else)."""
    here = Path(__file__).parent
    modules = dict.fromkeys(getattr(item, "module", None) for item in request.session.items)
    ours = [m for m in modules if m is not None and Path(m.__file__).parent == here]
    planned: list[Shape] = [s for m in ours for s in getattr(m, "RUNS", [])]
    runs = RunFarm(tmp_path_factory.mktemp("acceptance"), planned)
    try:
        yield runs
    finally:
        runs.stop()


@pytest.fixture(scope="session")
def gated_farm(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatedFarm]:
    """Gated runs (``gated_runs.py``) of every selected test: the ``GatedRun`` parameters of
    the selected tests and the ``GATED_RUNS`` of their modules, launched on the first request."""
    items = request.session.items
    params = [
        value
        for item in items
        for value in getattr(getattr(item, "callspec", None), "params", {}).values()
        if isinstance(value, GatedRun)
    ]
    modules = dict.fromkeys(getattr(item, "module", None) for item in items)
    listed = [r for m in modules if m is not None for r in getattr(m, "GATED_RUNS", [])]
    farm = GatedFarm(tmp_path_factory.mktemp("gated"), [*params, *listed])
    try:
        yield farm
    finally:
        farm.stop()


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest) -> Mapping[Any, FinishedRun[Any]]:
    """The finished runs the test's module lists: its ``GATED_RUNS`` (from ``gated_farm``) or
    else its ``RUNS`` (from ``farm``); only the farm the module needs is started."""
    module = request.module
    if hasattr(module, "GATED_RUNS"):
        gated: GatedFarm = request.getfixturevalue("gated_farm")
        return gated.get(module.GATED_RUNS)
    shared: RunFarm = request.getfixturevalue("farm")
    return shared.get(module.RUNS)
