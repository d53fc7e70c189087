"""Hangs caught from outside the hung process, with a real worker and real task processes.

The test plays the training rank: it writes bubble edges through the worker's ``EdgeWriter``
(``Trainer``) and commands the worker through its client, as a session does. A step that holds
the GIL in C code, a SIGSTOPped task (in a step or between steps), tasks stuck in a step under
every overrun policy, and a SIGSTOPped worker: each must be found by another process and end
within the bounds the requirement states. Processes are checked in the process table (psutil).
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from runs import read_events
from unruly_tasks import read_marker, ref
from waits import wait_until

from freeride_lab.core import events as ev
from freeride_lab.io.rundir import RunDir
from freeride_lab.sidetasks.client import WorkerClient, WorkerProcess, start_worker
from freeride_lab.sidetasks.heartbeat import heartbeat_path, read_heartbeat
from freeride_lab.sidetasks.watchdog import worker_hang_reason

COUNTING = f"{Path(__file__).resolve().parents[1] / 'sidetasks' / 'tasks_for_tests.py'}:Counting"
CLEANUP_S = 10.0  # the requirement: cleanup of any side task within 10 s of detach or stop
STARTUP_S = 60.0  # a task process starting on a loaded two-core box


@pytest.fixture
def worker(run_dir: RunDir) -> Iterator[WorkerProcess]:
    process = start_worker(run_dir.path, 0)
    yield process
    if process.popen is not None and process.popen.poll() is None:
        with contextlib.suppress(psutil.Error):
            psutil.Process(process.popen.pid).resume()  # a test may leave it SIGSTOPped
    process.stop()


@pytest.fixture
def client(worker: WorkerProcess) -> WorkerClient:
    return worker.client(timeout_s=60)


def states(run_dir: RunDir, task_id: str) -> list[ev.SideTaskStateChanged]:
    found = [e for p in sorted(run_dir.events_dir.glob("*.jsonl")) for e in read_events(p)]
    return [e for e in found if isinstance(e, ev.SideTaskStateChanged) and e.task_id == task_id]


def failure(run_dir: RunDir, task_id: str) -> str | None:
    """The reason of the task's FAILED state, once it has one."""
    failed = [s for s in states(run_dir, task_id) if s.state == "FAILED"]
    return failed[-1].reason if failed else None


def steps(run_dir: RunDir, task_id: str) -> list[ev.SideTaskStep]:
    found = read_events(run_dir.events_dir / f"task-{task_id}.jsonl")
    return [e for e in found if isinstance(e, ev.SideTaskStep)]


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Trainer:
    """Plays the rank: announces bubbles through the worker's edges until a condition holds."""

    def __init__(self, worker: WorkerProcess, *, length_s: float = 0.1, predicted_s: float = 0.1):
        self.worker = worker
        self.length_s = length_s
        self.predicted_s = predicted_s
        self.step = 0

    def bubble(self) -> None:
        start_ns = time.time_ns()
        self.worker.bubble_start(self.step, 0, start_ns, start_ns + int(self.predicted_s * 1e9))
        time.sleep(self.length_s)  # the bubble itself: the scenario, not a synchronisation
        self.worker.bubble_end(self.step, 0, time.time_ns())
        self.step += 1
        time.sleep(0.03)  # training computes

    def until(self, condition: Callable[[], object], *, what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s} s of bubbles waiting for {what}")
            self.bubble()


def in_a_step(
    worker: WorkerProcess,
    client: WorkerClient,
    marker: Path,
    task: str,
    *,
    task_id: str,
    options: dict[str, Any] | None = None,
    **fields: Any,
) -> tuple[int, Trainer]:
    """Attach the unruly ``task`` (it writes ``marker`` as its step begins; a 10 ms budget,
    ``fields`` for the rest of its spec) and announce bubbles until its step has begun; its
    task process's pid and the trainer that announced them."""
    pid = client.attach(
        ref(task),
        task_id=task_id,
        options={"marker_path": str(marker), **(options or {})},
        limits={"budget_s": 0.01},
        **fields,
    ).payload["pid"]
    trainer = Trainer(worker)
    trainer.until(lambda: read_marker(marker), what=f"a step of {task_id}", timeout_s=STARTUP_S)
    return pid, trainer


# -- hung tasks -------------------------------------------------------------------------------


def test_a_step_holding_the_gil_is_killed_from_outside_and_fails_hung(
    run_dir: RunDir, worker: WorkerProcess, client: WorkerClient, tmp_path: Path
) -> None:
    marker = tmp_path / "hog-started"
    pid, trainer = in_a_step(worker, client, marker, "GilHog", task_id="hog")
    started_ns = read_marker(marker)
    assert started_ns is not None
    trainer.until(lambda: failure(run_dir, "hog"), what="the hung task to fail", timeout_s=30)
    failed_after_s = (time.monotonic_ns() - started_ns) / 1e9
    reason = failure(run_dir, "hog")
    found = re.match(r"^hung: step \d+ ran ([\d.]+) s, over 2 x budget \+ 1 s = 1\.02 s", reason)
    assert found is not None, reason
    assert float(found[1]) >= 1.02  # past the limit; the reason rounds to 10 ms
    assert failed_after_s < 1.02 + 5, f"FAILED {failed_after_s:.1f} s after the step began"
    assert not running(pid)
    client.attach(COUNTING, task_id="next", limits={"budget_s": 0.004})
    trainer.until(lambda: steps(run_dir, "next"), what="the next task to step", timeout_s=60)


