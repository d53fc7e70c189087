"""Fixtures of the acceptance tests: one farm of real runs per test session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from acceptance_runs import RunFarm, Shape


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
