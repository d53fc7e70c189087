"""A side-task worker that dies, for any reason, leaves its tasks FAILED with the reason, never
looking like a normal end: killed by a signal (its rank records how, ``sidetasks.worker_exit``,
and the manager names it), or an error in its own loop (it fails its tasks itself, then exits
with code 1).

The test plays the training rank (it starts the worker, so it is the worker's parent) and reads
the tasks through a real ``SideTaskManager`` over the run directory, as a session's watchdog
does. Waits are for named conditions with deadlines.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import psutil
import pytest
from waits import wait_until

from freeride_lab.core.config import RunConfig, RuntimeOptions
from freeride_lab.io.rundir import RunDir
from freeride_lab.lab.manager import SideTaskManager
from freeride_lab.lab.session import EDGES_FACTORY
from freeride_lab.lab.taskbook import TaskBook, TaskRecord
from freeride_lab.sidetasks.client import WorkerClient, WorkerProcess, start_worker
from freeride_lab.sidetasks.process import child_env
from freeride_lab.sidetasks.spec import checkpoint_path
from freeride_lab.sidetasks.worker_exit import WorkerExit, exit_reason, read_exit, record_exit

COUNTING = f"{Path(__file__).resolve().parents[1] / 'sidetasks' / 'tasks_for_tests.py'}:Counting"
STARTUP_S = 60.0  # a task process starting on a loaded two-core box
NOTICED_S = 30.0  # the manager's check runs on each read; the rank records within a second

# A worker whose loop raises once a trigger file exists: an internal error, injected.
FAULTY_WORKER = textwrap.dedent(
    """
    import os, sys
    from freeride_lab.sidetasks import worker

    real_reap = worker.Worker._reap

    def reap(self):
        if os.path.exists(sys.argv[1]):
            raise RuntimeError("injected fault in the worker's loop")
        real_reap(self)

    worker.Worker._reap = reap
    sys.exit(worker.main(sys.argv[2:]))
    """
)


class EventFiles:
    """The run's event dicts in the order they were read, as a session hands them over."""

    def __init__(self, run_dir: RunDir) -> None:
        self.run_dir = run_dir
        self.seen: list[dict[str, Any]] = []
        self._done: dict[Path, int] = {}  # file -> complete lines already read

    def __call__(self, start: int) -> Sequence[Mapping[str, Any]]:
        for path in sorted(self.run_dir.events_dir.glob("*.jsonl")):
            lines = path.read_text().split("\n")[:-1]  # the last piece may be half-written
            for line in lines[self._done.get(path, 0) :]:
                self.seen.append(json.loads(line))
            self._done[path] = len(lines)
        return self.seen[start:]


def manager_for(
    run_dir: RunDir,
    *task_ids: str,
    events: Callable[[int], Sequence[Mapping[str, Any]]] | None = None,
) -> SideTaskManager:
    """A manager that knows ``task_ids`` (attached on rank 0); ``events`` None reads the run's
    event files."""
    config = RunConfig(
        schedule="1F1B",
        stages=2,
        microbatches=2,
        workload="synthetic",
        runtime=RuntimeOptions(edges_factory=EDGES_FACTORY),
    )
    manager = SideTaskManager(
        run_dir,
        config,
        events=EventFiles(run_dir) if events is None else events,
        memory=pd.DataFrame,
        bubbles=pd.DataFrame,
        live=lambda: True,
    )
    book = TaskBook(run_dir, lambda start: [])
    for task_id in task_ids:
        book.save(TaskRecord(id=task_id, task=COUNTING, name="Counting", rank=0, stage=0))
    return manager


def settled(manager: SideTaskManager, task_id: str) -> bool:
    return manager.task(task_id)["state"] in ("CREATED", "PAUSED")


@pytest.fixture
def worker(run_dir: RunDir) -> Iterator[WorkerProcess]:
    process = start_worker(run_dir.path, 0)
    yield process
    process.stop()


# -- killed by a signal: the rank records it, the manager names it ---------------------------


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGHUP], ids=lambda s: s.name)
def test_a_worker_killed_by_a_signal_fails_its_task_naming_the_signal(
    run_dir: RunDir, worker: WorkerProcess, signum: signal.Signals
) -> None:
    manager = manager_for(run_dir, "c1")
    worker.client(timeout_s=STARTUP_S).attach(COUNTING, task_id="c1")
    wait_until(lambda: settled(manager, "c1"), timeout_s=STARTUP_S, what="c1 to be set up")
    assert worker.popen is not None
    pid = worker.popen.pid
    os.kill(pid, signum)
    wait_until(
        lambda: manager.task("c1")["state"] == "FAILED", timeout_s=NOTICED_S, what="c1 FAILED"
    )
    error = manager.task("c1")["error"]
    assert error.startswith(f"worker for rank 0 died: killed by {signum.name} (pid {pid}); see ")
    assert error.endswith("worker-0.log")


