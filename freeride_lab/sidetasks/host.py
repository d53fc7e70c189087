"""One side task in its own process, driven by its worker and by the rank's bubble edges.

    python -m freeride_lab.sidetasks.host --spec '{"task": {"task": "pkg.module:Class"}, ...}'

The worker starts it through ``TaskProcess`` (limits already in the environment, before any CUDA
call). The host loads the task class, applies the in-process limits, runs ``setup()`` and
restores the task's checkpoint, then runs the state machine of ``core.sidetask_state``:

- **iterative:** inside a bubble it calls ``step()`` while ``should_step(now, predicted end,
  budget, observed end)`` holds; it stops launching as soon as the bubble is seen to end, even
  before its predicted end. Without a fixed budget the first steps profile the task (see
  [Note: profiling in bubbles]). Every step becomes a ``SideTaskStep`` event; a step that ends after
  the observed end carries ``overrun_ns``. Hangs are judged from outside: the thread that runs
  the steps marks each step's start and end, and every wait, in the beacon its worker reads
  (``sidetasks.heartbeat``); a step past ``2 x budget + hang_after_s`` or a wait long overdue gets
  the process killed by the worker's watchdog (``sidetasks.watchdog``).
- **imperative:** ``run()`` runs in a thread from the first bubble on. At a bubble end the host
  closes the gate that ``pause_point()`` waits on, runs ``on_pause`` and tells the worker, which
  then stops the whole process with SIGSTOP (after ``pause_grace_s`` at the latest); at the next
  bubble start the worker sends SIGCONT and the host reopens the gate.

- **gating "none"** (naive co-location, for comparisons): an iterative task steps continuously
  and an imperative one is never paused; steps still become events, and the part of a step
  during which training computed counts as its overrun (no overrun policy; hung steps are still
  killed).

Errors in any hook end the task FAILED with a one-line reason and the traceback (an OOM reads
"out of memory: …"); so do ``sys.exit()``, ``SystemExit``, ``KeyboardInterrupt`` and
``RecursionError`` raised by task code ("step raised SystemExit: 3"). The process exits
non-zero and nothing else is affected.

# [Note: host protocol]
JSON objects over a socketpair (``multiprocessing.connection`` framing; never pickle).
worker → host: ``{"cmd": "activate"}`` (CREATED → PAUSED: take bubbles), ``{"cmd": "tune",
"budget_s": s|null, "overrun_policy": p}``, ``{"cmd": "resume"}`` (after an overrun PAUSE),
``{"cmd": "checkpoint"}``, ``{"cmd": "preempt"}``, ``{"cmd": "stop", "reason": r, "restart": b}``.
host → worker: ``{"type": "state", "state", "event", "accepted", "reason", "mode"}``,
``{"type": "ack", "cmd", "ok", "message"}``, ``{"type": "paused"}`` (imperative: SIGSTOP me).
End of file = worker gone: stop.

# [Note: profiling in bubbles]
FreeRide profiles a task alone before placing it (paper notes §9). Here the task is measured
where it will run, under the limits it will run with, without hurting training: while the step
budget is unknown, the host launches one step per bubble, and only in a bubble whose predicted
length is at least the largest predicted length of the rank's bubbles seen so far (so never in
the first step it watches, which it needs to see every slot once). After ``profile_steps``
steps the median step time and the peak memory make a ``core.budget.Profile``; the budget is
then ``Profile.budget_s()`` (median rounded up to 10 ms x 1.2). With a fixed budget (given, or
set by a tune) the task steps normally and the profile is taken from its first steps. Either
way the profile is reported once per process, as a ``SideTaskStateChanged`` note (event
"PROFILE") and as ``<run_dir>/tasks/<task_id>/profile.json`` (``taskspec.profile_path``), which
holds the numbers (``Profile`` fields plus budget_s, memory_request_bytes, t_ns). A new process
(a restart for new limits) profiles again. Peak memory is the process's peak RSS on CPU and
PyTorch's peak reserved memory on CUDA (the CUDA context is not included).

# [Note: checkpoint format]
``<run_dir>/tasks/<task_id>/checkpoint.pt``, replaced atomically. It is a ``torch.save`` file
when the task process has imported torch (then it may hold tensors) and JSON otherwise, so a
task without torch never pays for importing it; loading tells them apart by the zip magic.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import logging
import os
import queue
import resource
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from freeride_lab.core import events as ev
from freeride_lab.core.budget import (
    GIB,
    OverrunActionKind,
    OverrunStats,
    Profile,
    apply_overrun_policy,
    overran,
    profile_from_steps,
    should_step,
)
from freeride_lab.core.edge_timing import NextBubbleClock
from freeride_lab.core.sidetask_state import (
    Rejected,
    SideTaskEvent,
    SideTaskMachine,
    SideTaskState,
    transition,
)
from freeride_lab.io.rundir import RunDir, create_file
from freeride_lab.io.sink import EventSink
from freeride_lab.sidetasks.api import ImperativeSideTask, IterativeSideTask, SideTaskBase
from freeride_lab.sidetasks.edges import Edge, EdgeReader, Phase
from freeride_lab.sidetasks.heartbeat import TaskBeacon
from freeride_lab.sidetasks.imperative import ImperativeDriver
from freeride_lab.sidetasks.limits import apply_in_process, support_summary
from freeride_lab.sidetasks.loader import load_task_class
from freeride_lab.sidetasks.spec import (
    HostSpec,
    checkpoint_path,
    parse_overrun_policy,
    profile_path,
)

log = logging.getLogger(__name__)

__all__ = ["TaskHost", "load_checkpoint", "main", "save_checkpoint"]

_WAIT_S = 0.5  # longest sleep of the host's loop without a bubble or a command
_FREE_BURST_S = 0.05  # gating "none": steps between two looks at the commands
_SPIN_LEAD_S = 300e-6  # GPU runs: spin from this long before a predicted bubble start
#: Overrides ``_SPIN_LEAD_S`` in µs (0 = never spin, also on GPU runs; > 0 = spin on CPU too).
SPIN_LEAD_ENV = "FREERIDE_SPIN_LEAD_US"
_OVERRUN_WINDOW = 100  # steps the overrun policy looks at


# --- checkpoints --------------------------------------------------------------------------


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` atomically (see [Note: checkpoint format])."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    torch = sys.modules.get("torch")
    try:
        with os.fdopen(create_file(tmp), "wb") as f:
            if torch is not None:
                torch.save(state, f)
            else:
                f.write(json.dumps(state).encode())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def load_checkpoint(path: Path) -> dict[str, Any] | None:
    """The saved state, or None if there is no checkpoint."""
    try:
        with open(path, "rb") as f:
            head = f.read(2)
    except FileNotFoundError:
        return None
    if head == b"PK":
        import torch

        state = torch.load(path, map_location="cpu", weights_only=True)
    else:
        state = json.loads(path.read_text())
    if not isinstance(state, dict):
        raise ValueError(f"checkpoint {str(path)!r} holds a {type(state).__name__}, not a dict")
    return state


# --- the host -----------------------------------------------------------------------------


class TaskHost:
    """Runs one side task: its state machine, its steps in bubbles, its checkpoints."""

    def __init__(
        self,
        spec: HostSpec,
        *,
        conn: Connection | None,
        sink: EventSink,
        beacon: TaskBeacon | None = None,
    ) -> None:
        self.spec = spec
        self.conn = conn
        self.sink = sink
        self.beacon = beacon  # marks for the worker's watchdog; written by this thread only
        self._reader: EdgeReader | None = None  # opened once the rank's edge file exists
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
        self._slot_predicted_ns: dict[int, int] = {}  # slot -> its latest predicted length
        self._first_step_seen: int | None = None
        self._window: collections.deque[int] = collections.deque(maxlen=_OVERRUN_WINDOW)
        self._policy_paused = False
        self._warned_at_step = -(10**9)
        # (step, slot) -> observed end (ns) of recent bubbles; the first value found sticks
        self._ends: collections.OrderedDict[tuple[int, int], int] = collections.OrderedDict()
        self._bubble: Edge | None = None
        self._last_checkpoint_s = time.monotonic()
        self._saved_progress: float | None = None
        self._driver: ImperativeDriver | None = None  # imperative tasks only
        self._last_report_ns = 0
        self._clock = NextBubbleClock()
        self._spin_lead_s = _spin_lead_s(spec.device, os.environ.get(SPIN_LEAD_ENV))

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
        state = str(self.machine.state)
        self.sink.emit(
            ev.SideTaskStateChanged(
                task_id=self.spec.task.task_id,
                name=self.spec.task.display_name,
                stage=self.spec.stage,
                state=state,
                t_ns=self._now_ns(),
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

    def _apply(self, event: SideTaskEvent, reason: str | Callable[[], str] = "") -> bool:
        outcome = transition(self.machine.state, event)
        if isinstance(outcome, Rejected):
            self.machine.apply(event, t_ns=self._now_ns())
            log.info("task %s: %s", self.spec.task.task_id, outcome.reason)
            self._emit_state(str(event), False, outcome.reason)
            return False
        for hook in outcome.hooks:
            self._hook(hook)
        text = reason() if callable(reason) else reason
        self.machine.apply(event, t_ns=self._now_ns())
        self._emit_state(str(event), True, text)
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
        reason = _failure_reason(exc, self._where)
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

    # -- main --

    def run(self) -> int:
        """Run until the task ends (or is restarted); the process exit code."""
        if self.conn is not None:
            threading.Thread(target=self._control_loop, name="task-control", daemon=True).start()
        try:
            cls = load_task_class(self.spec.task.task)
            self.mode = "imperative" if issubclass(cls, ImperativeSideTask) else "iterative"
            self._where = "applying limits"
            limits = self.spec.task.limits
            apply_in_process(limits, device=self.spec.device, mps_active=self.spec.mps_active)
            limits_note = f"limits {json.dumps(limits.to_dict())}; " + support_summary(
                device=self.spec.device, mps_active=self.spec.mps_active
            )
            self._where = "__init__"
            self.task = cls(**self.spec.task.options)
            if isinstance(self.task, ImperativeSideTask):
                self._driver = ImperativeDriver(
                    self.task, on_report=self._report, on_exit=self._wake
                )
            self._apply(SideTaskEvent.CREATE, lambda: f"{limits_note}; {self._restore()}")
            while not self.machine.terminal and not self._exit:
                self._turn()
        except BaseException as exc:  # sys.exit(), KeyboardInterrupt, RecursionError: FAILED too
            if self.beacon is not None:
                self.beacon.busy()
            self._fail(exc, traceback.format_exc())
        finally:
            self._done.set()
        state = self.machine.state
        return 1 if state is SideTaskState.FAILED else 0

    def _turn(self) -> None:
        """One pass of the loop: commands, then a bubble or a wait."""
        self._handle_commands()
        if self.machine.terminal or self._exit:
            return
        if self._driver is not None:
            self._check_run_thread(self._driver)
            if self.machine.terminal:
                return
        if not self._open_reader():
            self._wait_command(0.1)
            return
        state = self.machine.state
        on_device = state in (SideTaskState.PAUSED, SideTaskState.RUNNING)
        if self.spec.task.gating == "none" and on_device and not self._policy_paused:
            if self._driver is None:
                self._run_free()
            elif state is SideTaskState.PAUSED:
                self._resume_imperative(self._driver, self.reader.latest())
            else:
                self._wait_command(_WAIT_S)  # run() goes on through training's compute
        elif state is SideTaskState.PAUSED and not self._policy_paused:
            edge = self._wait_for_edge()
            if edge is not None and edge.in_bubble and self._cmds.empty():
                if self._driver is None:
                    self._run_bubble(edge)
                else:
                    self._resume_imperative(self._driver, edge)
        elif state is SideTaskState.RUNNING:  # imperative: runs until the bubble ends
            edge = self.reader.wait(timeout_s=_WAIT_S)
            if edge is not None and edge.in_bubble:
                self._bubble = edge
            elif edge is not None and self._driver is not None:
                self._pause_imperative(self._driver)
        else:
            self._wait_command(_WAIT_S)
        self._maybe_checkpoint()

    def _wait_for_edge(self) -> Edge | None:
        """The next edge, with a spin across the moment the next bubble should start (see
        ``core.edge_timing``; GPU runs only: a CPU run's cores belong to training)."""
        reader = self.reader
        predicted_ns = self._clock.next_start_ns() if self._spin_lead_s > 0 else None
        if predicted_ns is None:
            with self._waiting():
                edge = reader.wait(timeout_s=_WAIT_S)
        else:
            sleep_s = (predicted_ns - reader.now_ns()) / 1e9 - self._spin_lead_s
            with self._waiting():
                edge = reader.wait(timeout_s=min(sleep_s, _WAIT_S)) if sleep_s > 0 else None
            if edge is None and sleep_s <= _WAIT_S:
                with self._waiting():
                    edge = reader.wait(timeout_s=_WAIT_S, spin_s=2 * self._spin_lead_s)
        if edge is None:
            return None
        if edge.in_bubble:
            self._clock.bubble_started(
                start_ns=edge.start_ns,
                previous_slot=edge.previous_slot,
                previous_end_ns=edge.previous_end_ns,
            )
        elif edge.phase is Phase.BUSY and edge.observed_end_ns is not None:
            self._clock.bubble_ended(slot=edge.slot, end_ns=edge.observed_end_ns)
        return edge

    def _wait_command(self, timeout_s: float) -> None:
        """Sleep until a command arrives (then carry it out) or ``timeout_s`` passes."""
        try:
            with self._waiting():
                message = self._cmds.get(timeout=timeout_s)
        except queue.Empty:
            return
        self._handle(message)

    @contextlib.contextmanager
    def _waiting(self) -> Iterator[None]:
        """Mark a wait of at most ``_WAIT_S`` in the beacon (then busy again). Not once an
        imperative task's ``run()`` has started: its thread may hold the GIL as long as it
        likes, and the worker's SIGSTOPs pause this thread too."""
        beacon = self.beacon
        if beacon is None or (self._driver is not None and self._driver.started):
            yield
            return
        beacon.waiting(_WAIT_S)
        try:
            yield
        finally:
            beacon.busy()

    def _handle_commands(self) -> None:
        while not self.machine.terminal and not self._exit:
            try:
                message = self._cmds.get_nowait()
            except queue.Empty:
                return
            self._handle(message)

    def _handle(self, message: dict[str, Any]) -> None:
        cmd = str(message.get("cmd", ""))
        ok, text = self._command(cmd, message)
        self._send({"type": "ack", "cmd": cmd, "ok": ok, "message": text})

    def _command(self, cmd: str, message: dict[str, Any]) -> tuple[bool, str]:
        state = self.machine.state
        if cmd == "activate":
            self._where = "to_device"
            return self._apply(SideTaskEvent.INIT), str(self.machine.state)
        if cmd == "preempt":
            if self._driver is not None:
                return False, "imperative tasks cannot be preempted; detach them instead"
            if state is SideTaskState.RUNNING:
                self._apply(SideTaskEvent.PAUSE)
            ok = self._apply(SideTaskEvent.PREEMPT, "preempted")
            if ok:
                self._checkpoint()
            return ok, str(self.machine.state)
        if cmd == "tune":
            if "budget_s" in message:
                budget = message["budget_s"]
                self._budget_fixed_ns = None if budget is None else int(float(budget) * 1e9)
            if "overrun_policy" in message:
                self._policy = parse_overrun_policy(message["overrun_policy"])
            return True, f"budget_ns={self._budget_ns()} policy={self._policy}"
        if cmd == "resume":
            self._policy_paused = False
            return True, "taking bubbles again"
        if cmd == "checkpoint":
            self._checkpoint()
            return True, str(checkpoint_path(self.spec.run_dir, self.spec.task.task_id))
        if cmd == "stop":
            self._stop(str(message.get("reason", "stopped")), restart=bool(message.get("restart")))
            return True, str(self.machine.state)
        return (
            False,
            f"unknown command {cmd!r}; valid: activate, preempt, tune, resume, checkpoint, stop",
        )

    def _stop(self, reason: str, *, restart: bool) -> None:
        if self._driver is not None:
            self._driver.quiesce(timeout_s=5.0)
        state = self.machine.state
        if state is not SideTaskState.SUBMITTED and self.task is not None:
            self._checkpoint()
        if restart:
            if state is SideTaskState.RUNNING:
                self._apply(SideTaskEvent.PAUSE)
            if self.machine.state is SideTaskState.PAUSED:
                self._apply(SideTaskEvent.PREEMPT, reason)
            self._exit = True
            return
        self._apply(SideTaskEvent.STOP, reason)

    # -- iterative --

    def _budget_ns(self) -> int:
        """The step guard in force: fixed, else the profile's; 0 while profiling."""
        if self._budget_fixed_ns is not None:
            return self._budget_fixed_ns
        if self.profile is not None:
            return round(self.profile.budget_s() * 1e9)
        return 0

    @property
    def _profiling_in_bubbles(self) -> bool:
        """No budget yet: steps are profile samples, one per largest bubble."""
        return (
            self.profile is None
            and self._budget_fixed_ns is None
            and self.spec.task.gating == "bubbles"
        )

    def _largest_bubble(self, bubble: Edge) -> bool:
        """Note ``bubble``'s predicted length; True if it is the longest of its rank's bubbles
        seen so far (see [Note: profiling in bubbles])."""
        if self._first_step_seen is None:
            self._first_step_seen = bubble.step
        if bubble.predicted_end_ns is None:
            return False
        length_ns = bubble.predicted_end_ns - bubble.start_ns
        self._slot_predicted_ns[bubble.slot] = length_ns
        if bubble.step <= self._first_step_seen:
            return False  # the rank's slots are not all known yet
        return length_ns >= max(self._slot_predicted_ns.values())

    def _note_ends(self, cur: Edge | None) -> None:
        """Remember the bubble ends that ``cur`` reveals (its own and the one before it)."""
        if cur is None:
            return
        if cur.phase is Phase.BUSY and cur.observed_end_ns is not None:
            self._ends.setdefault((cur.step, cur.slot), cur.observed_end_ns)
        if cur.previous_end_ns is not None:
            self._ends.setdefault((cur.previous_step, cur.previous_slot), cur.previous_end_ns)
        while len(self._ends) > 256:
            self._ends.popitem(last=False)

    def _observed_end_ns(self, bubble: Edge, cur: Edge | None) -> int | None:
        """When ``bubble`` was seen to end, or None while it lasts (see ``Edge``)."""
        if cur is None or cur.seq <= bubble.seq:
            return None
        self._note_ends(cur)
        key = (bubble.step, bubble.slot)
        if key not in self._ends:
            # Both its end edge and the next one were replaced before anyone looked (nobody
            # looks while a step runs): it ended no later than the newest edge began, and, as
            # far as anyone knows, at its predicted end. Take the earlier, so an overrun is
            # rather over- than under-counted; keep it so it does not drift.
            later = [t for t in (cur.start_ns, cur.observed_end_ns) if t is not None and t > 0]
            if bubble.predicted_end_ns is not None:
                later.append(max(bubble.predicted_end_ns, bubble.start_ns))
            self._ends[key] = min(later) if later else bubble.start_ns
        return self._ends[key]

    def _run_bubble(self, bubble: Edge) -> None:
        task = self.task
        assert isinstance(task, IterativeSideTask)
        self._bubble = bubble
        profiling = self._profiling_in_bubbles
        largest = self._largest_bubble(bubble) if profiling else False
        predicted_end_ns = bubble.predicted_end_ns
        if predicted_end_ns is None:
            return  # no prediction yet: a step could not be checked against the bubble's length
        if profiling and not largest:
            return  # profile samples come from the largest bubbles only
        if not should_step(self.reader.now_ns(), predicted_end_ns, self._budget_ns(), False):
            return  # too short (or seen too late) for one step: leave it without events
        if not self._apply(SideTaskEvent.START):
            return
        while self._cmds.empty():
            cur = self.reader.latest()
            ended = cur is not None and cur.seq > bubble.seq
            start_ns = self.reader.now_ns()
            if not should_step(start_ns, predicted_end_ns, self._budget_ns(), ended):
                break
            if not self._step_in(task, bubble, start_ns):
                return  # finished
            if self.machine.terminal or self._policy_paused or profiling:
                break  # a profiling step is alone in its bubble
        self._apply(SideTaskEvent.PAUSE)

    def _step_in(self, task: IterativeSideTask, bubble: Edge, start_ns: int) -> bool:
        """One step inside ``bubble``; False once the task has FINISHED."""
        progress = self._one_step(task, bubble.step)
        end_ns = self.reader.now_ns()
        observed_end_ns = self._observed_end_ns(bubble, self.reader.latest())
        overrun_ns = max(0, end_ns - observed_end_ns) if observed_end_ns is not None else 0
        task.progress += progress
        self._record_step(bubble.step, start_ns, end_ns, progress, overrun_ns)
        if task.is_finished():
            self._apply(SideTaskEvent.FINISH, f"progress {task.progress:g} {task.unit}")
            return False
        return True

    def _run_free(self) -> None:
        """Gating "none": step for a short burst whatever training does (naive co-location)."""
        task = self.task
        assert isinstance(task, IterativeSideTask)
        if self.machine.state is SideTaskState.PAUSED and not self._apply(SideTaskEvent.START):
            return
        deadline = time.monotonic() + _FREE_BURST_S
        while self._cmds.empty() and time.monotonic() < deadline:
            start_edge = self.reader.latest()
            start_ns = self.reader.now_ns()
            step = start_edge.step if start_edge is not None else -1
            progress = self._one_step(task, step)
            end_ns = self.reader.now_ns()
            end_edge = self.reader.latest()
            task.progress += progress
            step = end_edge.step if end_edge is not None else -1
            busy_ns = _busy_ns(start_edge, end_edge, start_ns, end_ns)
            self._record_step(step, start_ns, end_ns, progress, busy_ns)
            if task.is_finished():
                self._apply(SideTaskEvent.FINISH, f"progress {task.progress:g} {task.unit}")
                return
            if self.machine.terminal:
                return

    def _one_step(self, task: IterativeSideTask, step: int) -> float:
        """Run ``step()`` until its GPU work is done, marked in the beacon from this thread (a
        step that never returns leaves the mark for the worker's watchdog); its progress."""
        self._where = "step"
        if self.beacon is not None:
            self.beacon.step_started(step, self._budget_ns(), first=self._steps_started == 0)
        self._steps_started += 1
        try:
            progress = float(task.step() or 0.0)
            _wait_for_device(task)
        finally:
            if self.beacon is not None:
                self.beacon.busy()
        return progress

    def _record_step(
        self, step: int, start_ns: int, end_ns: int, progress: float, overrun_ns: int
    ) -> None:
        """An iterative step: its event, a profile sample, the overrun policy."""
        self._emit_step(step, start_ns, end_ns, progress, overrun_ns)
        self._sample_profile(end_ns - start_ns)
        if self.spec.task.gating != "bubbles":
            return  # naive co-location overruns by design; the policy would only stop it
        self._window.append(overrun_ns)
        if overrun_ns > 0:
            self._apply_overrun_policy()

    def _sample_profile(self, duration_ns: int) -> None:
        if self.profile is not None:
            return
        self._profile_ns.append(duration_ns)
        if len(self._profile_ns) >= self.spec.task.profile_steps:
            self._finish_profile()

    def _finish_profile(self) -> None:
        """Make the ``Profile`` and report it (see [Note: profiling in bubbles])."""
        limits = self.spec.task.limits
        profile = profile_from_steps(
            [d / 1e9 for d in self._profile_ns],
            _peak_memory_bytes(self.spec.device),
            sm_pct=limits.sm_pct,
            memory_cap_bytes=limits.memory_bytes,
        )
        self.profile = profile
        budget_s = profile.budget_s()
        request_bytes = profile.memory_request_gib * GIB
        fixed = self._budget_fixed_ns
        in_force = f"; budget fixed at {fixed / 1e6:g} ms" if fixed is not None else ""
        text = (
            f"profiled {profile.n_steps} steps: median {profile.median_step_s * 1e3:.2f} ms, "
            f"p95 {profile.p95_step_s * 1e3:.2f} ms, peak memory "
            f"{profile.peak_memory_bytes / 2**20:.0f} MiB -> budget {budget_s * 1e3:g} ms, "
            f"memory request {profile.memory_request_gib} GiB{in_force}"
        )
        log.info("task %s %s", self.spec.task.task_id, text)
        payload = {
            "task_id": self.spec.task.task_id,
            "median_step_s": profile.median_step_s,
            "p95_step_s": profile.p95_step_s,
            "peak_memory_bytes": profile.peak_memory_bytes,
            "n_steps": profile.n_steps,
            "sm_pct": profile.sm_pct,
            "memory_cap_bytes": profile.memory_cap_bytes,
            "budget_s": budget_s,
            "memory_request_bytes": request_bytes,
            "budget_in_force_s": self._budget_ns() / 1e9,
            "t_ns": self._now_ns(),
        }
        path = profile_path(self.spec.run_dir, self.spec.task.task_id)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            RunDir(Path(self.spec.run_dir)).write_json(path, payload)
        except OSError as exc:  # the note below still carries the numbers
            log.warning("task %s: could not write its profile: %s", self.spec.task.task_id, exc)
        self._emit_state("PROFILE", True, text)

    def overrun_stats(self) -> OverrunStats:
        """Every step this host ran and how many overran (``core.budget.overran``)."""
        return OverrunStats(
            steps=self.steps,
            overruns=self.overruns,
            overrun_ns_total=self.overrun_ns_total,
            budget_ns=self._budget_ns(),
        )

    def _emit_step(
        self, step: int, start_ns: int, end_ns: int, progress: float, overrun_ns: int
    ) -> None:
        task = self.task
        assert task is not None
        self.steps += 1
        if overran(overrun_ns):
            self.overruns += 1
            self.overrun_ns_total += overrun_ns
        self.sink.emit(
            ev.SideTaskStep(
                task_id=self.spec.task.task_id,
                name=self.spec.task.display_name,
                stage=self.spec.stage,
                rank=self.spec.rank,
                step=step,
                start_ns=start_ns,
                end_ns=end_ns,
                progress=progress,
                unit=task.unit,
                overrun_ns=overrun_ns,
            )
        )

    def _apply_overrun_policy(self) -> None:
        stats = OverrunStats.of(self._window, budget_ns=self._budget_ns())
        action = apply_overrun_policy(self._policy, stats)
        if action.kind is OverrunActionKind.NONE:
            return
        if action.kind is OverrunActionKind.WARN:
            if self.steps - self._warned_at_step < _OVERRUN_WINDOW:
                return  # once per window
            self._warned_at_step = self.steps
            log.warning("task %s overruns bubbles: %s", self.spec.task.task_id, action.reason)
            self._emit_state("OVERRUN", True, f"overrun policy WARN: {action.reason}")
            return
        self._window.clear()
        if action.kind is OverrunActionKind.SET_BUDGET:
            self._budget_fixed_ns = action.budget_ns
            self._emit_state("OVERRUN", True, f"overrun policy SHRINK_BUDGET: {action.reason}")
        elif action.kind is OverrunActionKind.PAUSE:
            self._policy_paused = True
            self._emit_state(
                "OVERRUN", True, f"overrun policy PAUSE (resume() to continue): {action.reason}"
            )
        elif action.kind is OverrunActionKind.STOP:
            self._checkpoint()
            self._apply(SideTaskEvent.STOP, f"overrun policy KILL: {action.reason}")

    # -- imperative --

    def _resume_imperative(self, driver: ImperativeDriver, bubble: Edge | None) -> None:
        self._bubble = bubble
        if not self._apply(SideTaskEvent.START):
            return
        if driver.done:
            self._check_run_thread(driver)
            return
        self._last_report_ns = self.reader.now_ns()
        driver.resume()

    def _pause_imperative(self, driver: ImperativeDriver) -> None:
        driver.pause()
        self._apply(SideTaskEvent.PAUSE)
        self._send({"type": "paused"})  # the worker may SIGSTOP this process now

    def _check_run_thread(self, driver: ImperativeDriver) -> None:
        """Turn ``run()``'s return or error into FINISH or FAIL (FINISH only while RUNNING)."""
        if not driver.done or self.machine.terminal:
            return
        if driver.error is not None:
            exc, tb = driver.error
            self._where = "run"
            self._fail(exc, tb)
        elif driver.finished and self.machine.state is SideTaskState.RUNNING:
            task = self.task
            assert task is not None
            self._apply(
                SideTaskEvent.FINISH, f"run() returned; progress {task.progress:g} {task.unit}"
            )

    def _report(self, progress: float) -> None:
        """An imperative task's ``report``: one ``SideTaskStep`` since the previous report."""
        bubble = self._bubble
        now_ns = self.reader.now_ns()
        if self.spec.task.gating == "none":
            latest = self.reader.latest()
            start_ns = self._last_report_ns
            self._last_report_ns = now_ns
            busy_ns = _busy_ns(bubble, latest, start_ns, now_ns)
            step = latest.step if latest is not None else -1
            self._emit_step(step, start_ns, now_ns, float(progress), busy_ns)
            self._bubble = latest
            return
        if bubble is None:
            return
        end_ns = self._observed_end_ns(bubble, self.reader.latest())
        overrun_ns = max(0, now_ns - end_ns) if end_ns is not None else 0
        start_ns = max(self._last_report_ns, bubble.start_ns)
        self._last_report_ns = now_ns
        self._emit_step(bubble.step, start_ns, now_ns, float(progress), overrun_ns)

    # -- limits and checkpoints --

    def _restore(self) -> str:
        task = self.task
        assert task is not None
        self._where = "restoring the checkpoint"
        path = checkpoint_path(self.spec.run_dir, self.spec.task.task_id)
        state = load_checkpoint(path)
        if state is None:
            return "no checkpoint"
        task.load_state_dict(state)
        self._saved_progress = task.progress
        return f"restored progress {task.progress:g} {task.unit} from checkpoint"

    def _checkpoint(self) -> None:
        task = self.task
        if task is None:
            return
        self._where = "state_dict"
        save_checkpoint(
            checkpoint_path(self.spec.run_dir, self.spec.task.task_id), task.state_dict()
        )
        self._saved_progress = task.progress
        self._last_checkpoint_s = time.monotonic()

    def _maybe_checkpoint(self) -> None:
        task = self.task
        if task is None or self.machine.state not in (SideTaskState.PAUSED, SideTaskState.CREATED):
            return
        if time.monotonic() - self._last_checkpoint_s < self.spec.task.checkpoint_interval_s:
            return
        if task.progress == self._saved_progress:
            self._last_checkpoint_s = time.monotonic()
            return
        driver = self._driver
        if driver is not None and driver.started and not driver.parked:
            return  # run() is between pause points; wait for a clean boundary
        self._checkpoint()


# --- helpers ------------------------------------------------------------------------------


def _spin_lead_s(device: str, override_us: str | None) -> float:
    """How long before a predicted bubble start the host spins: GPU runs only, unless the
    environment says otherwise (a CPU run's cores belong to training)."""
    if override_us:
        try:
            return max(0.0, float(override_us)) / 1e6
        except ValueError:
            log.warning("%s=%r is not a number of µs; ignored", SPIN_LEAD_ENV, override_us)
    return _SPIN_LEAD_S if str(device).startswith("cuda") else 0.0


def _wait_for_device(task: SideTaskBase) -> None:
    """Block until ``task``'s queued GPU work is done.

    A step ends when its kernels do, not when ``step()`` returns: CUDA launches are
    asynchronous, and work still queued at the bubble's end would run into training's compute
    (and a profile of launch times alone would be far too short a budget).
    """
    torch = sys.modules.get("torch")  # a task that never imported torch has no GPU work
    if torch is not None and str(task.device).startswith("cuda"):
        # Not gated on torch.cuda.is_initialized(): work queued through torch._C alone (a
        # custom kernel, torch.cuda._sleep) leaves that flag False.
        torch.cuda.synchronize(task.device)


def _busy_ns(first: Edge | None, last: Edge | None, start_ns: int, end_ns: int) -> int:
    """Gating "none": the part of [start_ns, end_ns] during which training computed, as far as
    the edges seen at its start (``first``) and end (``last``) tell."""
    idle_ns = 0
    if first is not None and first.in_bubble:
        # the bubble open at the start lasted until its end edge (or is still open)
        first_end = end_ns
        if last is not None and last.seq > first.seq:
            same = (last.step, last.slot) == (first.step, first.slot)
            first_end = last.observed_end_ns if same and last.observed_end_ns else start_ns
            if not same and last.previous_end_ns is not None:
                first_end = last.previous_end_ns
        idle_ns += max(0, min(end_ns, first_end) - start_ns)
    if last is not None and last.in_bubble and (first is None or last.seq != first.seq):
        idle_ns += max(0, end_ns - max(start_ns, last.start_ns))
    return max(0, (end_ns - start_ns) - idle_ns)


def _peak_memory_bytes(device: str) -> int:
    """Peak memory of this task process: PyTorch's peak reserved on CUDA, peak RSS on CPU."""
    torch = sys.modules.get("torch")
    if device.startswith("cuda") and torch is not None and torch.cuda.is_initialized():
        index = torch.device(device).index or 0
        return int(torch.cuda.max_memory_reserved(index))
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return int(peak_kib) * 1024


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc).lower()
    return (
        "out of memory" in text
        or "can't allocate memory" in text
        or "cannot allocate memory" in text
    )


