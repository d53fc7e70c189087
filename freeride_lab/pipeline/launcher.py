"""The launcher: ``python -m freeride_lab.pipeline.launcher --run-dir DIR``, the one process a
``Session`` starts. It owns torchrun and, through it, the training ranks.

    Session (notebook kernel or CLI)             same process group as the caller
      └─ launcher            SIGINT ignored, parent-death watchdog, child subreaper
           └─ torchrun       python -m freeride_lab.pipeline.torchrun … (SIGINT left ignored)
                └─ S/nnodes ranks    python -m freeride_lab.pipeline.rank --run-dir DIR

Why a launcher: if the kernel is SIGKILLed, torchrun would survive it as an orphan and train on.
The launcher notices its parent's death (``PR_SET_PDEATHSIG`` plus ``getppid`` polling) and stops
everything: SIGTERM to every descendant, ``grace_s``, then SIGKILL. It does the same on SIGTERM
(``Session.stop()``). It writes ``status.json`` when torchrun is up (state "running") and when
the run ends ("finished", "failed" with the failing rank and why, or "stopped").

[Note: SIGINT and torchrun]
A notebook's Interrupt sends SIGINT to the kernel's whole process group, which holds the
launcher, torchrun and the ranks. The launcher and the ranks ignore it, and an ignored signal
stays ignored across exec. torchrun, however, installs its own handler for every signal in
``--signals-to-handle`` (default SIGTERM,SIGINT,SIGHUP,SIGQUIT) and tears the workers down on
it; the launcher therefore passes the list without SIGINT, so torchrun keeps it ignored.

[Note: keeping descendants in the tree]
The launcher makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``): if torchrun dies
first, its ranks are re-parented to the launcher instead of init, so
``psutil.Process().children(recursive=True)`` still finds them. torchrun also gets
``PR_SET_PDEATHSIG`` = SIGTERM, so a launcher killed alone (OOM killer) still stops it.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from enum import StrEnum
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

from freeride_lab.io.child_wait import wait_exit
from freeride_lab.io.fast_exit import exit_now
from freeride_lab.io.rundir import RunDir, open_append
from freeride_lab.pipeline.rendezvous import (
    DEFAULT_RANK_ENTRY,
    TORCHRUN_SIGNALS,
    Rendezvous,
    free_port,
    torchrun_command,
)
from freeride_lab.pipeline.run_failure import failure_reason

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_RANK_ENTRY",
    "EXIT_CODES",
    "RUN_TRANSITIONS",
    "TORCHRUN_SIGNALS",
    "Launcher",
    "Rendezvous",
    "RunState",
    "advance",
    "failure_reason",
    "free_port",
    "main",
    "state_of_exit_code",
    "stop_processes",
    "torchrun_command",
]

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


class RunState(StrEnum):
    """Where a run is; the launcher writes it to status.json."""

    STARTING = "starting"  # launcher started, torchrun not yet
    RUNNING = "running"
    FINISHED = "finished"  # every rank ended normally
    FAILED = "failed"  # a rank (or torchrun) failed
    STOPPED = "stopped"  # stopped on request or because the owner died

    @property
    def done(self) -> bool:
        """True for the terminal states."""
        return self in (RunState.FINISHED, RunState.FAILED, RunState.STOPPED)


RUN_TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    RunState.STARTING: frozenset({RunState.RUNNING, RunState.FAILED, RunState.STOPPED}),
    RunState.RUNNING: frozenset({RunState.FINISHED, RunState.FAILED, RunState.STOPPED}),
    RunState.FINISHED: frozenset(),
    RunState.FAILED: frozenset(),
    RunState.STOPPED: frozenset(),
}


#: The launcher's exit code for each final state, so that its parent knows how the run ended
#: even when the status file could not be written (a full disk).
EXIT_CODES = {RunState.FINISHED: 0, RunState.FAILED: 1, RunState.STOPPED: 3}


def state_of_exit_code(code: int | None) -> RunState | None:
    """The final state a launcher exit code stands for (None: killed, or not a launcher code)."""
    return next((state for state, c in EXIT_CODES.items() if c == code), None)


def advance(current: RunState, new: RunState) -> RunState:
    """``new`` if ``RUN_TRANSITIONS`` allows ``current`` → ``new``, else ValueError."""
    if new not in RUN_TRANSITIONS[current]:
        allowed = ", ".join(sorted(RUN_TRANSITIONS[current])) or "nothing (terminal)"
        raise ValueError(f"run state {current} cannot become {new}; {current} allows: {allowed}")
    return new


def stop_processes(
    procs: Sequence[psutil.Process],
    grace_s: float,
    *,
    poll: Callable[[], object] = lambda: None,
    kill_wait_s: float = 5.0,
) -> list[psutil.Process]:
    """SIGTERM every process, wait up to ``grace_s`` for all to end, SIGKILL the rest.

    ``poll`` runs while waiting (e.g. ``Popen.poll`` to reap one's own child). Returns the
    processes that needed SIGKILL.
    """
    for p in procs:
        _signal(p, signal.SIGTERM)
    alive = _wait_gone(procs, grace_s, poll)
    for p in alive:
        log.warning("pid %d did not end within %.1f s of SIGTERM; sending SIGKILL", p.pid, grace_s)
        _signal(p, signal.SIGKILL)
    still = _wait_gone(alive, kill_wait_s, poll)
    for p in still:
        log.error("pid %d survived SIGKILL for %.1f s", p.pid, kill_wait_s)
    return alive


def _signal(p: psutil.Process, sig: int) -> None:
    with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
        p.send_signal(sig)


def _alive(p: psutil.Process) -> bool:
    try:
        return bool(p.is_running() and p.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _wait_gone(
    procs: Sequence[psutil.Process], timeout_s: float, poll: Callable[[], object]
) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout_s
    while True:
        poll()
        alive = [p for p in procs if _alive(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)


def _prctl(option: int, value: int) -> bool:
    """Linux prctl(2); False where unavailable."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _torchrun_preexec() -> None:
    """In torchrun, before exec: SIGTERM when the launcher dies."""
    _prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


class Launcher:
    """Runs torchrun for one run directory and reports how the run ended.

    Args:
        parent_pid: the owner's pid; when ``os.getppid()`` stops being it, the run is stopped.
            None watches nothing (a launcher started by hand).
        grace_s: SIGTERM → SIGKILL delay for torchrun and the ranks.
    """

    def __init__(self, run_dir: RunDir, *, parent_pid: int | None, grace_s: float = 10.0) -> None:
        self.run_dir = run_dir
        self.parent_pid = parent_pid
        self.grace_s = grace_s
        self.state = RunState.STARTING
        self.status: dict[str, Any] = {}
        self._term_requested = False
        self._proc: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        pid = self._proc.pid if self._proc else None
        return f"<Launcher {self.run_dir.path} state={self.state} torchrun_pid={pid}>"

    def run(self) -> int:
        """Start torchrun, supervise it, write the final status; returns the exit code."""
        self._install_watchdogs()
        if self._parent_gone():
            return self._finish(
                RunState.STOPPED,
                None,
                f"owner pid {self.parent_pid} exited before the launcher started",
            )
        try:
            run = self.run_dir.read_run()
            rdzv = Rendezvous.from_config(run["config"])
            if rdzv.master_port is None:
                rdzv = replace(rdzv, master_port=free_port(rdzv.master_addr))
            entry = tuple(run.get("rank_entry") or DEFAULT_RANK_ENTRY)
            cmd = torchrun_command(rdzv, self.run_dir, entry=entry, grace_s=self.grace_s)
            out = os.fdopen(open_append(self.run_dir.logs_dir / "torchrun.log"), "ab")
            with out:
                self._proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    preexec_fn=_torchrun_preexec,  # no threads exist here yet
                )
        except Exception as e:
            log.exception("could not start torchrun")
            return self._finish(RunState.FAILED, None, f"could not start torchrun: {e}")
        self._write(RunState.RUNNING, torchrun_pid=self._proc.pid, command=cmd)
        log.info("torchrun pid %d: %s", self._proc.pid, " ".join(cmd))
        return self._supervise(self._proc)

    def _supervise(self, proc: subprocess.Popen[bytes]) -> int:
        reason = ""
        while proc.poll() is None:
            reason = self._stop_reason()
            if reason:
                log.warning("%s; stopping torchrun and ranks (grace %.1f s)", reason, self.grace_s)
                stop_processes(self._descendants(), self.grace_s, poll=proc.poll)
                proc.wait()
                break
            wait_exit(proc, 0.1)  # asleep until torchrun exits or 0.1 s passes: no polling
        code = proc.returncode
        reason = reason or self._stop_reason()  # a stop can race torchrun's own exit
        self._reap_orphans()
        if reason:
            return self._finish(RunState.STOPPED, code, reason)
        if code == 0:
            return self._finish(RunState.FINISHED, code, "every rank finished")
        rank, why = failure_reason(self.run_dir, code)
        return self._finish(RunState.FAILED, code, why, failed_rank=rank)

    def _stop_reason(self) -> str:
        """Why the run must stop now ("" if it need not)."""
        if self._term_requested:
            return "stopped on request (SIGTERM to the launcher)"
        if self._parent_gone():
            return f"stopped because the owner (pid {self.parent_pid}) exited"
        return ""

    def _install_watchdogs(self) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, self._on_sigterm)
        # The death signal is a plain wake-up (SIGUSR1): it also fires when the *thread* that
        # started us exits, so _parent_gone() confirms with getppid() before acting.
        signal.signal(signal.SIGUSR1, lambda signum, frame: None)
        if self.parent_pid is not None:
            _prctl(_PR_SET_PDEATHSIG, int(signal.SIGUSR1))
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self._term_requested = True

    def _parent_gone(self) -> bool:
        return self.parent_pid is not None and os.getppid() != self.parent_pid

    def _descendants(self) -> list[psutil.Process]:
        try:
            return list(psutil.Process().children(recursive=True))
        except psutil.Error:
            return []

    def _reap_orphans(self) -> None:
        """Stop ranks left behind by torchrun (re-parented to us) and reap every child."""
        left = [p for p in self._descendants() if _alive(p)]
        if left:
            log.warning(
                "stopping %d process(es) torchrun left behind: %s", len(left), [p.pid for p in left]
            )
            stop_processes(left, self.grace_s, poll=_reap_children)
        _reap_children()

    def _write(self, state: RunState, **fields: Any) -> None:
        self.state = advance(self.state, state)
        self.status.update(fields, state=str(state), launcher_pid=os.getpid(), t_ns=time.time_ns())
        try:
            self.run_dir.write_json(self.run_dir.status_json, self.status)
        except OSError as e:  # a full disk must not stop the launcher supervising and reaping
            log.warning("cannot write %s (%s); run state %s", self.run_dir.status_json, e, state)

    def _finish(
        self, state: RunState, code: int | None, reason: str, *, failed_rank: int | None = None
    ) -> int:
        log.info("run %s: %s", state, reason)
        self._write(
            state, exit_code=code, reason=reason, failed_rank=failed_rank, ended_ns=time.time_ns()
        )
        return EXIT_CODES[state]


def _reap_children() -> None:
    """Collect the exit status of every child that has ended (we are a subreaper)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m freeride_lab.pipeline.launcher``."""
    parser = argparse.ArgumentParser(
        prog="python -m freeride_lab.pipeline.launcher",
        description="Run torchrun for a run directory and watch it.",
    )
    parser.add_argument("--run-dir", required=True, type=Path, help="run directory with run.json")
    parser.add_argument(
        "--parent-pid",
        type=int,
        default=None,
        help="stop the run when this process (the owner) exits",
    )
    parser.add_argument(
        "--grace-s",
        type=float,
        default=10.0,
        help="seconds between SIGTERM and SIGKILL when stopping",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s launcher %(levelname)s %(name)s: %(message)s"
    )
    return Launcher(RunDir(args.run_dir), parent_pid=args.parent_pid, grace_s=args.grace_s).run()


if __name__ == "__main__":
    # [Note: fast exit] in pipeline.rank: the final status is written and every child reaped; the
    # launcher has imported torchrun (its option list), whose teardown would delay the stop.
    exit_now(main())
