"""The processes of a run this process owns: start, watch, stop and settle them; who may
command the run.

``RunProcesses`` is the process half of ``lab.session.Session`` (mixed in): ``_start`` runs
the launcher in the caller's process group, a watchdog thread checks the side-task workers and
settles the run once the launcher has exited, ``stop`` ends the whole process tree (TERM →
grace → KILL), and ``_read_only`` says why an observer may not. See ``lab.session``
[Note: owner and observers], [Note: MPS daemon] and [Note: worker watchdog].
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.metadata
import itertools
import json
import logging
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import psutil

from freeride_lab.core.config import RunConfig
from freeride_lab.io.bus import BusBatch, BusServer
from freeride_lab.io.rundir import RunDir, open_append
from freeride_lab.lab.run_mps import RunMps
from freeride_lab.pipeline.launcher import RunState, state_of_exit_code, stop_processes

if TYPE_CHECKING:
    from freeride_lab.lab.governor import GovernorLoop
    from freeride_lab.lab.manager import SideTaskManager
    from freeride_lab.lab.tables import EventTables

log = logging.getLogger(__name__)

__all__ = [
    "EDGES_FACTORY",
    "LAUNCHER_STATUS_MARGIN_S",
    "WATCHDOG_PERIOD_S",
    "RunProcesses",
    "live_session",
    "parse_state",
    "software_versions",
    "with_side_tasks",
]

_EXIT_REASONS = {
    RunState.FINISHED: "every rank finished",
    RunState.FAILED: "the run failed",
    RunState.STOPPED: "the run was stopped",
}

LAUNCHER_STATUS_MARGIN_S = 3.0  # extra time stop() gives the launcher to write its status
EDGES_FACTORY = "freeride_lab.sidetasks.client:open_edges"  # a worker beside each rank
WATCHDOG_PERIOD_S = 1.0  # how often the owner checks that side-task workers are alive

# The one piece of global state (house rule 14): sessions this process owns and must stop at exit.
_live_sessions: weakref.WeakSet[RunProcesses] = weakref.WeakSet()


def live_session(path: Path) -> RunProcesses | None:
    """The session this process owns for the run directory ``path`` while it is live."""
    for live in list(_live_sessions):
        if live.run_dir.path.resolve() == path.resolve():
            return live
    return None


def _stop_live_sessions() -> None:
    for session in list(_live_sessions):
        try:
            session.stop()
        except Exception:
            log.exception("could not stop %r at exit", session)


def parse_state(value: object) -> RunState:
    """The ``RunState`` a status.json's ``state`` names; STARTING when it names none."""
    try:
        return RunState(str(value))
    except ValueError:
        return RunState.STARTING  # no status yet (or one this version does not know)


def software_versions() -> dict[str, str]:
    """The python, torch and freeride_lab versions here ("unknown" for one not installed)."""

    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "unknown"

    return {
        "python": platform.python_version(),
        "torch": version("torch"),
        "freeride_lab": version("freeride-lab"),
    }


def _child_env() -> dict[str, str]:
    """The environment for the launcher: ours, with this package importable for sure."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # the directory holding freeride_lab/
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in parts:
        env["PYTHONPATH"] = os.pathsep.join([*parts, root])
    return env


def with_side_tasks(config: RunConfig) -> RunConfig:
    """``config`` with the edges factory that starts a worker beside each rank, if wanted."""
    if not config.side_tasks or config.runtime.edges_factory is not None:
        return config
    return config.replace(runtime=config.runtime.replace(edges_factory=EDGES_FACTORY))


def _of_run(cmdline: Sequence[str], path: str) -> bool:
    """Whether a command line is one of the run's processes: ``--run-dir PATH`` (launcher,
    torchrun, ranks, side-task workers) or a task host whose spec names the run directory."""
    if any(a == "--run-dir" and b == path for a, b in itertools.pairwise(cmdline)):
        return True
    spec = f'"run_dir": {json.dumps(path)}'
    return any(a.startswith("{") and spec in a for a in cmdline)


def _process(pid: object, *, needle: str) -> psutil.Process | None:
    """The live process ``pid`` if its command line mentions ``needle`` (guards pid reuse)."""
    if pid is None:
        return None
    try:
        p = psutil.Process(int(str(pid)))
        if p.status() != psutil.STATUS_ZOMBIE and needle in " ".join(p.cmdline()):
            return p
    except (psutil.Error, ValueError):
        pass
    return None


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """Ignore SIGINT while starting a child, so that it starts with SIGINT ignored.

    An ignored signal stays ignored across exec and Python then installs no KeyboardInterrupt
    handler, so an Interrupt that arrives while the launcher is still importing cannot kill it.
    Signal handlers can only be changed on the main thread; elsewhere this does nothing and the
    launcher ignores SIGINT itself a moment later.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)


