"""Claims about Session: launching, live tables, stopping, and who may stop a run.

These start real runs (torchrun, gloo, two sleep-timed ranks). On a busy two-core machine a rank
needs many seconds to import torch, so waits have generous deadlines; every wait is for a named
condition, never a fixed sleep.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import psutil
import pytest
from runs import synthetic_config
from waits import run_processes, wait_until

from freeride_lab.core.attribution import PART_COLUMNS
from freeride_lab.core.bubbles import BUBBLE_COLUMNS
from freeride_lab.core.config import RunConfig, RuntimeOptions
from freeride_lab.io.rundir import RunDir
from freeride_lab.lab.session import Session
from freeride_lab.lab.tables import ACTION_COLUMNS, MEMORY_COLUMNS, STEP_COLUMNS, read_events
from freeride_lab.pipeline.launcher import RunState

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
STARTUP_S = 240.0  # first step of a fresh run on a loaded box (a torch import per process)


def tiny(steps: int, *, cost_ms: float = 5.0, **runtime: Any) -> RunConfig:
    """Two sleep-timed ranks, 1F1B, two micro-batches: exact costs on a busy CPU."""
    return synthetic_config(
        steps=steps, microbatches=2, phase_ms=cost_ms, runtime=RuntimeOptions(**runtime)
    )


def recorded_steps(run_dir: Path) -> int:
    """Steps both ranks have written to their event files."""
    per_rank: dict[int, int] = {}
    for e in read_events(RunDir(run_dir)):
        if e.get("kind") == "step":
            per_rank[e["rank"]] = max(per_rank.get(e["rank"], 0), e["step"] + 1)
    return min((per_rank.get(r, 0) for r in (0, 1)), default=0)


def status(run_dir: Path) -> dict[str, Any]:
    return RunDir(run_dir).read_status()


# -- a run owned by another Python process (what a notebook kernel is) ---------------------------

OWNER = textwrap.dedent(
    """
    import json, os, sys, time
    from freeride_lab.core.config import RunConfig
    from freeride_lab.lab.session import Session

    config = RunConfig(**json.loads(os.environ["FREERIDE_TEST_CONFIG"]))
    session = Session.launch(config, run_dir=os.environ["FREERIDE_TEST_RUN_DIR"], grace_s=2)
    print("launched", flush=True)
    if os.environ.get("FREERIDE_TEST_EXIT"):
        deadline = time.monotonic() + 240
        while session.steps_done < 1 and time.monotonic() < deadline:
            time.sleep(0.1)  # wait for a running run, then leave it to the atexit handler
        sys.exit(0)
    while True:
        try:
            session.wait()
            break
        except KeyboardInterrupt:  # like a kernel: Interrupt ends the cell, not the process
            print("interrupted", flush=True)
    """
)


class Owner:
    """A separate Python process that launches a run, with its output collected."""

    def __init__(self, tmp: Path, config: RunConfig, *, own_group: bool, exit_early: bool) -> None:
        self.run_dir = tmp / "run"
        self.own_group = own_group
        script = tmp / "owner.py"
        script.write_text(OWNER)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
        env["FREERIDE_TEST_CONFIG"] = json.dumps(config.to_dict())
        env["FREERIDE_TEST_RUN_DIR"] = str(self.run_dir)
        if exit_early:
            env["FREERIDE_TEST_EXIT"] = "1"
        self.proc = subprocess.Popen(
            [sys.executable, str(script)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=own_group,  # the test harness's own group, like a kernel's
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())

    def wait_for_step(self, n: int = 1) -> None:
        wait_until(
            lambda: (self.run_dir / "run.json").exists() and recorded_steps(self.run_dir) >= n,
            timeout_s=STARTUP_S,
            what=f"step {n} of the owner's run (owner output: {self.lines[-5:]})",
        )

    def end(self) -> None:
        """SIGTERM the owner (its whole group if it has one, as a kernel shutdown would) and
        wait for the run to end."""
        with contextlib.suppress(ProcessLookupError):
            if self.own_group:
                os.killpg(self.proc.pid, signal.SIGTERM)
            else:
                self.proc.terminate()
        self.proc.wait(timeout=30)
        if (self.run_dir / "run.json").exists():
            wait_until(lambda: not run_processes(self.run_dir), timeout_s=60, what="run to end")


# -- a run that finished ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Session, int]]:
    """A 3-step run waited to its end, and how many steps were recorded when launch returned."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    with Session.launch(tiny(steps=3), run_dir=run_dir, grace_s=3) as session:
        steps_at_return = recorded_steps(run_dir)
        session.wait(timeout_s=STARTUP_S)
        yield session, steps_at_return


