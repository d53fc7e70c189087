"""Hang detection from outside the hung process: the worker's ``TaskWatchdog`` and the session's
``worker_hang_reason``.

    watchdog = TaskWatchdog(lambda: list(tasks.values()), heartbeat=WorkerHeartbeat(path, …))
    watchdog.start()        # a thread of the worker: judges every task, beats for the session
    watchdog.stop()

    reason = worker_hang_reason(run_dir, rank, pid)   # the session: is that worker silent?

The rules are ``core.hangs``; the marks they judge are ``sidetasks.heartbeat``'s. Every
``poll_s`` the watchdog reads each task process's beacon:

- a **step** running longer than ``2 x budget + hang_after_s`` → the task process and its
  descendants are killed with SIGKILL (``proctree.kill_tree``) and the task ends FAILED with
  "hung: step 12 ran 3.4 s, over 2 x budget + 1 s = 1.1 s (budget 50 ms)";
- a **wait** (for a bubble edge or a command, each bounded by 0.5 s) not over after three
  times its bound → the same, "hung: the task process sent no heartbeat for 1.6 s (…)". A
  SIGSTOPped task, or one whose other thread holds the GIL, is caught this way;
- anything else (setup, hooks, checkpoints: user code of any length; a process the worker itself
  stopped with SIGSTOP) is not judged.

# [Note: the first step on a GPU]
A CUDA process's first step initialises lazily: kernels load on first use, cuBLAS and cuDNN
create their handles and pick algorithms. Measured on an H200 (each built-in task in a fresh
process, preset "gpu"): resnet18's first step took 1.58 s against 14 ms after it, resnet50's
0.76 s against 34 ms, vgg19's 0.46 s against 57 ms, so ``2 x budget + 1 s`` would kill healthy
tasks there. On CUDA devices the first step of each task process therefore gets the slack
``max(hang_after_s, CUDA_FIRST_STEP_SLACK_S)``; every later step gets the rule as it stands.

It kills; the worker's main loop then reaps the process and writes the FAILED state with the
reason (``TaskProcess.kill_reason``). The same thread beats the worker's own heartbeat, so a
worker that is SIGSTOPped or starved goes silent and the session kills it (``lab.manager``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from freeride_lab.core.hangs import hung_step_reason, silence_reason
from freeride_lab.io.background import BackgroundThread
from freeride_lab.sidetasks.heartbeat import (
    BeaconPhase,
    BeaconReading,
    WorkerHeartbeat,
    heartbeat_path,
    read_heartbeat,
)

if TYPE_CHECKING:
    from freeride_lab.sidetasks.process import TaskProcess

log = logging.getLogger(__name__)

__all__ = [
    "CUDA_FIRST_STEP_SLACK_S",
    "TASK_POLL_S",
    "WORKER_HEARTBEAT_S",
    "TaskWatchdog",
    "task_hang_reason",
    "worker_hang_reason",
]

TASK_POLL_S = 0.05  # how often the worker looks at its tasks' beacons
WORKER_HEARTBEAT_S = 0.5  # how often a worker beats for the session
#: The slack of a CUDA task process's first step (see [Note: the first step on a GPU]).
CUDA_FIRST_STEP_SLACK_S = 10.0


def task_hang_reason(
    reading: BeaconReading,
    *,
    now_ns: int,
    slack_ns: int,
    continued_ns: int = 0,
    first_step_slack_ns: int = 0,
) -> str | None:
    """Why a task process whose beacon says ``reading`` is hung at ``now_ns``, or None.

    Args:
        slack_ns: the task's ``hang_after_s`` in ns.
        continued_ns: when the worker last continued the process after stopping it itself
            (a wait counts from then, not from before the stop).
        first_step_slack_ns: the least slack of the process's first step (see [Note: the
            first step on a GPU]); 0 = none.
    """
    if reading.phase is BeaconPhase.STEP:
        if reading.first:
            slack_ns = max(slack_ns, first_step_slack_ns)
        return hung_step_reason(
            reading.step,
            ran_ns=now_ns - reading.mark_ns,
            budget_ns=reading.budget_ns,
            slack_ns=slack_ns,
        )
    if reading.phase is BeaconPhase.WAITING:
        since_ns = max(reading.mark_ns, continued_ns)
        return silence_reason(
            "the task process", silent_ns=now_ns - since_ns, period_ns=reading.period_ns
        )
    return None


class TaskWatchdog:
    """The worker's thread that judges its task processes and beats for the session.

    Args:
        tasks: the worker's task processes, now (called from the watchdog's thread).
        heartbeat: the worker's heartbeat file; None = do not beat.
        first_step_slack_s: the least slack of each process's first step (CUDA workers:
            ``CUDA_FIRST_STEP_SLACK_S``); 0 = none.
    """

    def __init__(
        self,
        tasks: Callable[[], Iterable[TaskProcess]],
        *,
        heartbeat: WorkerHeartbeat | None,
        first_step_slack_s: float = 0.0,
        poll_s: float = TASK_POLL_S,
    ) -> None:
        self._tasks = tasks
        self.heartbeat = heartbeat
        self.first_step_slack_ns = int(first_step_slack_s * 1e9)
        self.poll_s = poll_s
        self.killed = 0
        self._thread = BackgroundThread(self._run, name="worker-watchdog")

    def start(self) -> TaskWatchdog:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop judging and beating; idempotent."""
        self._thread.stop(timeout_s)

    def _run(self, stop: threading.Event) -> None:
        next_beat_ns = 0
        while not stop.is_set():
            now_ns = time.monotonic_ns()
            if self.heartbeat is not None and now_ns >= next_beat_ns:
                self.heartbeat.beat()
                next_beat_ns = now_ns + self.heartbeat.period_ns
            try:
                self.check(now_ns)
            except Exception:  # a watchdog must outlive what it watches; say why, go on
                log.exception("worker watchdog: checking the task processes failed")
            stop.wait(self.poll_s)

    def check(self, now_ns: int) -> list[TaskProcess]:
        """One look at every task process; the ones it killed."""
        killed = []
        for task in list(self._tasks()):
            beacon = task.beacon
            if beacon is None or task.sigstopped or task.kill_reason or not task.alive:
                continue
            reading = beacon.read()
            if reading is None:
                continue
            reason = task_hang_reason(
                reading,
                now_ns=now_ns,
                slack_ns=int(task.spec.hang_after_s * 1e9),
                continued_ns=task.continued_ns,
                first_step_slack_ns=self.first_step_slack_ns,
            )
            if reason is None or task.sigstopped:
                continue
            task.kill(reason)
            log.warning("task %s (pid %s): %s; killed it", task.task_id, task.pid, reason)
            self.killed += 1
            killed.append(task)
        return killed

    def __repr__(self) -> str:
        state = "running" if self._thread.running else "idle"
        return f"<TaskWatchdog({state}, killed={self.killed})>"


def worker_hang_reason(
    run_dir: str | os.PathLike[str], rank: int, pid: int, *, now_ns: int | None = None
) -> str | None:
    """Why the worker ``pid`` of ``rank`` counts as hung, or None (alive by its heartbeat, or
    no heartbeat of that pid to judge yet). ``now_ns`` is ``time.monotonic_ns()``."""
    beat = read_heartbeat(heartbeat_path(run_dir, rank))
    if beat is None or beat.pid != pid:
        return None
    now_ns = time.monotonic_ns() if now_ns is None else now_ns
    return silence_reason(
        f"worker for rank {rank} (pid {pid})",
        silent_ns=now_ns - beat.beat_ns,
        period_ns=beat.period_ns,
    )