def test_a_task_sigstopped_in_a_step_is_killed_and_fails_hung(
    run_dir: RunDir, worker: WorkerProcess, client: WorkerClient, tmp_path: Path
) -> None:
    marker = tmp_path / "step-started"
    pid, trainer = in_a_step(
        worker, client, marker, "StuckStep", task_id="stopped", options={"sleep_s": 0.5}
    )
    psutil.Process(pid).suspend()  # SIGSTOP: the step would have ended 0.5 s after it began
    trainer.until(
        lambda: failure(run_dir, "stopped"), what="the stopped task to fail", timeout_s=15
    )
    reason = failure(run_dir, "stopped")
    assert reason is not None and re.match(r"^hung: step \d+ ran [\d.]+ s, over 2 x budget", reason)
    assert not running(pid)


def test_a_task_sigstopped_between_steps_is_killed_and_fails_hung(
    run_dir: RunDir, worker: WorkerProcess, client: WorkerClient
) -> None:
    pid = client.attach(COUNTING, task_id="idle", limits={"budget_s": 0.004}).payload["pid"]
    wait_until(
        lambda: any(s.state == "PAUSED" for s in states(run_dir, "idle")),
        timeout_s=STARTUP_S,
        what="the task to wait for bubbles",
    )
    psutil.Process(pid).suspend()  # SIGSTOP while it waits for the next bubble
    wait_until(lambda: failure(run_dir, "idle"), timeout_s=15, what="the stopped task to fail")
    reason = failure(run_dir, "idle")
    assert reason is not None
    assert re.match(r"^hung: the task process sent no heartbeat for [\d.]+ s \(3 missed", reason)
    assert not running(pid)


# -- cleanup ----------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["WARN", "PAUSE", "KILL"])
def test_detaching_a_task_stuck_in_its_step_ends_it_within_10_s_under_every_policy(
    run_dir: RunDir, worker: WorkerProcess, client: WorkerClient, tmp_path: Path, policy: str
) -> None:
    pid, _ = in_a_step(
        worker,
        client,
        tmp_path / "stuck",
        "StuckStep",
        task_id="stuck",
        overrun_policy=policy,
        hang_after_s=300.0,  # so that only the detach ends it
    )
    begun = time.monotonic()
    ack = client.detach("stuck")
    took_s = time.monotonic() - begun
    assert (ack.ok, ack.payload["state"]) == (True, "FAILED"), ack.message
    assert took_s <= CLEANUP_S, f"detach took {took_s:.1f} s"
    assert not running(pid)
    wait_until(lambda: failure(run_dir, "stuck"), timeout_s=5, what="its FAILED event")
    assert str(failure(run_dir, "stuck")).startswith("killed: did not stop within 8 s")


def test_stopping_the_worker_ends_a_stuck_and_a_queued_task_within_10_s(
    run_dir: RunDir, worker: WorkerProcess, client: WorkerClient, tmp_path: Path
) -> None:
    stuck, _ = in_a_step(
        worker, client, tmp_path / "stuck", "StuckStep", task_id="stuck", hang_after_s=300.0
    )
    queued = client.attach(COUNTING, task_id="queued").payload["pid"]
    begun = time.monotonic()
    worker.stop()
    took_s = time.monotonic() - begun
    assert took_s <= CLEANUP_S, f"stopping the worker took {took_s:.1f} s"
    assert not running(stuck) and not running(queued)
    assert any(s.state == "STOPPED" for s in states(run_dir, "queued"))


# -- the worker's heartbeat -------------------------------------------------------------------


def test_a_sigstopped_worker_falls_silent_and_counts_as_hung(
    run_dir: RunDir, worker: WorkerProcess
) -> None:
    worker.client(timeout_s=60)  # it listens: it beats
    assert worker.popen is not None
    pid = worker.popen.pid
    path = heartbeat_path(run_dir.path, 0)
    first = read_heartbeat(path)
    assert first is not None and first.pid == pid
    wait_until(
        lambda: (read_heartbeat(path) or first).count > first.count,
        timeout_s=10,
        what="a second heartbeat",
    )
    assert worker_hang_reason(run_dir.path, 0, pid) is None
    psutil.Process(pid).suspend()
    try:
        wait_until(
            lambda: worker_hang_reason(run_dir.path, 0, pid),
            timeout_s=10,
            what="the stopped worker to count as hung",
        )
        reason = worker_hang_reason(run_dir.path, 0, pid)
        assert reason is not None
        assert re.match(
            rf"^hung: worker for rank 0 \(pid {pid}\) sent no heartbeat for [\d.]+ s "
            r"\(3 missed, one every 0\.5 s\)$",
            reason,
        )
    finally:
        psutil.Process(pid).resume()
    wait_until(
        lambda: worker_hang_reason(run_dir.path, 0, pid) is None,
        timeout_s=10,
        what="the continued worker to beat again",
    )


def test_a_worker_that_stops_normally_removes_its_heartbeat(
    run_dir: RunDir, worker: WorkerProcess
) -> None:
    worker.client(timeout_s=60)
    path = heartbeat_path(run_dir.path, 0)
    assert read_heartbeat(path) is not None
    worker.stop()
    assert not path.exists(), json.dumps(str(read_heartbeat(path)))