def test_launch_returns_before_the_first_step_is_recorded(finished: tuple[Session, int]) -> None:
    _, steps_at_return = finished
    assert steps_at_return == 0


def test_finished_run_reports_state_steps_and_no_failure(finished: tuple[Session, int]) -> None:
    session, _ = finished
    assert (session.state, session.steps_done, session.failure) == (RunState.FINISHED, 3, None)
    assert status(session.run_dir.path)["state"] == "finished"


def test_tables_have_the_documented_columns(finished: tuple[Session, int]) -> None:
    session, _ = finished
    assert tuple(session.actions.columns) == ACTION_COLUMNS
    assert tuple(session.steps.columns) == STEP_COLUMNS
    assert tuple(session.memory.columns) == MEMORY_COLUMNS
    assert tuple(session.bubbles.columns) == BUBBLE_COLUMNS
    assert tuple(session.attribution.columns) == (*BUBBLE_COLUMNS, *PART_COLUMNS)
    assert sorted(session.steps["step"].unique()) == [0, 1, 2]
    assert list(session.summary()["rank"]) == [0, 1]


def test_summary_splits_each_ranks_bubble_time_beside_the_theory(
    finished: tuple[Session, int],
) -> None:
    session, _ = finished
    summary = session.summary()
    split = ["schedule_ms_per_step", "peer_ms_per_step", "host_ms_per_step"]
    assert list(summary.columns[-4:]) == ["bubble_ms_per_step", *split]
    assert (summary[split] >= 0).all().all()
    total = summary[split].sum(axis=1)
    assert (total - summary["bubble_ms_per_step"]).abs().max() < 1e-6


def test_open_on_a_finished_run_gives_the_same_tables(finished: tuple[Session, int]) -> None:
    session, _ = finished
    opened = Session.open(session.run_dir.path)
    assert opened is not session and not opened.owner
    assert opened.state == RunState.FINISHED
    pd.testing.assert_frame_equal(opened.actions, session.actions)
    pd.testing.assert_frame_equal(opened.steps, session.steps)
    pd.testing.assert_frame_equal(opened.bubbles, session.bubbles)


def test_repr_shows_run_id_state_and_steps(finished: tuple[Session, int]) -> None:
    session, _ = finished
    assert repr(session) == f"<Session run_id='{session.run_id}' state=finished step=3/3>"


def test_stop_after_the_run_finished_changes_nothing(finished: tuple[Session, int]) -> None:
    session, _ = finished
    session.stop()
    session.stop()
    assert session.state == RunState.FINISHED


# -- a run that goes on until stopped -----------------------------------------------------------


def launch_long(run_dir: Path) -> Session:
    return Session.launch(tiny(steps=100_000, cost_ms=10.0), run_dir=run_dir, grace_s=3)


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    """A long run, read but never stopped by its tests."""
    with launch_long(tmp_path_factory.mktemp("running") / "run") as session:
        yield session


@pytest.fixture
def to_stop(tmp_path: Path) -> Iterator[Session]:
    with launch_long(tmp_path / "run") as session:
        yield session


def test_tables_fill_while_the_run_goes_on(running: Session) -> None:
    wait_until(lambda: running.steps_done >= 1, timeout_s=STARTUP_S, what="the first step")
    rows = len(running.steps)
    assert running.state == RunState.RUNNING
    assert not running.actions.empty and not running.bubbles.empty and not running.memory.empty
    assert "peer_ms_per_step" in running.summary().columns  # a step in progress is no error
    wait_until(lambda: len(running.steps) > rows, timeout_s=60, what="more rows in steps")
    assert running.state == RunState.RUNNING


def test_live_tables_are_fed_by_the_bus(running: Session) -> None:
    wait_until(lambda: running.live_events > 0, timeout_s=STARTUP_S, what="events over the bus")


