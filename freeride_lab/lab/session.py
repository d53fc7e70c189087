"""``Session``: one pipeline training run, owned from a notebook kernel or the CLI.

    s = Session.launch(RunConfig(schedule="1F1B", stages=4, microbatches=8))
    s                                    # returns at once; training runs in the background
    # <Session run_id='20250101-120000-1f1b-p4m8-1a2b' state=running step=3/20>
    s.bubbles.head(); s.summary()        # tables fill while the run goes on
    s.wait()                             # 'finished' | 'failed' | 'stopped'
    s.stop()                             # TERM → grace → KILL; idempotent

    with Session.launch(config) as s:    # stop() on exit, whatever happens
        s.wait()

    Session.open("runs/20250101-…")      # a finished or running run, from its files alone

    s.attach("pagerank", options={"n_nodes": 2000})   # a side task in the bubbles
    s.tasks; s.tune(task_id, sm_pct=50); s.move(task_id, 2); s.detach(task_id)

Processes: the Session starts one launcher (``python -m freeride_lab.pipeline.launcher``) in the
caller's process group; the launcher owns torchrun and the ranks (see that module). Stopping
walks the whole process tree first, sends SIGTERM to all of it, waits ``grace_s`` (plus a few
seconds for the launcher to write its status) and SIGKILLs what is left. A module-level
``WeakSet`` of live sessions and one ``atexit`` handler stop what the process still owns when it
exits; if the process is killed instead, the launcher's parent-death watchdog stops the run.

Data: ranks write events to ``events/*.jsonl`` (the source of truth) and forward the same
bytes over the session's authenticated bus; the session merges both exactly once
(``EventTailer``), so tables are live when the bus works and complete when it does not.

[Note: owner and observers]
Only the process that launched a run owns it, and only the owner commands it (see
``lab.owner_channel`` [Note: one commander per run]). While the run is alive, ``Session.open``
in that process returns the owning ``Session`` itself; otherwise, and in any other process, it
returns a read-only observer: its tables, state and ``tasks`` come from the files and
``wait()`` works, but ``stop()``, ``attach``, ``tune``, ``move``, ``detach`` and
``enable_governor`` raise ``PermissionError`` naming the owner's pid and what to do instead. An
observer never stops a run at exit, so opening a run can never kill what another process
started. The exception is a *detached* run (``freeride-lab launch``, owned by a background
``lab.keeper`` process): an observer's ``stop()`` asks its keeper to stop it (SIGTERM), and its
side-task commands are requests the keeper carries out (``lab.owner_channel``).

[Note: side tasks]
With ``RunConfig(side_tasks=True)`` (the default) every rank starts a side-task worker
(``config.runtime.edges_factory``), and the owner's ``attach``/``tune``/``move``/``detach`` go
through its ``lab.manager.SideTaskManager``. ``tasks`` works in observers too: the manager keeps
its records in the run directory.

[Note: damaged run directories]
A run directory can be damaged after the fact (a copy cut short, a disk error, a hand edit).
Readers work on what is left: event lines that are not valid events are skipped, counted
(``bad_lines``) and logged once per file and read (``lab.tables`` [Note: damaged event
files]); a missing or damaged status.json reads as no status (``RunDir.read_status``, logged
once), and a run whose launcher is gone without one is judged from its events: FINISHED if
every rank here said so, else FAILED. run.json is different: it is the only record of the
run's config (schedule, stages, micro-batches, chunks), without which bubbles cannot be
labelled or compared with theory, and of who owns the run. A damaged run.json therefore makes
``Session.open`` raise one ``ValueError`` naming the file, rather than guess a config and show
plausible but wrong tables; the events stay readable with ``lab.tables.read_events``.

[Note: MPS daemon]
On CUDA (``RunConfig.mps`` True, or None when MPS is available here) the owner starts a private
MPS control daemon before the launcher (``lab.run_mps.RunMps``: pipe/log directories under
``<run_dir>/mps``), gives the launcher its client environment, and stops it once every process
of the run has exited: in ``stop()``, when the run ends by itself, when launching fails, and at
exit. run.json's ``mps`` records whether it served the run.

[Note: worker watchdog]
A side-task worker killed from outside (SIGKILL, the OOM killer) cannot report it, nor can one
that hangs (SIGSTOPped, starved), and a run that ends on its own (finished, or a rank failed)
leaves its MPS daemon to the session. While a run trains, the owner runs one daemon thread
(``freeride-watchdog-<run_id>``) that every ``WATCHDOG_PERIOD_S`` asks the manager to check the
workers once tasks were attached (``SideTaskManager.check_workers``): a worker silent for three
heartbeats is killed with its task processes, and a dead or killed worker's tasks become FAILED,
naming it and how it died, as its rank recorded it ("worker for rank R died: killed by
SIGKILL …", see ``sidetasks.worker_exit``, or "hung: worker for rank R … sent no heartbeat …"),
in the tables and in ``events/lab-<rank>.jsonl``, within a few seconds and without anyone
reading ``tasks``. Once the launcher has exited, the thread settles the run (``_settle``:
final read, status, MPS daemon stopped) and ends, so nothing waits for someone to look.
``stop()`` ends it too.

[Note: upward hooks]
``report`` and ``_repr_mimebundle_`` are the only places where ``lab`` touches ``ui``; both
import it lazily, so a headless Session never loads widgets.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import errno
import importlib.metadata
import itertools
import json
import logging
import math
import os
import platform
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pandas as pd
import psutil

from freeride_lab.core import attribution as core_attribution
from freeride_lab.core import bubbles as core_bubbles
from freeride_lab.core.config import RunConfig
from freeride_lab.io.bus import BusBatch, BusServer
from freeride_lab.io.rundir import RunDir, open_append
from freeride_lab.lab.manager import SideTaskManager
from freeride_lab.lab.owner_channel import OwnerClient
from freeride_lab.lab.preflight import check_environment
from freeride_lab.lab.run_mps import RunMps
from freeride_lab.lab.side_tasks import SideTaskControls
from freeride_lab.lab.tables import EventTables, EventTailer
from freeride_lab.pipeline.launcher import (
    DEFAULT_RANK_ENTRY,
    RunState,
    free_port,
    state_of_exit_code,
    stop_processes,
)

if TYPE_CHECKING:
    from freeride_lab.lab.governor import GovernorLoop

log = logging.getLogger(__name__)

_EXIT_REASONS = {
    RunState.FINISHED: "every rank finished",
    RunState.FAILED: "the run failed",
    RunState.STOPPED: "the run was stopped",
}

__all__ = ["RunFailure", "Session"]

LAUNCHER_STATUS_MARGIN_S = 3.0  # extra time stop() gives the launcher to write its status
INBOX_BATCHES = 10_000  # bus batches kept between two reads of the tables
EDGES_FACTORY = "freeride_lab.sidetasks.client:open_edges"  # a worker beside each rank
WATCHDOG_PERIOD_S = 1.0  # how often the owner checks that side-task workers are alive

# The one piece of global state (house rule 14): sessions this process owns and must stop at exit.
_live_sessions: weakref.WeakSet[Session] = weakref.WeakSet()


def _stop_live_sessions() -> None:
    for session in list(_live_sessions):
        try:
            session.stop()
        except Exception:
            log.exception("could not stop %r at exit", session)


@dataclass(frozen=True)
class RunFailure:
    """Why a run failed: the rank that failed first (None if unknown) and a one-line reason."""

    rank: int | None
    reason: str
    traceback: str = ""

    def __str__(self) -> str:
        return self.reason


def _parse_state(value: object) -> RunState:
    try:
        return RunState(str(value))
    except ValueError:
        return RunState.STARTING  # no status yet (or one this version does not know)


def _new_run_id(config: RunConfig) -> str:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    shape = f"{config.schedule.lower()}-p{config.stages}m{config.microbatches}"
    return f"{stamp}-{shape}-{secrets.token_hex(2)}"


def _versions() -> dict[str, str]:
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


def _with_side_tasks(config: RunConfig) -> RunConfig:
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


def _described_run(rd: RunDir) -> tuple[dict[str, Any], RunConfig]:
    """run.json and the ``RunConfig`` in it, or one ``ValueError`` naming the file (see
    [Note: damaged run directories])."""
    fix = (
        "restore run.json from a copy of the run directory; the events can still be read "
        f"without it: freeride_lab.lab.read_events({str(rd.path)!r})"
    )
    try:
        run = rd.read_run()
    except ValueError as e:
        raise ValueError(f"{e}: without it the run's config is unknown; {fix}") from None
    config = run.get("config")
    if config is None:
        raise ValueError(
            f"{rd.run_json} holds no 'config' object, so the run's config is unknown; {fix}"
        )
    try:
        # checked when the run was launched; checking again would import torch (seconds)
        return run, RunConfig.from_dict(config, check_plan=False)
    except (TypeError, ValueError) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(
            f"{rd.run_json}: its 'config' is not a valid RunConfig ({why}), so the run's config "
            f"is unknown; {fix}"
        ) from None


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


class Session(SideTaskControls):
    """A pipeline training run: its processes (if this process owns it), state and tables;
    its side tasks come from ``SideTaskControls`` (``attach``, ``tasks``, …).

    Make one with ``Session.launch(config)`` or ``Session.open(run_dir)``, not directly.
    """

    bubble_min_ms: float = 0.0  # gaps shorter than this are left out of ``bubbles``

    def __init__(
        self,
        run_dir: RunDir,
        *,
        config: RunConfig,
        run_id: str,
        owner: bool,
        grace_s: float = 10.0,
    ) -> None:
        self.run_dir = run_dir
        self.config = config
        self.run_id = run_id
        self.owner = owner
        self.grace_s = grace_s
        self._launcher: subprocess.Popen[bytes] | None = None
        self._bus: BusServer | None = None
        # Bounded: when nobody reads the tables for a while, the oldest batches go; the tailer
        # reads what they held from the files (see EventTailer.feed).
        self._inbox: collections.deque[BusBatch] = collections.deque(maxlen=INBOX_BATCHES)
        self._tailer = EventTailer(run_dir)
        self._tables = EventTables()
        self._lock = threading.RLock()
        self._stop_lock = threading.Lock()
        self._stopped = False
        self._stop_requested = False
        self._unwritten_status: dict[str, Any] | None = None  # a final status the disk refused
        self._writers_done = False  # the status says the run is over: no line is still growing
        self._live_events = 0
        self._manager: SideTaskManager | None = None
        self._governor: GovernorLoop | None = None
        self._watchdog: threading.Thread | None = None
        self._watchdog_stop = threading.Event()
        self._mps = RunMps(config, run_dir)
        nproc = config.stages // config.nnodes
        self._ranks = range(config.node_rank * nproc, (config.node_rank + 1) * nproc)

    # -- making sessions -----------------------------------------------------------------------

    @classmethod
    def launch(
        cls,
        config: RunConfig,
        *,
        run_dir: str | Path | None = None,
        grace_s: float = 10.0,
        rank_entry: Sequence[str] | None = None,
        detached: bool = False,
    ) -> Session:
        """Start a run in the background and return its owning Session at once.

        Args:
            run_dir: the run directory to create; None uses ``config.run_dir``, else
                ``./runs/<run_id>``.
            grace_s: SIGTERM → SIGKILL delay when the run is stopped.
            rank_entry: what torchrun runs per rank, before ``--run-dir DIR``; default
                ``-m freeride_lab.pipeline.rank`` (a script path works too).
            detached: this process is a keeper of a detached run (``lab.keeper``); any
                observer may then stop it (see [Note: owner and observers]).

        Raises:
            ValueError, OSError, RuntimeError: from ``check_environment``; nothing was started.
        """
        if not isinstance(config, RunConfig):
            raise TypeError(f"config must be a RunConfig, not {type(config).__name__}")
        if (
            isinstance(grace_s, bool)
            or not isinstance(grace_s, int | float)
            or not (math.isfinite(grace_s) and grace_s >= 0)
        ):
            raise ValueError(f"grace_s={grace_s!r} must be a finite number >= 0 (seconds)")
        run_id = _new_run_id(config)
        chosen = run_dir if run_dir is not None else config.run_dir
        path = Path(chosen) if chosen is not None else Path("runs") / run_id
        path = path.expanduser().absolute()
        check_environment(config, path)
        RunMps.wanted(config)  # mps=True where MPS cannot run: refuse before anything exists
        config = _with_side_tasks(config)
        if config.master_port is None:
            config = config.replace(master_port=free_port(config.master_addr))
        config = config.replace(run_dir=str(path))

        rd = RunDir(path)
        try:
            secret = rd.create()
        except OSError as e:
            raise type(e)(
                e.errno,
                f"cannot create run directory {path}: {e.strerror or e}; "
                "pass run_dir= a writable path",
            ) from None
        session = cls(rd, config=config, run_id=run_id, owner=True, grace_s=grace_s)
        session._start(rank_entry or DEFAULT_RANK_ENTRY, secret, detached=detached)
        return session

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
                "versions": _versions(),
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

    @classmethod
    def open(cls, run_dir: str | Path) -> Session:
        """The run in ``run_dir``, from its files (see [Note: owner and observers]); damaged
        event files and status.json are read for what is left (see [Note: damaged run
        directories]).

        Raises:
            FileNotFoundError: ``run_dir`` has no run.json.
            ValueError: run.json is damaged, so the run's config is unknown; the message names
                the file.
        """
        rd = RunDir(Path(run_dir).expanduser().absolute())
        if not rd.run_json.is_file():
            raise FileNotFoundError(
                errno.ENOENT, f"{rd.path} is not a run directory (no run.json)", str(rd.run_json)
            )
        for live in list(_live_sessions):
            if live.run_dir.path.resolve() == rd.path.resolve():
                return live
        run, config = _described_run(rd)
        grace_s = run.get("grace_s", 10.0)
        session = cls(
            rd,
            config=config,
            run_id=str(run.get("run_id") or rd.path.name),
            owner=False,
            grace_s=float(grace_s) if math.isfinite(grace_s) and grace_s >= 0 else 10.0,
        )
        session._refresh()
        return session

    # -- state ---------------------------------------------------------------------------------

    @property
    def state(self) -> RunState:
        """Where the run is now; FAILED as soon as any rank reports a failure."""
        return self._state(poll_files=True)

    @property
    def steps_done(self) -> int:
        """Steps completed by every rank of this node."""
        self._refresh()
        return min((self._tables.steps_by_rank.get(r, 0) for r in self._ranks), default=0)

    @property
    def live_events(self) -> int:
        """Events that reached this session over the live bus before it read them from the files
        (0 for an observer, or while the bus is not getting through)."""
        self._refresh(poll_files=False)
        return self._live_events

    @property
    def failure(self) -> RunFailure | None:
        """Which rank failed and why: the launcher's verdict once the run has ended (see
        [Note: finding the failing rank] in ``pipeline.launcher``), before that the earliest
        RankFailed event; None if nothing failed."""
        self._refresh()
        by_rank: dict[int, dict[str, Any]] = {}
        for e in sorted(self._tables.failures, key=lambda e: int(e.get("t_ns", 0))):
            by_rank.setdefault(int(e.get("rank", -1)), e)
        status = self._read_status()
        if status.get("state") == RunState.FAILED:
            rank = status.get("failed_rank")
            event = by_rank.get(rank, {}) if rank is not None else {}
            return RunFailure(
                rank=None if rank is None else int(rank),
                reason=str(status.get("reason", "unknown")),
                traceback=str(event.get("traceback", "")),
            )
        if by_rank:
            first = next(iter(by_rank.values()))
            rank = int(first.get("rank", -1))
            return RunFailure(
                rank=rank,
                reason=f"rank {rank} failed: {first.get('error', '?')}",
                traceback=str(first.get("traceback", "")),
            )
        if self._state(poll_files=False) == RunState.FAILED:
            unfinished = [str(r) for r in self._ranks if r not in self._tables.finished]
            return RunFailure(
                rank=None,
                reason=f"the launcher (pid {self._launcher_pid()}) is gone without a final status"
                + (f"; rank {', '.join(unfinished)} never said it finished" if unfinished else ""),
            )
        return None

    def wait(self, timeout_s: float | None = None) -> RunState:
        """Block until the run has ended and its processes are gone; returns the final state.

        Raises:
            TimeoutError: still running after ``timeout_s``; the run goes on (``stop()`` ends it).
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        if self._launcher is not None:
            try:
                self._launcher.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                raise self._timeout(timeout_s) from None
        else:
            while not self._state(poll_files=False).done:
                if deadline is not None and time.monotonic() >= deadline:
                    raise self._timeout(timeout_s)
                time.sleep(0.1)  # an observer can only poll the files
        self._settle()
        return self.state

    def _timeout(self, timeout_s: float | None) -> TimeoutError:
        return TimeoutError(
            f"run {self.run_id} is still {self._state(poll_files=False)} after {timeout_s} s "
            f"(step {self.steps_done}/{self.config.steps}); wait longer or call stop()"
        )

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

    def _commands(self, what: str) -> SideTaskManager | OwnerClient:
        """What carries out a side-task command: this owner's manager, or the keeper of a
        detached run asked over its channel (``lab.owner_channel``).

        Raises:
            PermissionError: an observer of a run that is not detached.
            RuntimeError: a detached run that has ended (its keeper is gone).
        """
        if self.owner:
            return self._side_tasks()
        run = self._run_info()
        if not run.get("detached"):
            raise self._read_only(what, run)
        state = self._state(poll_files=False)
        if state.done:
            raise RuntimeError(
                f"cannot {what}: run {self.run_id} is {state} and its keeper has gone; side "
                "tasks run only beside a live run"
            )
        return OwnerClient.of_run(run, self.run_dir.secret(), run_id=self.run_id)

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
        if not _parse_state(self.run_dir.read_status().get("state")).done:
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
        if self._unwritten_status is not None and not _parse_state(status.get("state")).done:
            return self._unwritten_status
        return status

    def _state(self, *, poll_files: bool) -> RunState:
        status = self._read_status()
        state = _parse_state(status.get("state"))
        if state.done:
            return state
        if not self._launcher_alive():
            if self._launcher is not None:  # owner: the launcher ended; settle writes a status
                self._settle()
                return _parse_state(self._read_status().get("state"))
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
            if _parse_state(status.get("state")).done or not self.owner:
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

    # -- tables --------------------------------------------------------------------------------

    def _on_batch(self, batch: BusBatch) -> None:
        self._inbox.append(batch)  # bus thread: just hand over; merged on the next read

    def _refresh(self, *, poll_files: bool = True) -> None:
        with self._lock:
            while self._inbox:
                self._live_events += self._tables.add(self._tailer.feed(self._inbox.popleft()))
            if poll_files:
                if not self._writers_done:  # once the run is over, a cut last line is read too
                    self._writers_done = _parse_state(self._read_status().get("state")).done
                self._tables.add(self._tailer.poll(final=self._writers_done))

    @property
    def bad_lines(self) -> dict[str, int]:
        """Lines skipped per event file because they are not valid events (damaged files; see
        [Note: damaged run directories]); {} when every line was read."""
        self._refresh()
        return dict(self._tailer.bad_lines_by_file)

    @property
    def actions(self) -> pd.DataFrame:
        """One row per timed action (see ``freeride_lab.lab.tables.actions_frame``)."""
        self._refresh()
        return self._tables.actions()

    @property
    def steps(self) -> pd.DataFrame:
        """One row per (step, rank) (see ``freeride_lab.lab.tables.steps_frame``)."""
        self._refresh()
        return self._tables.steps()

    @property
    def memory(self) -> pd.DataFrame:
        """One row per (step, rank) memory report (see ``tables.memory_frame``)."""
        self._refresh()
        return self._tables.memory()

    @property
    def side_task_steps(self) -> pd.DataFrame:
        """One row per side-task step (see ``tables.side_task_steps_frame``)."""
        self._refresh()
        return self._tables.side_task_steps()

    @property
    def events(self) -> pd.DataFrame:
        """Every event recorded so far, one row each (see ``tables.events_frame``)."""
        self._refresh()
        return self._tables.frame()

    @property
    def bubbles(self) -> pd.DataFrame:
        """Idle gaps per (step, rank), from ``freeride_lab.core.bubbles.extract_bubbles``: the
        windows' gaps and, between steps, "boundary" gaps (the optimizer counts as busy)."""
        return self._bubbles_of(self.actions, self.steps)

    @property
    def attribution(self) -> pd.DataFrame:
        """``bubbles`` with each bubble split into why it is there: ``schedule_ms`` (the
        schedule leaves it idle with this run's own action costs), ``peer_ms`` (waiting on
        another rank beyond that, and transfers), ``host_ms`` (the rank's own overhead); the
        parts sum to ``duration_ms`` (``freeride_lab.core.attribution.attribute_bubbles``)."""
        actions, steps = self.actions, self.steps
        cfg = self.config
        return core_attribution.attribute_bubbles(
            actions,
            self._bubbles_of(actions, steps),
            steps=steps,
            schedule=cfg.schedule,
            stages=cfg.stages,
            microbatches=cfg.microbatches,
            chunks=cfg.chunks,
        )

    def _recent_bubbles(self, steps: int = 6) -> pd.DataFrame:
        """The bubbles of the last ``steps`` recorded steps (enough for predictions: k=5)."""
        actions, table = self.actions, self.steps
        if not actions.empty:
            first = int(actions["step"].max()) - steps + 1
            actions = actions[actions["step"] >= first]
            table = table[table["step"] >= first]
        return self._bubbles_of(actions, table)

    def _bubbles_of(self, actions: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
        cfg = self.config
        return core_bubbles.extract_bubbles(
            actions,
            steps=steps,
            schedule=cfg.schedule,
            stages=cfg.stages,
            microbatches=cfg.microbatches,
            chunks=cfg.chunks,
            min_ms=self.bubble_min_ms,
        )

    def summary(
        self, *, skip_steps: int | None = None, min_ms: float | None = None
    ) -> pd.DataFrame:
        """Measured vs theory bubble fraction per rank, and why the measured is above it.

        ``freeride_lab.core.bubbles.summary``'s columns, then the mean bubble ms per step
        (window and boundary bubbles, ``bubble_ms_per_step``) split into
        ``schedule_ms_per_step`` (what the schedule leaves idle with this run's own action
        costs), ``peer_ms_per_step`` (waiting on another rank beyond that, and transfers) and
        ``host_ms_per_step`` (the rank's own overhead); see ``core.attribution``.

        Args:
            skip_steps: leading steps left out as warm-up; None leaves out step 0 once a
                second step is recorded (so a live run has a summary from its first step on).
            min_ms: shortest gap counted in ``n_bubbles``; None uses ``bubble_min_ms``.
        """
        cfg = self.config
        actions = self.actions
        if skip_steps is None:
            skip_steps = 1 if actions["step"].nunique() > 1 else 0
        summary = core_bubbles.summary(
            actions,
            cfg.schedule,
            cfg.stages,
            cfg.microbatches,
            cfg.chunks,
            skip_steps=skip_steps,
            min_ms=self.bubble_min_ms if min_ms is None else min_ms,
        )
        by_rank = core_attribution.attribution_by_rank(
            actions,
            steps=self.steps,
            schedule=cfg.schedule,
            stages=cfg.stages,
            microbatches=cfg.microbatches,
            chunks=cfg.chunks,
            skip_steps=skip_steps,
        )
        return core_attribution.with_attribution(summary, by_rank)

    # -- side-task plumbing (the API is ``SideTaskControls``) ---------------------------------

    def _side_tasks(self) -> SideTaskManager:
        with self._lock:  # the watchdog thread may ask for it too: make exactly one
            if self._manager is None:
                self._manager = SideTaskManager(
                    self.run_dir,
                    self.config,
                    events=self._events_since,
                    memory=lambda: self.memory,
                    bubbles=self._recent_bubbles,
                    live=self._is_live,
                )
            return self._manager

    def _events_since(self, start: int) -> list[dict[str, Any]]:
        self._refresh()
        with self._lock:
            return self._tables.events_since(start)

    def _is_live(self) -> bool:
        return not self._state(poll_files=False).done

    # -- ui hooks (see [Note: upward hooks]) --------------------------------------------------

    def report(self, path: str | Path) -> Path:
        """Write a self-contained report of this run to ``path``; the path written."""
        from freeride_lab.ui.report import write_session_report

        written: Path = write_session_report(self, path)
        return written

    def _repr_mimebundle_(
        self, include: Sequence[str] | None = None, exclude: Sequence[str] | None = None
    ) -> dict[str, Any]:
        """The notebook's view of this session: the dashboard (``ui.dashboard``)."""
        try:
            from freeride_lab.ui.dashboard import mimebundle
        except ImportError:
            return {"text/plain": repr(self)}
        # ui.dashboard.DashboardSession spells attach/tune as **kwargs: not a structural match
        bundle: dict[str, Any] = mimebundle(cast(Any, self), include, exclude)
        return bundle

    # -- protocol ------------------------------------------------------------------------------

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.owner:
            self.stop()

    def __repr__(self) -> str:
        state = self._state(poll_files=False)
        steps = min((self._tables.steps_by_rank.get(r, 0) for r in self._ranks), default=0)
        return f"<Session run_id={self.run_id!r} state={state} step={steps}/{self.config.steps}>"
