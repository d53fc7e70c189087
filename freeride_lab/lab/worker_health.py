"""The side-task workers of a run, checked from the launching process: hung ones are killed,
and the tasks of a worker that died (SIGKILL, the OOM killer) or was killed fail, naming it.

``lab.manager.SideTaskManager.check_workers`` runs both (the session's watchdog calls it every
second, see ``lab.session`` [Note: worker watchdog]); reading ``tasks`` runs the second.

    health = WorkerHealth(run_dir, ranks=[0, 1, 2, 3], book=book)
    health.kill_hung()                     # SIGKILL workers silent for three heartbeats
    health.fail_tasks_of_dead_workers()    # their tasks become FAILED, in events/lab-R.jsonl too
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from freeride_lab.core.events import SideTaskStateChanged, to_json
from freeride_lab.core.sidetask_state import SideTaskEvent, SideTaskState, is_terminal
from freeride_lab.io.rundir import RunDir
from freeride_lab.lab.taskbook import TaskBook, TaskRecord
from freeride_lab.sidetasks.proctree import kill_tree
from freeride_lab.sidetasks.watchdog import worker_hang_reason
from freeride_lab.sidetasks.worker_exit import read_exit

log = logging.getLogger(__name__)

__all__ = ["WorkerHealth"]

_EXIT_RECORD_WAIT_S = 2.0  # a rank records its dead worker's exit status well within this


class WorkerHealth:
    """Checks the side-task workers of this node's ``ranks`` and fails the tasks of dead ones."""

    def __init__(self, run_dir: RunDir, *, ranks: list[int], book: TaskBook) -> None:
        self.run_dir = run_dir
        self.ranks = ranks
        self.book = book
        self._hung_workers: dict[int, tuple[int, str]] = {}  # rank -> (pid, why it was killed)
        self._gone_since: dict[tuple[int, int], float] = {}  # (rank, pid) -> when found gone

    def kill_hung(self) -> None:
        """SIGKILL every worker of this node that is silent for three heartbeats (SIGSTOPped,
        starved; see ``sidetasks.watchdog``), with its task processes, and remember why.

        Takes no lock: a request waiting on a hung worker must not shield it from this.
        """
        for rank in self.ranks:
            pid = _worker_pid(self.run_dir.path, rank)
            if pid is None or self._hung_workers.get(rank, (None, ""))[0] == pid:
                continue
            hung = worker_hang_reason(self.run_dir.path, rank, pid)
            if hung is None:
                continue
            cause = f"{hung}; killed it and its task processes (SIGKILL)"
            self._hung_workers[rank] = (pid, cause)  # before the kill: its tasks fail with it
            log.warning("%s", cause)
            kill_tree(pid)

    def fail_tasks_of_dead_workers(self) -> None:
        """Fail the tasks of a worker that died (SIGKILL, OOM killer) or that
        ``kill_hung`` killed: nothing else would say so.

        A task counts as the worker's if its state is not terminal, or if its process stopped
        itself because the worker's channel closed (reason "worker exited"); a worker that
        ends normally stops its tasks with other reasons first, so those are left alone. The
        reason says how the worker died, as its rank recorded it (``sidetasks.worker_exit``).
        """
        by_rank: dict[int, list[TaskRecord]] = {}
        for record in self.book.records().values():
            if not record.detached and self._worker_owns(record):
                by_rank.setdefault(record.rank, []).append(record)
        for rank, records in by_rank.items():
            cause = self._worker_death(rank)
            if cause is None:
                continue
            reason = f"{cause}; see {self.run_dir.logs_dir}/worker-{rank}.log"
            # Read again: what the worker wrote before it ended is all in its files now.
            records = [r for r in records if self._worker_owns(r)]
            now = time.time_ns()
            for record in records:
                log.warning("task %s failed: %s", record.id, reason)
                self.book.fail(record.id, reason, now)
                self._record_failure(record, reason, now)

    def _worker_death(self, rank: int) -> str | None:
        """How the worker of ``rank`` died; None while it runs, before it started, or after a
        normal exit (code 0: it ended its tasks itself, their events may still be on the way).

        A worker found gone without its rank's record of how (the rank has not reaped it yet,
        or died too) is given ``_EXIT_RECORD_WAIT_S`` for the record to appear.
        """
        ended = read_exit(self.run_dir.path, rank)
        if ended is not None and ended.normal:
            return None
        pid = ended.pid if ended is not None else _worker_pid(self.run_dir.path, rank)
        if pid is None or (ended is None and _process_alive(pid)):
            return None
        killed_pid, cause = self._hung_workers.get(rank, (None, ""))
        if killed_pid == pid:
            return cause
        if ended is not None:
            return f"worker for rank {rank} died: {ended.how} (pid {pid})"
        gone_since = self._gone_since.setdefault((rank, pid), time.monotonic())
        if time.monotonic() - gone_since < _EXIT_RECORD_WAIT_S:
            return None
        return (
            f"worker for rank {rank} died: pid {pid} is gone, and its rank recorded no exit "
            "status (it may have died too)"
        )

    def _worker_owns(self, record: TaskRecord) -> bool:
        """Whether the task's fate is its worker's: not ended, or stopped by its channel closing."""
        state, reason = self.book.observed(record.id)
        orphaned = state == SideTaskState.STOPPED and reason == "worker exited"
        return orphaned or not is_terminal(SideTaskState(state))

    def _record_failure(self, record: TaskRecord, reason: str, t_ns: int) -> None:
        """Write the FAIL to the run directory, so a later ``Session.open`` sees it too: one
        line, appended in one write, to ``events/lab-<rank>.jsonl`` (no process writes there)."""
        event = SideTaskStateChanged(
            task_id=record.id,
            name=record.name,
            stage=record.stage,
            state=str(SideTaskState.FAILED),
            t_ns=t_ns,
            event=str(SideTaskEvent.FAIL),
            reason=reason,
        )
        path = self.run_dir.events_dir / f"lab-{record.rank}.jsonl"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, (to_json(event) + "\n").encode())
            finally:
                os.close(fd)
        except OSError as exc:  # the tables in memory still say FAILED
            log.warning("cannot record the failure of task %s in %s: %s", record.id, path, exc)


def _worker_pid(run_dir: Path, rank: int) -> int | None:
    """The pid the worker of ``rank`` published, or None before it did."""
    from freeride_lab.sidetasks.client import worker_address_file

    try:
        pid = json.loads(worker_address_file(run_dir, rank).read_text()).get("pid")
    except (OSError, ValueError, AttributeError):
        return None
    return pid if isinstance(pid, int) and pid > 0 else None


def _process_alive(pid: int) -> bool:
    """Running (a zombie, killed but not yet reaped by its rank, is not)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
