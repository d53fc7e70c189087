"""``HostBase``: a task host's links to the outside world and its state machine.

It holds what every part of the host shares: the spec, the rank's edge reader, the control
channel to the worker (see ``host.task_host`` [Note: host protocol]), the event sink, the
watchdog's beacon, and the task's ``SideTaskMachine`` with the hooks each transition runs.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import os
import queue
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from freeride_lab.core import events as ev
from freeride_lab.core.bubble_survival import SurvivorLengths
from freeride_lab.core.budget import Profile
from freeride_lab.core.edge_timing import NextBubbleClock
from freeride_lab.core.runtime_options import OUTLIVED
from freeride_lab.core.sidetask_state import (
    Rejected,
    SideTaskEvent,
    SideTaskMachine,
    transition,
)
from freeride_lab.io.peer_board import PeerBoards
from freeride_lab.io.sink import EventSink
from freeride_lab.sidetasks.api import SideTaskBase
from freeride_lab.sidetasks.edges import Edge, EdgeReader, EdgeWriter
from freeride_lab.sidetasks.heartbeat import TaskBeacon
from freeride_lab.sidetasks.host.imperative import ImperativeDriver
from freeride_lab.sidetasks.host_copy import CopiesInFlight
from freeride_lab.sidetasks.spec import HostSpec

log = logging.getLogger("freeride_lab.sidetasks.host")

__all__ = ["OVERRUN_WINDOW", "SPIN_LEAD_ENV", "SPIN_MOST_ENV", "HostBase", "failure_reason"]

OVERRUN_WINDOW = 100  # steps the overrun policy looks at
_SPIN_LEAD_S = 300e-6  # GPU runs: spin from this long before a predicted bubble start
#: Overrides ``_SPIN_LEAD_S`` in µs (0 = never spin, also on GPU runs; > 0 = spin on CPU too).
SPIN_LEAD_ENV = "FREERIDE_SPIN_LEAD_US"
#: The longest spin for one bubble start (``core.edge_timing`` [Note: spin window]).
_SPIN_MOST_S = 2e-3
#: Overrides ``_SPIN_MOST_S`` in µs (0 = never spin past the prediction's lead).
SPIN_MOST_ENV = "FREERIDE_SPIN_MOST_US"


class HostBase:
    """The state a task host's parts share, its outside world and its state machine."""

    def __init__(
        self,
        spec: HostSpec,
        *,
        conn: Connection | None,
        sink: EventSink,
        beacon: TaskBeacon | None = None,
        step_group_ns: int = 0,
        outlived: str = "stop",
        peers: bool = False,
    ) -> None:
        if outlived not in OUTLIVED:
            raise ValueError(f"outlived={outlived!r}; valid: {', '.join(OUTLIVED)}")
        self.spec = spec
        self.step_group_ns = step_group_ns  # see host.iterative [Note: step groups]
        # once a bubble outlives its prediction: see host.iterative [Note: outlived bubbles]
        self._survivors = SurvivorLengths() if outlived != "stop" else None
        self._outlived_handed_on = outlived == "hand-on"
        # the run's action boards, where its ranks predict from their awaited peers (host.
        # iterative [Note: told mid-bubble])
        self._boards = PeerBoards(spec.run_dir) if peers else None
        # (step, slot) -> start (ns) of recent bubbles; None once their length is noted
        self._starts: collections.OrderedDict[tuple[int, int], int | None] = (
            collections.OrderedDict()
        )
        # recent per-step times (ns), which a group's size is planned from
        self._recent_step_ns: collections.deque[float] = collections.deque(maxlen=16)
        # size -> recent times (ns) of steps of that size; see host.iterative [Note: step sizes]
        self._size_ns: dict[int, collections.deque[float]] = {}
        self._top_size = 1  # the largest step size the task has offered
        self._guards: dict[tuple[int, int, int], int] = {}  # (size, top, budget) -> guard (ns)
        self.conn = conn
        self.sink = sink
        self.beacon = beacon  # marks for the worker's watchdog; written by this thread only
        self._reader: EdgeReader | None = None  # opened once the rank's edge file exists
        # the hand-ons to the stage's leftovers task, opened at the first (host.iterative
        # [Note: leftovers]); False once that failed
        self._leftovers: EdgeWriter | bool | None = None
        self._handed: tuple[int, int] | None = None  # the bubble handed on and not yet ended
        self._leftovers_look_s = 0.0  # no look for the leftovers file before (monotonic)
        self.machine = SideTaskMachine()
        self.task: SideTaskBase | None = None
        self.mode = "iterative"
        self.steps = 0
        self.overruns = 0  # counted by core.budget.overran, as every table counts them
        self.overrun_ns_total = 0
        self._steps_started = 0  # by this process (its first step initialises lazily)
        self._cmds: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()  # put() is signal-safe
        self._send_lock = threading.Lock()
        self._done = threading.Event()
        self._exit = False  # leave without a terminal state (restart)
        self._where = "loading the task"
        self._policy = spec.task.overrun_policy
        self._budget_fixed_ns: int | None = (
            None if spec.task.limits.budget_s is None else int(spec.task.limits.budget_s * 1e9)
        )
        self._profile_ns: list[int] = []  # step durations measured for the profile
        self.profile: Profile | None = None
        self._profile_budget: tuple[Profile | None, int] = (None, 0)  # the profile, its budget
        self._slot_predicted_ns: dict[int, int] = {}  # slot -> its latest predicted length
        self._first_step_seen: int | None = None
        self._window: collections.deque[int] = collections.deque(maxlen=OVERRUN_WINDOW)
        self._policy_paused = False
        self._trickle_duty = spec.task.limits.trickle_duty  # gating "trickle": see host.iterative
        self._trickle_next_ns = 0  # no step between bubbles before this run-clock time
        self._warned_at_step = -(10**9)
        # (step, slot) -> observed end (ns) of recent bubbles; the first value found sticks
        self._ends: collections.OrderedDict[tuple[int, int], int] = collections.OrderedDict()
        self._bubble: Edge | None = None
        self._seen_ns = 0  # when the newest bubble-start edge was seen; 0 once a step reported it
        self._expected_ns = 0  # when the host's clock expected that start; 0: no prediction
        # the spin the host waited for it with (from, until); 0, 0: it slept until woken
        self._spin_from_ns = self._spin_until_ns = 0
        # the guard a bubble had to clear for the step being taken in it (0: not in a bubble)
        self._entry_guard_ns = 0
        # a state change applied but not yet announced: (event, state, reason, t_ns); see
        # [Note: launch, then tell]
        self._held: tuple[str, str, str, int] | None = None
        self._last_checkpoint_s = time.monotonic()
        # a periodic checkpoint being written, and what made the last one fail (see
        # host.checkpoints [Note: periodic checkpoints in the background])
        self._writer: threading.Thread | None = None
        self._write_error: BaseException | None = None
        # the GPU copies of the state the last periodic checkpoint took, while in flight
        # (sidetasks.host_copy [Note: copies left in flight])
        self._copies: CopiesInFlight | None = None
        self._saved_progress: float | None = None
        self._driver: ImperativeDriver | None = None  # imperative tasks only
        self._last_report_ns = 0
        self._clock = NextBubbleClock()  # predicts bubble starts from the edges seen
        self._spin_lead_s = _spin_lead_s(spec.device, os.environ.get(SPIN_LEAD_ENV))
        self._spin_most_s = _env_us(SPIN_MOST_ENV, _SPIN_MOST_S)

    # -- outside world --

    @property
    def reader(self) -> EdgeReader:
        """The rank's edges (only used once ``_open_reader`` succeeded)."""
        if self._reader is None:
            raise RuntimeError("the edge file is not open yet")
        return self._reader

    def _now_ns(self) -> int:
        return self._reader.now_ns() if self._reader is not None else time.time_ns()

    def _wake(self) -> None:
        """Cut the main loop's wait short (a command came in, run() ended)."""
        if self._reader is not None:
            self._reader.interrupt()

    def _open_reader(self) -> bool:
        if self._reader is not None:
            return True
        try:
            self._reader = EdgeReader.open(self.spec.edges)
        except FileNotFoundError:
            return False  # the rank has not created it yet
        return True

    def request_stop(self, reason: str) -> None:
        """Ask the main loop to stop the task (thread- and signal-safe)."""
        self._cmds.put({"cmd": "stop", "reason": reason})
        self._wake()

    def _send(self, message: dict[str, Any]) -> None:
        if self.conn is None:
            return
        try:
            with self._send_lock:
                self.conn.send_bytes(json.dumps(message).encode())
        except OSError:
            pass  # the worker is gone; the control thread turns that into a stop

    def _emit_state(self, event: str, accepted: bool, reason: str = "", tb: str = "") -> None:
        self._announce_held()  # an earlier change goes first
        self._announce(event, str(self.machine.state), accepted, reason, tb, self._now_ns())

    def _announce_held(self) -> None:
        """Announce the state change ``_apply(..., hold=True)`` kept back, if any."""
        held, self._held = self._held, None
        if held is not None:
            event, state, reason, t_ns = held
            self._announce(event, state, True, reason, "", t_ns)

    def _announce(
        self, event: str, state: str, accepted: bool, reason: str, tb: str, t_ns: int
    ) -> None:
        """The state change's event (stamped ``t_ns``, when it was applied) and the worker's
        message."""
        self.sink.emit(
            ev.SideTaskStateChanged(
                task_id=self.spec.task.task_id,
                name=self.spec.task.display_name,
                stage=self.spec.stage,
                state=state,
                t_ns=t_ns,
                event=event,
                accepted=accepted,
                reason=reason,
                traceback=tb,
            )
        )
        self._send(
            {
                "type": "state",
                "state": state,
                "event": event,
                "accepted": accepted,
                "reason": reason,
                "mode": self.mode,
            }
        )

    def _control_loop(self) -> None:
        assert self.conn is not None
        while not self._done.is_set():
            try:
                message = json.loads(self.conn.recv_bytes())
            except (EOFError, OSError):
                if not self._done.is_set():
                    self.request_stop("worker exited")
                return
            except ValueError as exc:
                log.warning("ignoring a control message that is not JSON: %s", exc)
                continue
            self._cmds.put(message)
            self._wake()

    # -- state machine --

    def _apply(
        self, event: SideTaskEvent, reason: str | Callable[[], str] = "", *, hold: bool = False
    ) -> bool:
        """Apply ``event`` (running its hooks) and announce it: an event and a message to the
        worker; with ``hold``, the announcement waits for ``_announce_held`` (the next one, at
        the latest). False if the state machine refused it (announced at once). Waits first
        for a checkpoint's copies still in flight: the change may let the task step."""
        copies, self._copies = self._copies, None
        if copies is not None:
            copies.wait()
        self._announce_held()
        outcome = transition(self.machine.state, event)
        if isinstance(outcome, Rejected):
            self.machine.apply(event, t_ns=self._now_ns())
            log.info("task %s: %s", self.spec.task.task_id, outcome.reason)
            self._emit_state(str(event), False, outcome.reason)
            return False
        for hook in outcome.hooks:
            self._hook(hook)
        text = reason() if callable(reason) else reason
        t_ns = self._now_ns()
        self.machine.apply(event, t_ns=t_ns)
        if hold:
            self._held = (str(event), str(self.machine.state), text, t_ns)
        else:
            self._announce(str(event), str(self.machine.state), True, text, "", t_ns)
        return True

    def _hook(self, name: str) -> None:
        task = self.task
        if task is None:
            return
        self._where = name
        if name == "to_device":
            task.to_device(self.spec.device)
        else:
            getattr(task, name)()

    def _fail(self, exc: BaseException, tb: str) -> None:
        reason = failure_reason(exc, self._where)
        log.error("task %s failed: %s", self.spec.task.task_id, reason)
        outcome = transition(self.machine.state, SideTaskEvent.FAIL)
        if isinstance(outcome, Rejected):
            return
        for hook in outcome.hooks:
            try:
                self._hook(hook)
            except BaseException:  # sys.exit() in teardown must not skip the FAILED event
                log.exception("task %s: %s failed while failing", self.spec.task.task_id, hook)
        self.machine.apply(SideTaskEvent.FAIL, t_ns=self._now_ns())
        self._emit_state(str(SideTaskEvent.FAIL), True, reason, tb)


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc).lower()
    return (
        "out of memory" in text
        or "can't allocate memory" in text
        or "cannot allocate memory" in text
    )


