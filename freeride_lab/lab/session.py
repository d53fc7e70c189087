"""``Session``: one pipeline training run, owned from a notebook kernel or the CLI.

    s = Session.launch(RunConfig(schedule="1F1B", stages=4, microbatches=8))
    s                                    # returns at once; training runs in the background
    # <Session run_id='20250101-120000-1f1b-p4m8-1a2b' state=running step=3/20>
    s.progress                           # 'starting 4 ranks…', 'calibrating…', 'step 3/20'
    s.bubbles.head(); s.summary()        # tables fill while the run goes on
    s.wait()                             # 'finished' | 'failed' | 'stopped'
    s.stop()                             # TERM → grace → KILL; idempotent

    with Session.launch(config) as s:    # stop() on exit, whatever happens
        s.wait()

    Session.open("runs/20250101-…")      # a finished or running run, from its files alone

    s.attach("pagerank", options={"n_nodes": 2000})   # a side task in the bubbles
    s.tasks; s.tune(task_id, sm_pct=50); s.move(task_id, 2); s.detach(task_id)

One class, three parts, a module each: ``lab.launch.RunProcesses`` (the run's processes: start,
watchdog, stop, settle; who may command it), ``lab.session_tables.SessionTables`` (the tables
and ``progress``) and ``lab.side_tasks.SideTaskControls`` (side tasks); this module makes and
opens sessions and says how a run stands (``state``, ``failure``, ``wait``). Launching imports
neither torch nor pandas here: the ranks import torch, the first table read loads pandas.

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
(``bad_lines``) and logged once per file and read (``lab.tailer`` [Note: damaged event
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
``lab`` never imports ``ui`` (``tests/lab/test_layers.py`` checks it), so a headless Session
never loads widgets, plotly or jinja2. The two places where a Session meets ``ui`` are plugged
in from above: ``report(path)`` calls the writer registered in ``lab.hooks`` (importing
``freeride_lab`` registers ``freeride_lab.ui.report``'s, loaded on the first report; without
its packages, one ``ImportError`` names the extra to install), and the notebook's view of a
Session (its dashboard) is a printer registered with IPython's display formatters
(``freeride_lab.ui.display``) by ``%load_ext freeride_lab``, and by importing ``freeride_lab``
inside IPython.
"""

from __future__ import annotations

import collections
import errno
import logging
import math
import secrets
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from freeride_lab.core.config import RunConfig
from freeride_lab.io.bus import BusBatch, BusServer
from freeride_lab.io.child_wait import wait_exit
from freeride_lab.io.rundir import RunDir
from freeride_lab.lab.hooks import report_writer
from freeride_lab.lab.launch import (
    EDGES_FACTORY,
    RunProcesses,
    live_session,
    with_side_tasks,
)
from freeride_lab.lab.preflight import check_environment
from freeride_lab.lab.run_mps import RunMps
from freeride_lab.lab.session_tables import SessionTables
from freeride_lab.lab.side_tasks import SideTaskControls
from freeride_lab.lab.tables import EventTables
from freeride_lab.lab.tailer import EventTailer
from freeride_lab.pipeline.launcher import DEFAULT_RANK_ENTRY, RunState, free_port

if TYPE_CHECKING:
    from freeride_lab.lab.governor import GovernorLoop
    from freeride_lab.lab.manager import SideTaskManager

log = logging.getLogger(__name__)

__all__ = ["EDGES_FACTORY", "RunFailure", "Session"]

INBOX_BATCHES = 10_000  # bus batches kept between two reads of the tables


@dataclass(frozen=True)
class RunFailure:
    """Why a run failed: the rank that failed first (None if unknown) and a one-line reason."""

    rank: int | None
    reason: str
    traceback: str = ""

    def __str__(self) -> str:
        return self.reason


def _new_run_id(config: RunConfig) -> str:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    shape = f"{config.schedule.lower()}-p{config.stages}m{config.microbatches}"
    return f"{stamp}-{shape}-{secrets.token_hex(2)}"


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


class Session(RunProcesses, SessionTables, SideTaskControls):
    """A pipeline training run: its processes if this process owns it (``RunProcesses``:
    ``stop``), its tables (``SessionTables``: ``bubbles``, ``summary()``, ``progress``, …)
    and its side tasks (``SideTaskControls``: ``attach``, ``tasks``, …).

    Make one with ``Session.launch(config)`` or ``Session.open(run_dir)``, not directly.
    """

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
        self.govern_trickle_tasks = True
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
        config = with_side_tasks(config)
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
        live = live_session(rd.path)
        if isinstance(live, cls):
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
            if timeout_s is None:
                self._launcher.wait()
            elif wait_exit(self._launcher, timeout_s) is None:  # no polling while it runs
                raise self._timeout(timeout_s)
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

    # -- the report (see [Note: upward hooks]) ---------------------------------------------

    def report(self, path: str | Path) -> Path:
        """Write a self-contained report of this run to ``path``; the path written.

        Raises:
            ImportError: the report's packages are not installed; the message names the extra
                to install (``freeride-lab[ui]``).
        """
        return report_writer()(self, path)

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