def test_stop_leaves_no_process_of_the_run(to_stop: Session) -> None:
    wait_until(lambda: to_stop.steps_done >= 1, timeout_s=STARTUP_S, what="the first step")
    before = run_processes(to_stop.run_dir.path)
    assert len(before) >= 4  # launcher, torchrun, two ranks
    to_stop.stop()
    assert run_processes(to_stop.run_dir.path) == []
    assert not [p.pid for p in before if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert to_stop.state == RunState.STOPPED
    to_stop.stop()  # a second stop is a no-op


def _module(proc: psutil.Process) -> str:
    """The module a Python process runs (its first ``-m``), or ""."""
    cmdline = proc.cmdline()
    return cmdline[cmdline.index("-m") + 1] if "-m" in cmdline[:-1] else ""


def test_stop_of_a_quickstart_sized_run_returns_within_5_s(tmp_path: Path) -> None:
    """Nothing is stuck, so stop() waits for the ranks to end their step and for every process
    to exit, never for the grace (10 s here): at most 5 s on a loaded two-core box, of which
    at most 1.5 s after the last rank has gone (torchrun and the launcher leave at once)."""
    config = RunConfig(schedule="1F1B", stages=4, microbatches=4, steps=1000, workload="synthetic")
    with Session.launch(config, run_dir=tmp_path / "run", grace_s=10.0) as session:
        wait_until(lambda: session.steps_done >= 2, timeout_s=STARTUP_S, what="two steps")
        tree = run_processes(session.run_dir.path)
        ranks = [p for p in tree if _module(p) == "freeride_lab.pipeline.rank"]
        assert len(tree) >= 10 and len(ranks) == 4  # launcher, torchrun, 4 ranks, 4 workers
        ranks_gone: list[float] = []
        watcher = threading.Thread(
            target=lambda: ranks_gone.append(
                time.monotonic() if not psutil.wait_procs(ranks, timeout=60)[1] else math.inf
            )
        )
        watcher.start()
        started = time.monotonic()
        session.stop()
        returned = time.monotonic()
        watcher.join()
        assert run_processes(session.run_dir.path) == []
        assert session.state == RunState.STOPPED
    assert returned - started <= 5.0, f"stop() took {returned - started:.1f} s"
    assert returned - ranks_gone[0] <= 1.5, (
        f"stop() returned {returned - ranks_gone[0]:.1f} s after the last rank had gone"
    )


def test_a_failed_rank_is_reported_with_its_rank_and_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    config = tiny(steps=50, edges_factory="fault_injection:fail_rank_1", stop_grace_s=2)
    with Session.launch(config, run_dir=tmp_path / "run", grace_s=2) as session:
        events_1 = session.run_dir.rank_events(1)
        wait_until(
            lambda: events_1.exists() and b"rank_failed" in events_1.read_bytes(),
            timeout_s=STARTUP_S,
            what="rank 1's RankFailed event",
        )
        wait_until(
            lambda: session.state == RunState.FAILED and session.failure is not None,
            timeout_s=5,
            what="the session to report the failure",
        )
        failure = session.failure
        assert failure is not None and failure.rank == 1
        assert "injected failure on rank 1" in failure.reason
        assert session.wait(timeout_s=120) == RunState.FAILED
        assert status(session.run_dir.path)["failed_rank"] == 1
        assert run_processes(session.run_dir.path) == []


def test_a_rank_killed_by_a_signal_is_reported_as_the_cause(to_stop: Session) -> None:
    wait_until(lambda: to_stop.steps_done >= 1, timeout_s=STARTUP_S, what="the first step")
    (rank_1,) = [
        p
        for p in run_processes(to_stop.run_dir.path)
        if "freeride_lab.pipeline.rank" in p.cmdline() and p.environ().get("RANK") == "1"
    ]
    rank_1.kill()  # dies without a word; rank 0 then fails in its next collective
    assert to_stop.wait(timeout_s=120) == RunState.FAILED
    failure = to_stop.failure
    assert failure is not None and failure.rank == 1
    assert "killed by SIGKILL" in failure.reason


# -- runs owned by another process --------------------------------------------------------------


@pytest.fixture(scope="module")
def foreign(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Owner]:
    """A long run launched by a separate Python process in its own process group."""
    owner = Owner(
        tmp_path_factory.mktemp("foreign"),
        tiny(steps=100_000, cost_ms=10.0),
        own_group=True,
        exit_early=False,
    )
    try:
        owner.wait_for_step()
        yield owner
    finally:
        owner.end()


def test_interrupt_to_the_owners_process_group_leaves_training_running(foreign: Owner) -> None:
    before = {p.pid for p in run_processes(foreign.run_dir)}
    steps = recorded_steps(foreign.run_dir)
    os.killpg(foreign.proc.pid, signal.SIGINT)  # what Jupyter's "Interrupt kernel" sends
    wait_until(lambda: "interrupted" in foreign.lines, timeout_s=30, what="the owner's interrupt")
    wait_until(
        lambda: recorded_steps(foreign.run_dir) >= steps + 2, timeout_s=120, what="two more steps"
    )
    assert before <= {p.pid for p in run_processes(foreign.run_dir)}
    assert status(foreign.run_dir)["state"] == "running"


def test_an_observer_cannot_stop_a_run_it_does_not_own(foreign: Owner) -> None:
    observer = Session.open(foreign.run_dir)
    assert not observer.owner
    launcher_pid = json.loads((foreign.run_dir / "run.json").read_text())["launcher_pid"]
    with pytest.raises(PermissionError, match=rf"read-only.*kill -TERM {launcher_pid}"):
        observer.stop()
    assert observer.state == RunState.RUNNING


def test_killing_the_owner_leaves_no_process_of_the_run_within_10_s(tmp_path: Path) -> None:
    owner = Owner(tmp_path, tiny(steps=100_000, cost_ms=10.0), own_group=False, exit_early=False)
    try:
        owner.wait_for_step()
        assert run_processes(owner.run_dir)
        owner.proc.kill()  # SIGKILL: no atexit, no cleanup of its own
        owner.proc.wait()
        wait_until(lambda: not run_processes(owner.run_dir), timeout_s=10, what="no run process")
        assert status(owner.run_dir)["state"] == "stopped"
    finally:
        owner.end()


def test_owner_exit_stops_its_runs_through_atexit(tmp_path: Path) -> None:
    owner = Owner(tmp_path, tiny(steps=100_000, cost_ms=10.0), own_group=False, exit_early=True)
    try:
        assert owner.proc.wait(timeout=STARTUP_S) == 0
        assert run_processes(owner.run_dir) == []
        assert status(owner.run_dir)["state"] == "stopped"
    finally:
        owner.end()


# -- refusals before anything starts ------------------------------------------------------------


def children_pids() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_port_in_use_raises_value_error_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        before = children_pids()
        with pytest.raises(ValueError, match=f"master_port={port} is already in use"):
            Session.launch(tiny(steps=1).replace(master_port=port), run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()
    assert children_pids() <= before


def test_unwritable_run_dir_raises_os_error_naming_the_path(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(OSError, match=re.escape(str(blocker))):
        Session.launch(tiny(steps=1), run_dir=blocker / "run")


def test_cuda_device_without_cuda_raises_runtime_error(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(RuntimeError, match="device='cuda'"):
        Session.launch(tiny(steps=1).replace(device="cuda"), run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_open_refuses_a_directory_without_run_json(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        Session.open(tmp_path)


def test_a_run_that_ends_on_its_own_is_settled_without_anyone_looking(tmp_path: Path) -> None:
    # A finished (or failed) run's MPS daemon and status must not wait for the next read of
    # the session: the owner's watchdog settles it once the launcher is gone.
    run = Session.launch(tiny(3), run_dir=tmp_path / "run")
    stopped_mps: list[float] = []
    real_stop = run._mps.stop
    run._mps.stop = lambda **kw: (stopped_mps.append(time.monotonic()), real_stop(**kw))[1]
    launcher = psutil.Process(run._launcher.pid)  # watched from outside, not through the session
    launcher.wait(timeout=STARTUP_S)
    ended = time.monotonic()
    wait_until(lambda: stopped_mps, timeout_s=10, what="the MPS daemon of the run to be stopped")
    assert stopped_mps[0] - ended < 10
    assert status(run.run_dir.path)["state"] == "finished"
    assert run._bus is None  # the session's bus is closed too
