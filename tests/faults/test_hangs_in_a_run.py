"""Hangs, exits and floods of side tasks during a real training run: training loses no step.

One 2-stage sleep-timed CPU run (torchrun, gloo) serves the module. Stage 0's worker runs, in
order, a task whose step holds the GIL in C code and one that calls ``sys.exit()`` in a step;
stage 1's worker runs a task that prints 100 MiB while a dashboard is live, until the test
SIGSTOPs that worker (and then reads nothing of the tasks until the session's watchdog has
written the failure down).
Processes are found by walking the process table (psutil); waits are for named conditions.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from runs import assert_trains_every_step, failed_in, processes, synthetic_config, task, wait_in_run
from unruly_tasks import read_marker, ref

from freeride_lab.lab.session import Session
from freeride_lab.sidetasks.task_log import TASK_LOG_CAP_BYTES

pytestmark = pytest.mark.slow  # one training run of about two minutes on two CPU cores

STARTUP_S = 240.0  # the first step of a fresh run on a loaded two-core box
LIVE_S = 120.0
STEPS = 200
CONFIG = synthetic_config(steps=STEPS, seed=11)


@dataclass
class Run:
    session: Session
    ids: dict[str, str]
    marker: Path


def gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    root = tmp_path_factory.mktemp("hangs-in-a-run")
    session = Session.launch(CONFIG, run_dir=root / "run", grace_s=3)
    marker = root / "hog-started"
    try:
        wait_in_run(lambda: session.steps_done >= 1, STARTUP_S, "the first training step", session)
        ids = {  # stage 0 runs the first two in this order, one at a time
            "hog": session.attach(
                ref("GilHog"),
                stage=0,
                budget_ms=10,
                options={"marker_path": str(marker)},
                policy="WARN",
            )["id"],
            "exits": session.attach(
                ref("Misbehaves"), stage=0, options={"how": "exit"}, policy="WARN"
            )["id"],
        }
        yield Run(session, ids, marker)
    finally:
        session.stop()


def test_a_step_holding_the_gil_fails_hung_while_training_goes_on(run: Run) -> None:
    session, tid = run.session, run.ids["hog"]
    wait_in_run(lambda: read_marker(run.marker), LIVE_S, "the GIL-holding step", session)
    wait_in_run(lambda: task(session, tid)["state"] == "FAILED", 30.0, "the hog to fail", session)
    error = task(session, tid)["error"]
    assert re.match(r"^hung: step \d+ ran [\d.]+ s, over 2 x budget \+ 1 s = 1\.02 s", error)
    assert not processes("freeride_lab.sidetasks.host", tid)


def test_a_task_calling_sys_exit_in_its_step_fails_with_the_reason(run: Run) -> None:
    session, tid = run.session, run.ids["exits"]
    wait_in_run(lambda: task(session, tid)["state"] == "FAILED", LIVE_S, "sys.exit()", session)
    assert task(session, tid)["error"] == "step raised SystemExit: 3"


def test_a_task_printing_100_mib_keeps_10_mb_of_log_and_the_dashboard_goes_on(run: Run) -> None:
    session = run.session
    pytest.importorskip("anywidget", reason="the notebook UI packages are not installed")
    from freeride_lab.ui.dashboard import Dashboard

    dashboard = Dashboard(session, interval_s=0.25).start()
    try:
        tid = run.ids["loud"] = session.attach(  # it prints 100 MiB as it starts
            ref("Flood"), stage=1, budget_ms=5, options={"total_mib": 100}, policy="WARN"
        )["id"]
        wait_in_run(lambda: task(session, tid)["progress"] >= 3, LIVE_S, "the loud task", session)
        steps_then, ticks_then = session.steps_done, dashboard.ticks
        wait_in_run(
            lambda: session.steps_done > steps_then + 2 and dashboard.ticks > ticks_then + 2,
            30.0,
            "training and the dashboard to go on",
            session,
        )
        assert dashboard.errors == 0
        card = next(c for c in dashboard.board.tasks if c["id"] == tid)
        assert card["state"] in ("PAUSED", "RUNNING")
    finally:
        dashboard.stop()
    log = session.run_dir.logs_dir / f"task-{tid}.log"
    assert log.stat().st_size <= TASK_LOG_CAP_BYTES <= 10_000_000
    assert b"[freeride_lab] output truncated" in log.read_bytes()[-2000:]


def test_a_sigstopped_worker_is_killed_and_its_task_fails_hung_without_anyone_reading(
    run: Run,
) -> None:
    session, tid = run.session, run.ids["loud"]
    path = str(session.run_dir.path)
    (worker,) = processes("freeride_lab.sidetasks.worker", path, "--rank 1 ")
    (host,) = processes("freeride_lab.sidetasks.host", tid)
    worker.send_signal(signal.SIGSTOP)
    # Nobody reads session.tasks from here on: the session's watchdog must notice by itself.
    lab_events = session.run_dir.events_dir / "lab-1.jsonl"
    wait_in_run(lambda: failed_in(lab_events, tid), 30.0, "the watchdog to record the failure")
    recorded = failed_in(lab_events, tid)
    assert recorded is not None
    assert re.match(
        rf"^hung: worker for rank 1 \(pid {worker.pid}\) sent no heartbeat for [\d.]+ s \(3 "
        r"missed, one every 0\.5 s\); killed it and its task processes \(SIGKILL\)",
        recorded["reason"],
    ), recorded
    wait_in_run(
        lambda: not processes("freeride_lab.sidetasks.worker", path, "--rank 1 "),
        10.0,
        "the hung worker to be gone",
    )
    wait_in_run(lambda: gone(host), 10.0, "its task process to be gone")
    assert task(session, tid)["state"] == "FAILED"


def test_training_completes_every_step(run: Run) -> None:
    assert_trains_every_step(run.session, steps=STEPS, ranks=2, timeout_s=STARTUP_S + STEPS * 2.0)


def test_no_process_of_the_run_is_left_after_stop(run: Run) -> None:
    run.session.stop()
    path = str(run.session.run_dir.path)
    wait_in_run(lambda: not processes(path), 10.0, "every process of the run to exit")
