"""Fixtures of the acceptance tests: one farm of real runs per test session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from acceptance_runs import RunFarm, Shape


@pytest.fixture(scope="session")
def farm(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunFarm]:
    """Runs shared by the acceptance modules; knows every selected module's ``RUNS``."""
    modules = dict.fromkeys(getattr(item, "module", None) for item in request.session.items)
    planned: list[Shape] = [s for m in modules if m is not None for s in getattr(m, "RUNS", [])]
    runs = RunFarm(tmp_path_factory.mktemp("acceptance"), planned)
    try:
        yield runs
    finally:
        runs.stop()