def failure_reason(exc: BaseException, where: str) -> str:
    lines = str(exc).strip().splitlines()
    message = lines[0][:300] if lines else ""
    if _is_oom(exc):
        return f"out of memory: {type(exc).__name__}: {message} (in {where})"
    what = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return f"{where} raised {what}"


def _spin_lead_s(device: str, override_us: str | None) -> float:
    """How long before a predicted bubble start the host spins: GPU runs only, unless the
    environment says otherwise (a CPU run's cores belong to training)."""
    default = _SPIN_LEAD_S if str(device).startswith("cuda") else 0.0
    return _us_or(SPIN_LEAD_ENV, override_us, default)


def _env_us(name: str, default_s: float) -> float:
    """The environment's ``name`` (µs) in seconds, or ``default_s``."""
    return _us_or(name, os.environ.get(name), default_s)


def _us_or(name: str, value_us: str | None, default_s: float) -> float:
    """``value_us`` (µs, from the environment's ``name``) in seconds, at least 0; ``default_s``
    when unset or not a number (with a warning)."""
    if value_us:
        try:
            us = float(value_us)
        except ValueError:
            log.warning("%s=%r is not a number of µs; ignored", name, value_us)
        else:
            if math.isfinite(us):
                return max(0.0, us) / 1e6
            log.warning("%s=%r is not a finite number of µs; ignored", name, value_us)
    return default_s