def test_the_rank_records_how_its_worker_ended(run_dir: RunDir, worker: WorkerProcess) -> None:
    assert worker.popen is not None
    pid = worker.popen.pid
    worker.client(timeout_s=STARTUP_S).status()  # it is up
    assert read_exit(run_dir.path, 0) is None  # no record while it runs
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: read_exit(run_dir.path, 0) is not None, timeout_s=10, what="the record")
    assert read_exit(run_dir.path, 0) == WorkerExit(rank=0, pid=pid, returncode=-9)


def test_a_normal_stop_is_recorded_as_exit_code_0_and_fails_nothing(
    run_dir: RunDir, worker: WorkerProcess
) -> None:
    manager = manager_for(run_dir, "c1")
    worker.client(timeout_s=STARTUP_S).attach(COUNTING, task_id="c1")
    wait_until(lambda: settled(manager, "c1"), timeout_s=STARTUP_S, what="c1 to be set up")
    worker.stop()
    wait_until(lambda: read_exit(run_dir.path, 0) is not None, timeout_s=10, what="the record")
    assert read_exit(run_dir.path, 0).normal  # type: ignore[union-attr]
    assert (manager.task("c1")["state"], manager.task("c1")["error"]) == ("STOPPED", "")


@pytest.mark.parametrize(
    ("returncode", "words"),
    [(-9, "killed by SIGKILL"), (-11, "killed by SIGSEGV"), (1, "exit code 1"), (-200, "signal")],
)
def test_an_exit_status_reads_as_words(returncode: int, words: str) -> None:
    assert words in exit_reason(returncode)


def test_a_recorded_exit_code_fails_the_task_with_it_and_code_0_fails_nothing(
    run_dir: RunDir,
) -> None:
    events: list[dict[str, Any]] = []
    manager = manager_for(run_dir, "c1", events=lambda start: events[start:])
    events.append(
        {"kind": "side_task_state", "task_id": "c1", "state": "PAUSED", "event": "INIT",
         "accepted": True, "reason": "", "t_ns": 1}
    )  # fmt: skip
    record_exit(run_dir.path, 0, pid=4242, returncode=0)
    assert manager.task("c1")["state"] == "PAUSED"
    record_exit(run_dir.path, 0, pid=4243, returncode=1)
    task = manager.task("c1")
    assert task["state"] == "FAILED"
    assert task["error"].startswith("worker for rank 0 died: exit code 1 (pid 4243); see ")
    lab_events = (run_dir.events_dir / "lab-0.jsonl").read_text()  # a reopened run sees it
    assert "worker for rank 0 died: exit code 1" in lab_events


# -- an error in its own loop: it fails its tasks itself -------------------------------------


@pytest.fixture
def faulty_worker(
    run_dir: RunDir, tmp_path: Path
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    trigger = tmp_path / "fail-now"
    command = [sys.executable, "-c", FAULTY_WORKER, str(trigger)]
    command += ["--run-dir", str(run_dir.path), "--rank", "0"]
    with open(run_dir.logs_dir / "worker-0.log", "ab") as out:
        process = subprocess.Popen(command, env=child_env(), stdout=out, stderr=out)
    yield process, trigger
    if process.poll() is None:
        process.kill()
    process.wait()


def test_a_worker_whose_loop_fails_checkpoints_its_task_and_reports_it_failed(
    run_dir: RunDir, faulty_worker: tuple[subprocess.Popen[bytes], Path]
) -> None:
    process, trigger = faulty_worker
    manager = manager_for(run_dir, "c1")
    client = WorkerClient.from_run_dir(run_dir.path, 0, timeout_s=STARTUP_S)
    task_pid = client.attach(COUNTING, task_id="c1").payload["pid"]
    wait_until(lambda: settled(manager, "c1"), timeout_s=STARTUP_S, what="c1 to be set up")
    trigger.touch()
    assert process.wait(60) == 1
    task = manager.task("c1")
    assert task["state"] == "FAILED"
    assert task["error"] == (
        "worker for rank 0 died: internal error: RuntimeError: injected fault in the worker's loop"
    )
    assert checkpoint_path(run_dir.path, "c1").exists()  # its progress is kept
    wait_until(lambda: not running(task_pid), timeout_s=10, what="the task process to be gone")


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
