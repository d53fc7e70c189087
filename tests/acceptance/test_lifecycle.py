"""Acceptance: a Session run on CUDA (marker ``gpu``; skipped without a GPU).

The CPU claims of the run's lifecycle are proven in ``tests/lab/test_session.py`` and are not
repeated here: ``test_stop_leaves_no_process_of_the_run`` (after ``stop()`` no process of the
run is left) and ``test_killing_the_owner_leaves_no_process_of_the_run_within_10_s`` (the
launching process killed with SIGKILL). The rank-level CUDA run (CUDA-event timing without a
Session) is ``tests/pipeline/test_rank.py::test_one_rank_trains_on_cuda_with_event_timing``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psutil
import pytest

from freeride_lab.core.config import RunConfig
from freeride_lab.lab.session import Session
from freeride_lab.pipeline.launcher import RunState

pytestmark = pytest.mark.slow  # whole runs, start to stop

RUN_TIMEOUT_S = 600.0


def cuda_config(stages: int, **changes: Any) -> RunConfig:
    """A small GPT on real text, one GPU per rank."""
    return RunConfig(
        schedule="1F1B",
        stages=stages,
        microbatches=4,
        steps=5,
        workload="text",
        device="cuda",
        layers=2 * stages,
        d_model=64,
        heads=4,
        seq_len=64,
        **changes,
    )


def run_processes(run_dir: Path) -> list[psutil.Process]:
    needle = str(run_dir)
    return [
        p
        for p in psutil.process_iter(["cmdline", "status"])
        if p.info["status"] != psutil.STATUS_ZOMBIE
        and any(needle in a for a in p.info["cmdline"] or [])
    ]


def check_cuda_run(session: Session, stages: int) -> None:
    """Finished, every action timed, memory of a CUDA device, bubbles and summary readable."""
    state = session.wait(timeout_s=RUN_TIMEOUT_S)
    assert state == RunState.FINISHED, session.failure
    config = session.config
    actions = session.actions
    assert len(actions) == config.steps * stages * 2 * config.microbatches  # F and B each
    assert (actions["end_ns"] > actions["start_ns"]).all()
    memory = session.memory
    assert memory["device"].str.startswith("cuda").all(), memory
    assert (memory["peak_reserved_bytes"] > 0).all()
    losses = session.steps.dropna(subset=["loss"])["loss"]
    assert len(losses) == config.steps
    summary = session.summary()
    assert summary["rank"].tolist() == list(range(stages))


@pytest.mark.gpu
def test_one_stage_session_on_cuda_finishes_and_times_every_action(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with Session.launch(cuda_config(1), run_dir=run_dir, grace_s=5) as session:
        check_cuda_run(session, 1)
    assert run_processes(run_dir) == []


@pytest.mark.multigpu
def test_two_stage_session_on_nccl_finishes_and_leaves_no_process(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with Session.launch(cuda_config(2), run_dir=run_dir, grace_s=5) as session:
        check_cuda_run(session, 2)
        assert session.config.backend == "nccl"
    assert run_processes(run_dir) == []