class RunProcesses:
    """The processes of a run (mixed into ``Session``, which provides its tables)."""

    run_dir: RunDir
    config: RunConfig
    run_id: str
    owner: bool
    grace_s: float
    _launcher: subprocess.Popen[bytes] | None
    _bus: BusServer | None
    _mps: RunMps
    _lock: threading.RLock
    _stop_lock: threading.Lock
    _stopped: bool
    _stop_requested: bool
    _unwritten_status: dict[str, Any] | None
    _manager: SideTaskManager | None
    _governor: GovernorLoop | None
    _watchdog: threading.Thread | None
    _watchdog_stop: threading.Event
    _tables: EventTables
    _ranks: range

    if TYPE_CHECKING:  # provided by Session and its other parts

        def _refresh(self, *, poll_files: bool = True) -> None: ...
        def _on_batch(self, batch: BusBatch) -> None: ...
        def _side_tasks(self) -> SideTaskManager: ...

    def _start(self, rank_entry: Sequence[str], secret: bytes, *, detached: bool = False) -> None:
        rd = self.run_dir
        self._bus = BusServer(secret, host=self.config.bus_host, on_batch=self._on_batch)
        try:
            self._bus.start()
            mps = self._mps.start()
            env = {**_child_env(), **self._mps.client_env()}
            run = {
                "run_id": self.run_id,
                "created_ns": time.time_ns(),
                "config": self.config.to_dict(),
                "bus": {"address": list(self._bus.address)},
                "owner_pid": os.getpid(),
                "launcher_pid": None,
                "rank_entry": list(rank_entry),
                "grace_s": self.grace_s,
                "host": socket.gethostname(),
                "versions": software_versions(),
                "mps": mps,
                "detached": detached,
            }
            rd.write_json(rd.run_json, run)
            cmd = [
                sys.executable, "-m", "freeride_lab.pipeline.launcher",
                "--run-dir", str(rd.path),
                "--parent-pid", str(os.getpid()),
                "--grace-s", str(self.grace_s),
            ]  # fmt: skip
            log_fd = open_append(rd.logs_dir / "launcher.log")
            with os.fdopen(log_fd, "ab") as out, _sigint_ignored():
                # Same process group as the caller, on purpose: a kernel restart reaches it.
                self._launcher = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    close_fds=True,
                )
            run["launcher_pid"] = self._launcher.pid
            rd.write_json(rd.run_json, run)
        except BaseException:
            if self._launcher is not None:
                self._stop_requested = True
                stop_processes([psutil.Process(self._launcher.pid)], self.grace_s)
                self._launcher.wait()
            self._bus.stop()
            self._stop_mps()
            raise
        _live_sessions.add(self)
        self._watchdog = threading.Thread(
            target=self._watch_run, name=f"freeride-watchdog-{self.run_id}", daemon=True
        )
        self._watchdog.start()
        atexit.unregister(_stop_live_sessions)  # registered once, however many sessions
        atexit.register(_stop_live_sessions)
        log.info("launched %s in %s (launcher pid %d)", self.run_id, rd.path, self._launcher.pid)

    def _watch_run(self) -> None:
        """The watchdog thread (see [Note: worker watchdog])."""
        tasks_dir = self.run_dir.path / "tasks"
        side_tasks = bool(self.config.side_tasks and self.config.runtime.edges_factory)
        while not self._watchdog_stop.wait(WATCHDOG_PERIOD_S):
            if self._launcher is None or self._launcher.poll() is not None:
                try:
                    self._settle()
                except Exception:
                    log.exception("settling %s after its launcher exited failed", self.run_id)
                return
            if not side_tasks or not tasks_dir.is_dir():
                continue  # nothing attached yet
            try:
                self._side_tasks().check_workers()
            except Exception:  # a watchdog must outlive what it watches; say why, go on
                log.exception("checking the side-task workers of %s failed", self.run_id)

    def _stop_watchdog(self) -> None:
        self._watchdog_stop.set()
        thread = self._watchdog
        if thread is not None and thread is not threading.current_thread():
            thread.join(WATCHDOG_PERIOD_S + 5.0)

    def _stop_mps(self) -> None:
        launcher = self._launcher.pid if self._launcher is not None else None
        self._mps.stop(
            leftovers=lambda: [p for p in self._run_processes() if p.pid != launcher],
            grace_s=self.grace_s,
        )

    @property
    def mps_active(self) -> bool:
        """Whether a private MPS daemon served this run (run.json's ``mps.active``)."""
        with contextlib.suppress(OSError, ValueError):
            return bool(self.run_dir.read_run().get("mps", {}).get("active", False))
        return False

    def stop(self, grace_s: float | None = None) -> None:
        """Stop the run: SIGTERM to its whole process tree, ``grace_s``, then SIGKILL. Idempotent.

        Raises:
            RuntimeError: on an observer while the run is alive (see [Note: owner and observers]).
        """
        if not self.owner:
            if self._state(poll_files=False).done:
                return
            run = self._run_info()
            if run.get("detached"):
                self._stop_detached(run, self.grace_s if grace_s is None else grace_s)
                return
            raise self._read_only(
                "stop it",
                run,
                also=f"send SIGTERM to its launcher: kill -TERM {self._launcher_pid()}",
            )
        with self._stop_lock:
            if self._stopped:
                return
            grace = self.grace_s if grace_s is None else grace_s
            launcher = self._launcher
            if launcher is not None and launcher.poll() is None:
                procs = self._run_processes()  # the whole tree, before any signal
                self._stop_requested = True
                log.info(
                    "stopping %s: SIGTERM to %d process(es), grace %.1f s",
                    self.run_id,
                    len(procs),
                    grace,
                )
                stop_processes(procs, grace + LAUNCHER_STATUS_MARGIN_S, poll=launcher.poll)
                leftovers = [p for p in self._run_processes() if p.pid != launcher.pid]
                if leftovers:
                    stop_processes(leftovers, 0.0)
                launcher.wait()
            self._settle()
            self._stopped = True
        self._stop_watchdog()
        _live_sessions.discard(self)

    # -- who may command the run (see [Note: owner and observers]) -----------------------------

    def _run_info(self) -> dict[str, Any]:
        """run.json now, or {} if it cannot be read."""
        try:
            return self.run_dir.read_run()
        except (OSError, ValueError):
            return {}

    def _check_owner(self, what: str) -> None:
        """Raise ``PermissionError`` unless this Session owns the run."""
        if not self.owner:
            raise self._read_only(what, self._run_info())

    def _read_only(self, what: str, run: Mapping[str, Any], *, also: str = "") -> PermissionError:
        """The refusal of ``what`` on an observer: who owns the run and what to do instead."""
        owner = run.get("owner_pid", "unknown")
        if run.get("detached"):
            return PermissionError(
                f"cannot {what}: run {self.run_id} is detached and its keeper (pid {owner}) owns "
                "it; this Session came from Session.open, and only the owning process can "
                f"{what}. To {what}, launch the run with Session.launch in that process"
            )
        instead = f"; or {also}" if also else ""
        return PermissionError(
            f"cannot {what}: run {self.run_id} belongs to pid {owner}, the process that "
            "launched it; this Session came from Session.open and is read-only. Do it with the "
            f"owning Session in pid {owner}{instead}. A run started with `freeride-lab launch` "
            "takes commands from any process of its user (its keeper carries them out)"
        )

    def _stop_detached(self, run: Mapping[str, Any], grace_s: float) -> None:
        """Stop a detached run from an observer: SIGTERM to its keeper (which stops the run
        like an owner, MPS included), then to what is left after the grace."""
        keeper = _process(run.get("owner_pid"), needle="freeride_lab.lab.keeper")
        if keeper is not None:
            log.info("stopping detached run %s via its keeper (pid %d)", self.run_id, keeper.pid)
            stop_processes([keeper], 2 * (grace_s + LAUNCHER_STATUS_MARGIN_S) + 10.0)
        leftovers = self._run_processes()
        if leftovers:
            stop_processes(leftovers, grace_s + LAUNCHER_STATUS_MARGIN_S)
        if not parse_state(self.run_dir.read_status().get("state")).done:
            status = self.run_dir.read_status()
            status.update(state=str(RunState.STOPPED), reason="stopped by an observer")
            status.setdefault("ended_ns", time.time_ns())
            self.run_dir.write_json(self.run_dir.status_json, status)
        self._refresh()

    def _run_processes(self) -> list[psutil.Process]:
        """The launcher, all its descendants, and any process of this run that left the tree
        (see ``_of_run``; a shell command that merely mentions the run directory is not one)."""
        found: dict[int, psutil.Process] = {}
        if self._launcher is not None:
            with contextlib.suppress(psutil.Error):
                root = psutil.Process(self._launcher.pid)
                found[root.pid] = root
                for p in root.children(recursive=True):
                    found[p.pid] = p
        path = str(self.run_dir.path)
        me = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
        for p in psutil.process_iter(["cmdline"]):
            cmdline = p.info.get("cmdline") or []
            if p.pid not in me and p.pid not in found and _of_run(cmdline, path):
                found[p.pid] = p
        return list(found.values())

    def _launcher_pid(self) -> int | None:
        if self._launcher is not None:
            return self._launcher.pid
        pid = self._read_status().get("launcher_pid")
        if pid is None:
            with contextlib.suppress(OSError, ValueError):
                pid = self.run_dir.read_run().get("launcher_pid")
        return int(pid) if pid is not None else None

    def _launcher_alive(self) -> bool:
        if self._launcher is not None:
            return self._launcher.poll() is None
        pid = self._launcher_pid()
        if pid is None:
            return False
        try:
            p = psutil.Process(pid)
            return p.status() != psutil.STATUS_ZOMBIE and str(self.run_dir.path) in " ".join(
                p.cmdline()
            )
        except psutil.Error:
            return False

    def _read_status(self) -> dict[str, Any]:
        status = self.run_dir.read_status()
        if self._unwritten_status is not None and not parse_state(status.get("state")).done:
            return self._unwritten_status
        return status

    def _state(self, *, poll_files: bool) -> RunState:
        status = self._read_status()
        state = parse_state(status.get("state"))
        if state.done:
            return state
        if not self._launcher_alive():
            if self._launcher is not None:  # owner: the launcher ended; settle writes a status
                self._settle()
                return parse_state(self._read_status().get("state"))
            if self._launcher_pid() is not None:  # observer: the launcher is gone, no status
                return self._ended_without_status()
        self._refresh(poll_files=poll_files)
        return RunState.FAILED if self._tables.failures else state

    def _ended_without_status(self) -> RunState:
        """An observer's verdict on a run whose launcher is gone without a (readable) final
        status: FINISHED if every rank here said it finished and none failed, else FAILED."""
        self._refresh()
        tables = self._tables
        if not tables.failures and all(r in tables.finished for r in self._ranks):
            return RunState.FINISHED
        return RunState.FAILED

    def _settle(self) -> None:
        """After the launcher ended: final read, bus off, and a status if it left none."""
        with self._lock:
            if self._launcher is not None and self._launcher.poll() is None:
                return
            _live_sessions.discard(self)  # nothing left to stop at exit
            self._refresh()
            if self._bus is not None:
                self._bus.stop()
                self._bus = None
                self._refresh()
            if self._governor is not None:
                self._governor.stop()
            self._watchdog_stop.set()  # it ends at its next tick (joined in stop())
            self._stop_mps()
            status = self._read_status()
            if parse_state(status.get("state")).done or not self.owner:
                return
            code = self._launcher.returncode if self._launcher is not None else None
            if self._stop_requested:
                state = RunState.STOPPED
                reason = "stopped by the session (the launcher left no status)"
            elif state_of_exit_code(code) is not None:  # it could not write it (a full disk)
                state = cast(RunState, state_of_exit_code(code))
                reason = f"{_EXIT_REASONS[state]} (the launcher could not write its final status)"
            else:
                state = RunState.FAILED
                reason = f"the launcher exited with code {code} and left no status"
            status.update(state=str(state), reason=reason, exit_code=code, ended_ns=time.time_ns())
            try:
                self.run_dir.write_json(self.run_dir.status_json, status)
            except OSError as e:  # a full disk: keep the verdict here rather than lose it
                log.warning("cannot write %s (%s); run %s", self.run_dir.status_json, e, state)
                self._unwritten_status = status
