"""``TaskHost``: one side task in its own process, driven by its worker and the rank's edges.

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

- **gating "trickle"** (iterative tasks): bubbles as above; between them, while the rank
  computes, paced groups of steps up to the task's trickle duty (``host.iterative``
  [Note: trickle]), which ``tune`` changes live.
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
"budget_s": s|null, "overrun_policy": p, "trickle_duty": d}``, ``{"cmd": "resume"}`` (after an
overrun PAUSE), ``{"cmd": "checkpoint"}``, ``{"cmd": "preempt"}``, ``{"cmd": "stop", "reason": r,
"restart": b}``.
host → worker: ``{"type": "state", "state", "event", "accepted", "reason", "mode"}``,
``{"type": "ack", "cmd", "ok", "message"}``, ``{"type": "paused"}`` (imperative: SIGSTOP me).
End of file = worker gone: stop.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import traceback
from collections.abc import Iterator
from typing import Any

from freeride_lab.core.sidetask_state import SideTaskEvent, SideTaskState
from freeride_lab.sidetasks.api import ImperativeSideTask
from freeride_lab.sidetasks.edges import Edge, Phase
from freeride_lab.sidetasks.host.accounting import training_busy_ns
from freeride_lab.sidetasks.host.imperative import ImperativeDriver
from freeride_lab.sidetasks.host.iterative import IterativeSteps
from freeride_lab.sidetasks.limits import GpuLimits, apply_in_process, support_summary
from freeride_lab.sidetasks.loader import load_task_class
from freeride_lab.sidetasks.spec import checkpoint_path, parse_overrun_policy

__all__ = ["TaskHost"]

_WAIT_S = 0.5  # longest sleep of the host's loop without a bubble or a command


class TaskHost(IterativeSteps):
    """Runs one side task: its state machine, its steps in bubbles, its checkpoints."""

    def run(self) -> int:
        """Run until the task ends (or is restarted); the process exit code."""
        if self.conn is not None:
            threading.Thread(target=self._control_loop, name="task-control", daemon=True).start()
        try:
            cls = load_task_class(self.spec.task.task)
            self.mode = "imperative" if issubclass(cls, ImperativeSideTask) else "iterative"
            gating = self.spec.task.gating
            if self.mode == "imperative" and gating in ("trickle", "leftovers"):
                raise ValueError(
                    f"gating {gating!r} needs an iterative task (step()); {cls.__name__} is "
                    "imperative (run()): attach it with gating 'bubbles'"
                )
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
            self._drain_writer()
            self._done.set()
            self._release_leftovers()
            if self._reader is not None:
                self._reader.close()  # its wake-up pipe goes with it
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
        if self.spec.task.gating == "trickle" and on_device and not self._policy_paused:
            self._turn_trickle()
        elif self.spec.task.gating == "none" and on_device and not self._policy_paused:
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

    def _turn_trickle(self) -> None:
        """Gating "trickle": a bubble as under "bubbles"; else, when due, steps between bubbles
        (``host.iterative`` [Note: trickle])."""
        limit_s = _WAIT_S
        if self._trickle_duty > 0:
            limit_s = max(0.0, (self._trickle_next_ns - self.reader.now_ns()) / 1e9)
        edge = self._wait_for_edge(limit_s)
        if edge is not None and edge.in_bubble:
            self._end_trickle()
            if self._cmds.empty():
                self._run_bubble(edge)
        elif self._trickle_due() and self._cmds.empty():
            self._run_trickle()
        elif self._trickle_duty <= 0:
            self._end_trickle()

    def _wait_for_edge(self, limit_s: float = _WAIT_S) -> Edge | None:
        """The next edge (None after ``limit_s``, at most ``_WAIT_S``), with a spin across the
        window the next bubble should start in (``core.edge_timing`` [Note: spin window]; GPU
        runs only: a CPU run's cores belong to training)."""
        reader = self.reader
        limit_s = min(limit_s, _WAIT_S)
        window = None
        if self._spin_lead_s > 0:
            lead_ns = round(self._spin_lead_s * 1e9)
            window = self._clock.spin_window(lead_ns, round(self._spin_most_s * 1e9))
        self._seen_ns = self._expected_ns = self._spin_from_ns = self._spin_until_ns = 0
        if window is None:
            edge, seen_ns = self._wait(limit_s)
        else:
            sleep_s = (window[0] - reader.now_ns()) / 1e9
            edge, seen_ns = self._wait(min(sleep_s, limit_s)) if sleep_s > 0 else (None, 0)
            if edge is None and sleep_s <= limit_s:
                spin_s = (window[1] - reader.now_ns()) / 1e9
                edge, seen_ns = self._wait(limit_s, spin_s=spin_s)
        if edge is None:
            return None
        self._forward_end(edge)  # host.iterative [Note: leftovers]
        self._note_length(edge)
        if edge.in_bubble:
            expected_ns = self._clock.bubble_started(
                start_ns=edge.start_ns,
                previous_slot=edge.previous_slot,
                previous_end_ns=edge.previous_end_ns,
            )
            # the first step after it reports them (the signal latency's hops)
            self._seen_ns = seen_ns
            self._expected_ns = expected_ns or 0
            self._spin_from_ns, self._spin_until_ns = window if window is not None else (0, 0)
        elif edge.phase is Phase.BUSY and edge.observed_end_ns is not None:
            self._clock.bubble_ended(slot=edge.slot, end_ns=edge.observed_end_ns)
        return edge

    def _wait(self, timeout_s: float, spin_s: float = 0.0) -> tuple[Edge | None, int]:
        """``reader.wait``, marked as a wait in the beacon, and when it returned."""
        with self._waiting():
            edge = self.reader.wait(timeout_s=timeout_s, spin_s=spin_s)
            return edge, self.reader.now_ns()

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
                self._checkpoint("preempt")
            return ok, str(self.machine.state)
        if cmd == "tune":
            if "budget_s" in message:
                budget = message["budget_s"]
                self._budget_fixed_ns = None if budget is None else int(float(budget) * 1e9)
            if "overrun_policy" in message:
                self._policy = parse_overrun_policy(message["overrun_policy"])
            if "trickle_duty" in message:
                try:  # GpuLimits holds the rule; a bad value leaves the duty as it was
                    duty = GpuLimits(trickle_duty=message["trickle_duty"]).trickle_duty
                except (TypeError, ValueError) as exc:
                    return False, str(exc)
                self._trickle_duty = duty
                self._trickle_next_ns = 0
            return True, (
                f"budget_ns={self._budget_ns()} policy={self._policy} "
                f"trickle_duty={self._trickle_duty:g}"
            )
        if cmd == "resume":
            self._policy_paused = False
            return True, "taking bubbles again"
        if cmd == "checkpoint":
            driver = self._driver
            if driver is not None and driver.started and not driver.parked:
                return False, "run() is between pause points; its state is saved once it pauses"
            self._checkpoint("request")
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
            self._checkpoint("restart" if restart else "stop")
        if restart:
            if state is SideTaskState.RUNNING:
                self._apply(SideTaskEvent.PAUSE)
            if self.machine.state is SideTaskState.PAUSED:
                self._apply(SideTaskEvent.PREEMPT, reason)
            self._exit = True
            return
        self._apply(SideTaskEvent.STOP, reason)

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
            busy_ns = training_busy_ns(bubble, latest, start_ns, now_ns)
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
