"""The side-task worker beside one rank: a FIFO of side tasks, at most one of them running.

    python -m freeride_lab.sidetasks.worker --run-dir D --rank R [--device cuda:0] [--stage S]

or started by the rank itself (``worker_client.open_edges``, rank.py's ``edges_factory``).

The worker holds an ``EdgeReader`` on its rank's edge file, starts one task process per
attached task (``TaskProcess``: ``task_host`` with the limits in its environment), activates
the first live task of its FIFO (only that one takes bubbles) and, beside it, the first live
task attached with gating "leftovers" (it takes only the bubble time the first one hands on:
``host.iterative`` [Note: leftovers]), stops and continues imperative
tasks with SIGSTOP/SIGCONT at bubble edges (``worker_edges``), and acknowledges every command
(``worker_control`` [Note: worker control]) in its event file (``events/worker-<r>.jsonl``)
with a ``ControlAck``. Tasks write their own states and steps to ``events/task-<id>.jsonl``.
Its watchdog thread (``sidetasks.watchdog``) kills task processes that hang (a step past
``2 x budget + hang_after_s``, a wait long overdue), whatever their overrun policy, and beats
``workers/worker-<r>.heartbeat`` for the session's watchdog.

The worker exits when its rank closes the edge file (training over), when its parent dies, on
SIGTERM or on ``stop``; every path checkpoints and stops its tasks first, all at once, killing
any still running ``STOP_GRACE_S`` later (so cleanup takes at most that, hung tasks included).
A detach does the same for one task. SIGINT is ignored. An error that escapes the loop stops
and checkpoints the tasks the same way, then reports each of them FAILED ("worker for rank R
died: internal error: ...") and exits with code 1: a worker's death is never a normal end of
its tasks (see ``worker_exit`` [Note: worker death] for deaths it cannot report itself).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import logging
import os
import queue
import signal
import socket
import threading
import time
import uuid
from multiprocessing.connection import wait as wait_for
from pathlib import Path
from typing import Any

import psutil

from freeride_lab.core import events as ev
from freeride_lab.core.sidetask_state import SideTaskEvent, SideTaskState, is_terminal
from freeride_lab.core.task_queue import Queued, next_move
from freeride_lab.io.fast_exit import exit_now
from freeride_lab.io.rundir import RunDir
from freeride_lab.io.sink import EventSink
from freeride_lab.sidetasks.client import worker_address_file
from freeride_lab.sidetasks.edges import EdgeWriter, edge_path, leftovers_path
from freeride_lab.sidetasks.heartbeat import WorkerHeartbeat, heartbeat_path
from freeride_lab.sidetasks.limits import GpuLimits, env_for, restart_fields
from freeride_lab.sidetasks.loader import check_task_ref
from freeride_lab.sidetasks.process import STOP_GRACE_S, TaskProcess, stop_all
from freeride_lab.sidetasks.spec import HostSpec, TaskSpec, checkpoint_path
from freeride_lab.sidetasks.watchdog import (
    CUDA_FIRST_STEP_SLACK_S,
    WORKER_HEARTBEAT_S,
    TaskWatchdog,
)
from freeride_lab.sidetasks.worker_control import ControlServer, Reply
from freeride_lab.sidetasks.worker_edges import watch_edges

log = logging.getLogger(__name__)

__all__ = ["Worker", "main"]

_TICK_S = 0.2  # main-loop wake-up without any message (reaping, parent check)
_REPLY_FLUSH_S = 2.0  # at exit, how long the acks already given may take to be sent
_LIMIT_FIELDS = tuple(f.name for f in dataclasses.fields(GpuLimits))
_COMMANDS = "attach, tune, detach, resume, checkpoint, status, stop"
_ENDED_KEPT = 100  # tasks that left the worker, the latest, that status replies list


class Worker:
    """Serves one rank's side tasks until stopped; ``serve()`` runs it in this process.

    Args:
        device: "cpu" or "cuda:<i>" for the task processes.
        stage: the rank's lowest stage index (events carry it); None = ``rank``.
        parent_pid: stop when this process dies; None = no watchdog.
        mps_active: an MPS daemon serves the run (its client variables are in this process's
            environment); None = yes if ``CUDA_MPS_PIPE_DIRECTORY`` is set and device is CUDA.
        exit_on_close: stop when the rank closes its edge file.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        rank: int,
        *,
        device: str = "cpu",
        stage: int | None = None,
        parent_pid: int | None = None,
        mps_active: bool | None = None,
        exit_on_close: bool = True,
    ) -> None:
        self.run_dir = RunDir(Path(run_dir))
        self._secret = self.run_dir.secret()  # once: see [Note: a private run directory]
        self.rank = rank
        self.stage = rank if stage is None else stage
        self.device = device
        self.parent_pid = parent_pid
        if mps_active is None:
            mps_active = device.startswith("cuda") and "CUDA_MPS_PIPE_DIRECTORY" in os.environ
        self.mps_active = mps_active
        self.exit_on_close = exit_on_close
        self._tasks: dict[str, TaskProcess] = {}  # FIFO order = insertion order
        # the latest tasks that left this worker, for status replies
        self._ended: collections.deque[dict[str, Any]] = collections.deque(maxlen=_ENDED_KEPT)
        self._active: TaskProcess | None = None  # the main task: it takes the bubbles
        self._filling: TaskProcess | None = None  # the leftovers task: what the main one leaves
        self._preempting: set[str] = set()  # active tasks asked to make way (core.task_queue)
        self._commands: queue.Queue[tuple[dict[str, Any], Reply]] = queue.Queue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._stopping = False
        self._stop_reason = ""
        self._crash = ""  # why the loop died, if it did: its tasks' FAILED reason
        self._control = ControlServer(
            self._secret, submit=self._submit, ack=self._ack, stopping=lambda: self._stopping
        )
        self._clock_offset_ns = 0
        self._sink = EventSink.for_rank(self.run_dir, rank, worker=True)
        self._initial_ppid = os.getppid()
        self._watchdog: TaskWatchdog | None = None

    def __repr__(self) -> str:
        return f"<Worker(rank={self.rank}, device={self.device!r}, tasks={len(self._tasks)})>"

    # -- lifetime --

    def serve(self) -> int:
        """Run until stopped; the exit code (0)."""
        host, port = self._control.start()
        threading.Thread(target=self._watch_edges, name="worker-edges", daemon=True).start()
        info = {"address": [host, port], "pid": os.getpid(), "rank": self.rank}
        info |= {"stage": self.stage, "device": self.device, "mps_active": self.mps_active}
        path = worker_address_file(self.run_dir.path, self.rank)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._watchdog = self._start_watchdog()
        self.run_dir.write_json(path, info)
        log.info("worker rank %d listening on %s:%d (%s)", self.rank, host, port, self.device)
        try:
            while not self._stopping:
                self._turn()
        except Exception as exc:
            self._crash = f"worker for rank {self.rank} died: internal error: {_one_line(exc)}"
            log.exception("worker rank %d: its loop failed", self.rank)
            raise
        finally:
            self._shutdown()
        return 0

    def request_stop(self, reason: str) -> None:
        """Ask the main loop to stop every task and exit (thread- and signal-safe)."""
        self._stop_reason = self._stop_reason or reason
        self._stopping = True
        self._poke()

    def _submit(self, message: dict[str, Any], reply: Reply) -> None:
        """A client's request, for the main loop (from the control channel's threads)."""
        self._commands.put((message, reply))
        self._poke()

    def _poke(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    def _turn(self) -> None:
        channels: list[Any] = [self._wake_r]
        channels += [t.conn for t in self._tasks.values() if t.conn is not None]
        for ready in wait_for(channels, timeout=_TICK_S):
            if ready is self._wake_r:
                with contextlib.suppress(OSError):
                    self._wake_r.recv(4096)
                continue
            task = next((t for t in self._tasks.values() if t.conn is ready), None)
            if task is not None:
                message = task.receive()
                if message is not None:
                    self._on_message(task, message)
        self._run_commands()
        self._reap()
        self._check_parent()
        self._activate_next()

    def _start_watchdog(self) -> TaskWatchdog:
        """The thread that judges the task processes and beats for the session."""
        try:
            heartbeat = WorkerHeartbeat(
                heartbeat_path(self.run_dir.path, self.rank), period_s=WORKER_HEARTBEAT_S
            )
        except OSError as exc:  # the tasks are still watched; only the session cannot watch us
            log.warning("worker rank %d: no heartbeat file (%s)", self.rank, exc)
            heartbeat = None
        first_step_slack_s = CUDA_FIRST_STEP_SLACK_S if self.device.startswith("cuda") else 0.0
        return TaskWatchdog(
            lambda: list(self._tasks.values()),
            heartbeat=heartbeat,
            first_step_slack_s=first_step_slack_s,
        ).start()

    def _shutdown(self) -> None:
        reason = self._crash or self._stop_reason or "worker stopped"
        tasks = list(self._tasks.values())
        for task in tasks:
            task.busy = True
        stop_all(tasks, reason, grace_s=STOP_GRACE_S, on_message=self._on_message)
        for task in tasks:
            self._forget(task)
            if self._crash and task.state is not SideTaskState.FAILED:
                task.state = SideTaskState.FAILED  # checkpointed, but not a normal end
                self._emit_state(task, str(SideTaskEvent.FAIL), self._crash)
        self._run_commands()  # answer what came in meanwhile (the tasks are gone now)
        self._control.flush(_REPLY_FLUSH_S)  # let the clients' threads send those (a stop's ack)
        if self._watchdog is not None:
            self._watchdog.stop()
            if self._watchdog.heartbeat is not None:
                self._watchdog.heartbeat.close(remove=True)
        self._control.close()
        with contextlib.suppress(OSError):
            worker_address_file(self.run_dir.path, self.rank).unlink()
        self._sink.close()
        log.info("worker rank %d stopped: %s", self.rank, reason)

    def _check_parent(self) -> None:
        if self.parent_pid is None:
            return
        if os.getppid() != self._initial_ppid or not psutil.pid_exists(self.parent_pid):
            self.request_stop(f"parent process {self.parent_pid} exited")

    # -- control channel --

    def _ack(
        self, command: str, ok: bool, message: str = "", payload: dict[str, Any] | None = None
    ) -> ev.ControlAck:
        return ev.ControlAck(
            command=command, t_ns=self._now_ns(), ok=ok, message=message, payload=payload or {}
        )

    def _run_commands(self) -> None:
        while True:
            try:
                message, reply = self._commands.get_nowait()
            except queue.Empty:
                return
            cmd = str(message.get("cmd", ""))
            try:
                ack = self._command(cmd, message)
            except (ValueError, TypeError, KeyError) as exc:
                ack = self._ack(cmd, False, f"{type(exc).__name__}: {exc}")
            except Exception as exc:
                log.exception("worker: command %s failed", cmd)
                ack = self._ack(cmd, False, f"internal error: {type(exc).__name__}: {exc}")
            self._sink.emit(ack)
            reply.put(ack)

    def _command(self, cmd: str, message: dict[str, Any]) -> ev.ControlAck:
        if cmd == "status":
            return self._ack(cmd, True, f"{len(self._tasks)} task(s)", self._status())
        if cmd == "stop":
            self.request_stop("stop command")
            return self._ack(cmd, True, "stopping every task, then the worker")
        if cmd not in ("attach", "tune", "detach", "resume", "checkpoint"):
            return self._ack(cmd, False, f"unknown command {cmd!r}; valid: {_COMMANDS}")
        if self._stopping:
            return self._ack(cmd, False, f"the worker is stopping ({self._stop_reason})")
        if cmd == "attach":
            return self._attach(message)
        task_id = str(message.get("task_id", ""))
        task = self._tasks.get(task_id)
        if task is None:
            attached = ", ".join(self._tasks) or "none"
            return self._ack(cmd, False, f"no task {task_id!r} here; attached: {attached}")
        if cmd == "tune":
            return self._tune(task, message)
        if cmd == "detach":
            state = self._end_task(task, str(message.get("reason", "detached")))
            where = checkpoint_path(self.run_dir.path, task_id)
            payload = {"task_id": task_id, "state": state}
            return self._ack(cmd, True, f"{task_id} {state}; checkpoint {where}", payload)
        if cmd == "checkpoint":
            where = checkpoint_path(self.run_dir.path, task_id)
            payload = {"task_id": task_id, "path": str(where)}
            if not task.alive:
                text = f"{task_id} has no process running (not started yet, or ended)"
                return self._ack(cmd, False, text, payload)
            ok = task.request({"cmd": "checkpoint"}, on_message=self._on_message)
            why = task.last_reply or "no answer"
            text = f"{task_id}: checkpoint {where}" if ok else f"{task_id} saved none: {why}"
            return self._ack(cmd, ok, text, payload)
        ok = task.request({"cmd": "resume"}, on_message=self._on_message)
        return self._ack(cmd, ok, f"{task_id} resumed" if ok else f"{task_id} did not answer")

    def _attach(self, message: dict[str, Any]) -> ev.ControlAck:
        spec = TaskSpec.from_dict(message.get("spec") or {})
        check_task_ref(spec.task)
        if not spec.task_id:
            spec = dataclasses.replace(spec, task_id=f"t{uuid.uuid4().hex[:8]}")
        if spec.task_id in self._tasks:
            text = f"task {spec.task_id!r} is already attached; detach it first"
            return self._ack("attach", False, text)
        task = TaskProcess(spec)
        self._tasks[spec.task_id] = task
        self._emit_state(task, "", f"attached to rank {self.rank} ({self.device})")
        self._spawn(task)
        position = list(self._tasks).index(spec.task_id)
        payload = {"task_id": spec.task_id, "position": position, "pid": task.pid}
        return self._ack("attach", True, f"{spec.task_id} queued at position {position}", payload)

    def _tune(self, task: TaskProcess, message: dict[str, Any]) -> ev.ControlAck:
        unknown = sorted(set(message) - {*_LIMIT_FIELDS, "overrun_policy", "cmd", "task_id"})
        if unknown:
            valid = ", ".join([*_LIMIT_FIELDS, "overrun_policy"])
            text = f"unknown setting(s) {', '.join(unknown)}; valid: {valid}"
            return self._ack("tune", False, text)
        limits = task.spec.limits.replace(**{k: message[k] for k in _LIMIT_FIELDS if k in message})
        old = task.spec
        policy = message.get("overrun_policy", old.overrun_policy)
        task.spec = dataclasses.replace(old, limits=limits, overrun_policy=policy)
        fields = restart_fields(old.limits, limits)
        payload: dict[str, Any] = {"task_id": task.task_id, "restarted": False}
        payload["fields"] = list(fields)
        if not task.alive or is_terminal(task.state):
            return self._ack("tune", True, f"{task.task_id} is not running; limits kept", payload)
        if fields:
            self._restart(task, f"restart for new {', '.join(fields)}")
            payload |= {"restarted": True, "pid": task.pid}
            text = f"{task.task_id} restarted for new {', '.join(fields)}"
            return self._ack("tune", True, text, payload)
        live = {"cmd": "tune", "budget_s": limits.budget_s, "trickle_duty": limits.trickle_duty}
        live["overrun_policy"] = str(task.spec.overrun_policy)
        ok = task.request(live, on_message=self._on_message)
        return self._ack("tune", ok, f"{task.task_id} tuned" if ok else "no answer", payload)

    def _status(self) -> dict[str, Any]:
        holders = (self._active, self._filling)
        tasks = [t.describe(active=t in holders) for t in self._tasks.values()]
        return {
            "rank": self.rank,
            "stage": self.stage,
            "device": self.device,
            "pid": os.getpid(),
            "mps_active": self.mps_active,
            "tasks": tasks,
            "ended": list(self._ended),
        }

    # -- task processes --

    def _spawn(self, task: TaskProcess) -> None:
        index = int(self.device.partition(":")[2] or 0) if self.device.startswith("cuda") else 0
        leftovers = leftovers_path(self.run_dir.path, self.rank)
        fills = task.spec.gating == "leftovers"
        if fills and not leftovers.exists():  # the main task's host hands on once it exists
            EdgeWriter.create(leftovers, clock_offset_ns=self._clock_offset_ns).release()
        host = HostSpec(
            task=task.spec,
            run_dir=str(self.run_dir.path),
            rank=self.rank,
            stage=self.stage,
            device=self.device,
            edge_file=str(leftovers) if fills else "",
            leftovers_file="" if fills else str(leftovers),
            mps_active=self.mps_active,
        )
        env = env_for(task.spec.limits, mps_active=self.mps_active, device_index=index)
        task.start(host, env=env, log_path=self.run_dir.logs_dir / f"task-{task.task_id}.log")
        log.info("worker rank %d: task %s started as pid %s", self.rank, task.task_id, task.pid)

    def _on_message(self, task: TaskProcess, message: dict[str, Any]) -> None:
        """A task message that ``TaskProcess.receive`` did not already apply (none is expected)."""
        log.debug("task %s: ignoring message %s", task.task_id, message.get("type"))

    def _end_task(self, task: TaskProcess, reason: str) -> str:
        """Checkpoint and stop ``task`` (killing it if it does not stop), then forget it."""
        task.busy = True
        task.stop(reason, grace_s=STOP_GRACE_S, on_message=self._on_message)
        self._forget(task)
        return str(task.state)

    def _restart(self, task: TaskProcess, reason: str) -> None:
        task.busy = True
        deadline = time.monotonic() + STOP_GRACE_S
        stop = {"cmd": "stop", "reason": reason, "restart": True}
        task.request(stop, timeout_s=STOP_GRACE_S, on_message=self._on_message)
        task.wait_exit(max(0.0, deadline - time.monotonic()))
        self._let_go(task)
        self._spawn(task)
        task.busy = False

    def _reap(self) -> None:
        for task in list(self._tasks.values()):
            if task.proc is not None and task.proc.poll() is not None and not task.busy:
                self._forget(task)

    def _forget(self, task: TaskProcess) -> None:
        """Record how a task whose process has exited ended, and drop it."""
        for message in task.drain():  # its last words (the final state) may still be queued
            self._on_message(task, message)
        code = task.proc.returncode if task.proc is not None else None
        if not is_terminal(task.state):
            reason = task.kill_reason or f"task process exited with code {code} before it ended"
            task.state = SideTaskState.FAILED
            self._emit_state(task, "FAIL", reason)
        task.close()
        self._tasks.pop(task.task_id, None)
        self._let_go(task)
        self._ended.append({"task_id": task.task_id, "state": str(task.state), "exit_code": code})

    def _activate_next(self) -> None:
        """Let the first task in priority order take bubbles if none does, preempting an active
        task of a lower priority (``core.task_queue``); the same, apart, for the tasks attached
        with gating "leftovers"."""
        if self._stopping:
            return
        self._active = self._next_holder(self._active, leftovers=False)
        self._filling = self._next_holder(self._filling, leftovers=True)

    def _next_holder(self, active: TaskProcess | None, *, leftovers: bool) -> TaskProcess | None:
        """The task that holds the main bubbles (or the leftovers) after this turn's move."""
        if active is not None and (not active.alive or self._made_way(active)):
            self._preempting.discard(active.task_id)
            active = None  # gone, or off the device for a preempting task
        queued = [
            Queued(t.task_id, t.spec.limits.priority, t.state, t.mode, t.alive and not t.busy)
            for t in self._tasks.values()
            if (t.spec.gating == "leftovers") == leftovers
        ]
        move = next_move(queued, active.task_id if active is not None else None)
        if active is not None and move.preempt and move.preempt not in self._preempting:
            if active.send({"cmd": "preempt"}):
                self._preempting.add(move.preempt)
        elif move.activate and self._tasks[move.activate].send({"cmd": "activate"}):
            return self._tasks[move.activate]
        return active

    def _made_way(self, task: TaskProcess) -> bool:
        """Whether ``task`` was asked to preempt and has moved off the device."""
        return task.task_id in self._preempting and task.state is SideTaskState.CREATED

    def _let_go(self, task: TaskProcess) -> None:
        """``task`` no longer holds bubbles (it ended, or restarts)."""
        if self._active is task:
            self._active = None
        if self._filling is task:
            self._filling = None
        self._preempting.discard(task.task_id)

    # -- edges --

    def _watch_edges(self) -> None:
        """SIGSTOP/SIGCONT of the active task at bubble edges; stop when training closes."""
        watch_edges(
            edge_path(self.run_dir.path, self.rank),
            stopping=lambda: self._stopping,
            active=lambda: self._active,
            on_clock_offset=self._set_clock_offset,
            on_closed=self._on_edges_closed,
        )

    def _set_clock_offset(self, offset_ns: int) -> None:
        self._clock_offset_ns = offset_ns

    def _on_edges_closed(self) -> None:
        if self.exit_on_close:
            self.request_stop("training finished (edge file closed)")

    def _emit_state(self, task: TaskProcess, event: str, reason: str) -> None:
        self._sink.emit(
            ev.SideTaskStateChanged(
                task_id=task.task_id,
                name=task.spec.display_name,
                stage=self.stage,
                state=str(task.state),
                t_ns=self._now_ns(),
                event=event,
                reason=reason,
            )
        )

    def _now_ns(self) -> int:
        return time.time_ns() + self._clock_offset_ns


def _one_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (at most 300 characters of it)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300]}" if lines else type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m freeride_lab.sidetasks.worker``."""
    parser = argparse.ArgumentParser(prog="python -m freeride_lab.sidetasks.worker")
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--rank", required=True, type=int)
    parser.add_argument("--device", default="cpu", help="cpu or cuda:<i> for the task processes")
    parser.add_argument("--stage", type=int, default=None, help="the rank's lowest stage index")
    parser.add_argument("--parent-pid", type=int, default=None, help="exit when it dies")
    parser.add_argument("--mps", dest="mps", action="store_true", default=None)
    parser.add_argument("--no-mps", dest="mps", action="store_false")
    parser.add_argument("--keep-on-close", action="store_true", help="outlive the edge file")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s worker{args.rank} %(levelname)s %(name)s: %(message)s",
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a notebook Interrupt must not kill side tasks
    worker = Worker(
        args.run_dir,
        args.rank,
        device=args.device,
        stage=args.stage,
        parent_pid=args.parent_pid,
        mps_active=args.mps,
        exit_on_close=not args.keep_on_close,
    )
    signal.signal(signal.SIGTERM, lambda signum, frame: worker.request_stop("SIGTERM"))
    code = worker.serve()
    # Its tasks are stopped and recorded: a late SIGTERM (a stop signals the whole tree, some
    # processes more than once) must not turn this clean end into "killed by SIGTERM", which
    # it would once the interpreter restores default handlers on its way out.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return code


if __name__ == "__main__":
    # [Note: fast exit] as the ranks do: nothing is left to clean up once ``main`` returns, and
    # skipping the interpreter's teardown of torch's modules ends the worker at once
    exit_now(main())
