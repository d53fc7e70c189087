"""A run directory written before ``RunConfig`` had typed runtime options still opens.

``older_run/`` is such a run, as that version wrote it (2 sleep-timed ranks, 1F1B, 2 steps,
finished): its run.json keeps the runtime keys and the user's note together in one ``extra``
dict (``{"edges_factory": ..., "stop_grace_s": 5, "pg_timeout_s": 120, "note": {...}}``).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from freeride_lab.core.config import RuntimeOptions
from freeride_lab.lab.session import Session
from freeride_lab.pipeline.launcher import RunState

OLDER_RUN = Path(__file__).resolve().parent / "older_run"


@pytest.fixture
def older(tmp_path: Path) -> Iterator[Session]:
    path = tmp_path / "older_run"
    shutil.copytree(OLDER_RUN, path)
    session = Session.open(path)
    yield session
    session.stop()


def test_an_older_run_directory_splits_extra_into_runtime_options_and_notes(
    older: Session,
) -> None:
    assert older.config.runtime == RuntimeOptions(
        edges_factory="freeride_lab.sidetasks.client:open_edges", stop_grace_s=5, pg_timeout_s=120
    )
    assert older.config.notes == {"note": {"who": "me", "n": [1, 2]}}


def test_an_older_run_directory_shows_its_state_and_tables(older: Session) -> None:
    assert older.state is RunState.FINISHED
    assert older.failure is None
    assert sorted(older.steps["rank"].unique()) == [0, 1]
    assert len(older.steps) == 4  # 2 steps x 2 ranks
    assert len(older.actions) == 2 * 2 * 2 * 2  # steps x ranks x micro-batches x (F, B)
