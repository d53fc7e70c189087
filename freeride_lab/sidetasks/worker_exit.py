"""How a side-task worker ended, as its parent (the rank) saw it: ``workers/worker-<r>.exit.json``.

    record_exit(run_dir, rank, pid=4242, returncode=-9)   # the rank, once it reaped its worker
    read_exit(run_dir, rank).how                          # "killed by SIGKILL"

# [Note: worker death]
Only a worker's parent can learn its exit status (``waitpid``), and a worker killed outright
(SIGKILL, the OOM killer, a crash in native code) says nothing on its way out. So the rank that
started it (``worker_client.WorkerProcess``) waits for it in a daemon thread and writes this
record when it exits, whatever the reason. The session's watchdog
(``lab.manager.SideTaskManager.check_workers``) turns a record of an abnormal end into FAILED
states, with the reason ("worker for rank 1 died: killed by SIGKILL"), for the tasks the worker
left unended. A worker whose own loop raises reports its tasks FAILED itself before it exits
with code 1 (``worker``), so its tasks never read as a normal end either.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from dataclasses import asdict, dataclass
from pathlib import Path

from freeride_lab.io.rundir import RunDir

log = logging.getLogger(__name__)

__all__ = ["WorkerExit", "clear_exit", "exit_file", "exit_reason", "read_exit", "record_exit"]


@dataclass(frozen=True, kw_only=True)
class WorkerExit:
    """One worker's end: its pid and ``Popen.returncode`` (negative: killed by that signal)."""

    rank: int
    pid: int
    returncode: int

    @property
    def normal(self) -> bool:
        """It exited with code 0 (having ended its tasks itself)."""
        return self.returncode == 0

    @property
    def how(self) -> str:
        """In words: "killed by SIGKILL", "exit code 1"."""
        return exit_reason(self.returncode)


def exit_reason(returncode: int) -> str:
    """``Popen.returncode`` in words: "killed by SIGSEGV" for -11, "exit code 1" for 1."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def exit_file(run_dir: str | os.PathLike[str], rank: int) -> Path:
    """Where the end of the worker of ``rank`` is recorded."""
    return Path(run_dir) / "workers" / f"worker-{rank}.exit.json"


def record_exit(run_dir: str | os.PathLike[str], rank: int, *, pid: int, returncode: int) -> None:
    """Write the record (atomically); a run directory that cannot take it is logged."""
    path = exit_file(run_dir, rank)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        record = WorkerExit(rank=rank, pid=pid, returncode=returncode)
        RunDir(Path(run_dir)).write_json(path, asdict(record))
    except OSError as exc:
        log.warning("cannot record how the worker of rank %d ended in %s: %s", rank, path, exc)


def read_exit(run_dir: str | os.PathLike[str], rank: int) -> WorkerExit | None:
    """The recorded end of the worker of ``rank``; None while it runs or if nobody recorded
    it (a damaged record counts as none)."""
    try:
        data = json.loads(exit_file(run_dir, rank).read_text())
        fields = (data["rank"], data["pid"], data["returncode"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if not all(type(v) is int for v in fields):
        return None
    return WorkerExit(rank=fields[0], pid=fields[1], returncode=fields[2])


def clear_exit(run_dir: str | os.PathLike[str], rank: int) -> None:
    """Forget a previous worker's end: a new worker of ``rank`` is starting."""
    try:
        exit_file(run_dir, rank).unlink(missing_ok=True)
    except OSError as exc:
        log.warning("cannot remove %s: %s", exit_file(run_dir, rank), exc)
