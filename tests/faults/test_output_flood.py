"""A side task that prints without end leaves at most 10 MB of log and goes on working.

A real ``task_host`` process (``TaskProcess``, as its worker starts it) prints 100 MiB from its
``setup()``; its log file must stop at the cap with a "truncated" line, the task must still
reach its states, step and stop cleanly, and a second process of the same task (a restart)
must not grow the file past the cap either. The same flood during a real training run is in
``test_hangs_in_a_run``.
"""

from __future__ import annotations

from typing import Any

from runs import serve_until, start_task_host
from unruly_tasks import ref

from freeride_lab.core.sidetask_state import SideTaskState
from freeride_lab.io.rundir import RunDir
from freeride_lab.sidetasks.process import TaskProcess
from freeride_lab.sidetasks.task_log import TASK_LOG_CAP_BYTES

MB = 1_000_000
FLOOD_S = 120.0  # the longest a task flooding its output may take to reach a state


def start_flood(run_dir: RunDir, hosts: list[TaskProcess], **options: Any) -> TaskProcess:
    return start_task_host(run_dir, hosts, ref("Flood"), "loud", options=options)


def stop_and_drain(proc: TaskProcess) -> int:
    """Stop the task; its exit code once its output has ended too."""
    proc.stop("test")
    assert proc.proc is not None and proc.log is not None
    assert proc.log.join(30), "the output pipe did not end"
    return proc.proc.returncode


def test_a_task_printing_100_mib_leaves_at_most_10_mb_of_log_and_goes_on(
    run_dir: RunDir, hosts: list[TaskProcess]
) -> None:
    proc = start_flood(run_dir, hosts, total_mib=100)
    # setup() printed all of it and returned
    serve_until(proc, SideTaskState.CREATED, timeout_s=FLOOD_S)
    assert proc.request({"cmd": "activate"})
    serve_until(proc, SideTaskState.PAUSED, timeout_s=FLOOD_S)
    assert stop_and_drain(proc) == 0
    assert proc.state is SideTaskState.STOPPED
    log = run_dir.logs_dir / "task-loud.log"
    assert TASK_LOG_CAP_BYTES <= 10 * MB
    assert 9 * MB < log.stat().st_size <= TASK_LOG_CAP_BYTES
    tail = log.read_bytes()[-1000:].decode()
    assert "[freeride_lab] output truncated: this log keeps at most 10,000,000 bytes" in tail
    assert proc.log is not None and proc.log.dropped_bytes > 90 * MB
    assert f"{proc.log.dropped_bytes:,} bytes of output dropped" in tail


def test_a_restarted_task_does_not_grow_its_log_past_the_cap(
    run_dir: RunDir, hosts: list[TaskProcess]
) -> None:
    for _ in range(2):
        proc = start_flood(run_dir, hosts, total_mib=12)
        serve_until(proc, SideTaskState.CREATED, timeout_s=FLOOD_S)
        assert stop_and_drain(proc) == 0
    assert (run_dir.logs_dir / "task-loud.log").stat().st_size <= TASK_LOG_CAP_BYTES