def _failure_reason(exc: BaseException, where: str) -> str:
    lines = str(exc).strip().splitlines()
    message = lines[0][:300] if lines else ""
    if _is_oom(exc):
        return f"out of memory: {type(exc).__name__}: {message} (in {where})"
    what = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return f"{where} raised {what}"


def _task_sink(spec: HostSpec) -> EventSink:
    """The task's own event file, ``events/task-<id>.jsonl``, wired to the run's bus if any."""
    run_dir = RunDir(Path(spec.run_dir))
    path = run_dir.events_dir / f"task-{spec.task.task_id}.jsonl"
    bus = None
    try:
        address = run_dir.read_run().get("bus", {}).get("address")
        if address:
            bus = ((str(address[0]), int(address[1])), run_dir.secret())
    except (OSError, ValueError):
        bus = None
    return EventSink(path, bus=bus)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m freeride_lab.sidetasks.host``."""
    parser = argparse.ArgumentParser(prog="python -m freeride_lab.sidetasks.host")
    parser.add_argument("--spec", required=True, help="HostSpec as JSON (see HostSpec.to_dict)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a notebook Interrupt must not kill side tasks
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s task_host[%(process)d] %(levelname)s %(name)s: %(message)s",
    )
    spec = HostSpec.from_dict(json.loads(args.spec))
    conn = Connection(spec.control_fd) if spec.control_fd >= 0 else None
    beacon = TaskBeacon.attach(spec.beacon_fd) if spec.beacon_fd >= 0 else None
    sink = _task_sink(spec)
    host = TaskHost(spec, conn=conn, sink=sink, beacon=beacon)
    signal.signal(signal.SIGTERM, lambda signum, frame: host.request_stop("SIGTERM"))
    try:
        code = host.run()
    finally:
        sink.close()
    # the task's end is recorded: a late SIGTERM must not turn it into "killed by SIGTERM"
    # (the interpreter restores default handlers on its way out)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    log.info("task %s exits in state %s", spec.task.task_id, host.machine.state)
    log.info("task %s: %s", spec.task.task_id, host.overrun_stats().describe())
    return code


if __name__ == "__main__":
    # [Note: fast exit] as the ranks and the worker do: the end is recorded, and skipping the
    # interpreter's teardown of torch's modules lets the process go at once
    exit_code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)
