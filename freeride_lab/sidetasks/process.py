"""``TaskProcess``: the worker's handle on one task process (``python -m ...task_host``).

    proc = TaskProcess(spec)
    proc.start(HostSpec(task=spec, run_dir=..., rank=0, stage=0), env=env_for(limits, ...))
    proc.request({"cmd": "activate"})        # sends, then serves its messages until the ack
    proc.signal(signal.SIGSTOP)              # imperative tasks outside bubbles
    proc.stop("detached", grace_s=8)         # checkpoint and stop; killed after the grace
    stop_all(tasks, "worker stopped", grace_s=8)  # the same for many, in parallel

Messages follow [Note: host protocol] in ``task_host``: JSON over a socketpair, never pickle.
``receive`` applies what concerns the handle itself (state, mode, acks, the imperative "paused")
and returns every message so the worker can act on the rest.

Each start also gives the process a ``TaskBeacon`` (``sidetasks.heartbeat``), the marks the
worker's watchdog judges hangs by, and a ``TaskLog``: its stdout and stderr go through a pipe
into its capped log file. A kill (``kill``, or the end of a stop's grace) is a SIGKILL of the
process and its descendants (``proctree.kill_tree``).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_for
from pathlib import Path
from typing import Any

import freeride_lab
from freeride_lab.core.sidetask_state import SideTaskState, is_terminal
from freeride_lab.sidetasks.heartbeat import TaskBeacon
from freeride_lab.sidetasks.messages import MAX_FRAME_BYTES, MessageError, decode_host_message
from freeride_lab.sidetasks.proctree import kill_tree
from freeride_lab.sidetasks.spec import HostSpec, TaskSpec
from freeride_lab.sidetasks.task_log import TaskLog

log = logging.getLogger(__name__)

_FRAME_TIMEOUT_S = 2  # a frame of the task channel arrives whole within this

__all__ = ["STOP_GRACE_S", "TaskProcess", "child_env", "spawn_host", "stop_all", "worker_end"]

#: How long a task may take to checkpoint and stop before it is killed: cleanup of any task
#: (a hung one too) ends within this, well inside 10 s of a detach or stop.
STOP_GRACE_S = 8.0
_POLL_S = 0.05
_REAP_S = 5.0  # a SIGKILLed process is gone at once; this only bounds the wait for its exit

OnMessage = Callable[["TaskProcess", dict[str, Any]], None]


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment plus ``extra``, with this freeride_lab importable first."""
    env = {**os.environ, **(extra or {})}
    root = str(Path(freeride_lab.__file__).resolve().parents[1])
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        env["PYTHONPATH"] = os.pathsep.join([root, *paths])
    return env


def worker_end(sock: socket.socket) -> Connection:
    """The worker's end of a task channel: a frame whose header promises more bytes than
    arrive within ``_FRAME_TIMEOUT_S`` fails the read instead of blocking the worker's loop."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", _FRAME_TIMEOUT_S, 0))
    return Connection(sock.detach())


def spawn_host(
    spec: HostSpec,
    *,
    env: Mapping[str, str] | None = None,
    log_path: Path | None = None,
    beacon: TaskBeacon | None = None,
) -> tuple[subprocess.Popen[bytes], Connection, TaskLog | None]:
    """Start a task process for ``spec``: its ``Popen``, the worker's end of its channel, and
    the ``TaskLog`` draining its output.

    Args:
        env: extra environment (the limits from ``limits.env_for`` and MPS client variables).
        log_path: file for the process's stdout/stderr (appended, capped: ``TaskLog``); None
            discards them.
        beacon: the beacon the host marks (its descriptor is handed over, then closed here).
    """
    ours, theirs = socket.socketpair()
    fds = [theirs.fileno()]
    spec = dataclasses.replace(spec, control_fd=fds[0])
    if beacon is not None:
        fds.append(beacon.fd)
        spec = dataclasses.replace(spec, beacon_fd=beacon.fd)
    task_log: TaskLog | None = None
    out: Any = subprocess.DEVNULL
    try:
        if log_path is not None:
            task_log = TaskLog.open(log_path)
            out = task_log.write_fd
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "freeride_lab.sidetasks.host",
                "--spec",
                json.dumps(spec.to_dict()),
            ],
            pass_fds=tuple(fds),
            env=child_env(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
        if beacon is not None:
            beacon.close_fd()
        if task_log is not None:
            task_log.close_write_end()
    return proc, worker_end(ours), task_log


class TaskProcess:
    """One task process as its worker sees it: the process, its channel and its last state."""

    def __init__(self, spec: TaskSpec) -> None:
        self.spec = spec
        self.proc: subprocess.Popen[bytes] | None = None
        self.conn: Connection | None = None
        self.state = SideTaskState.SUBMITTED
        self.mode = ""  # "iterative" | "imperative", once the host reported it
        self.sigstopped = False  # we sent SIGSTOP and owe a SIGCONT
        self.busy = False  # a stop or restart is under way: the edge thread keeps off
        self.kill_reason = ""  # why the worker killed it, for the FAILED event
        self.paused = threading.Event()  # imperative: the host paused cooperatively
        self.continued_ns = 0  # monotonic time of our last SIGCONT (the watchdog counts from it)
        self.beacon: TaskBeacon | None = None  # the host's marks (sidetasks.heartbeat)
        self.log: TaskLog | None = None
        # acks not yet taken by a request; those of plain sends (activate, preempt) pile up
        # until the next request clears them, so only the latest are kept
        self._acks: collections.deque[dict[str, Any]] = collections.deque(maxlen=64)
        self.last_reply = ""  # the message of the ack the last request got ("" for none)

    @property
    def task_id(self) -> str:
        return self.spec.task_id

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(
        self, host: HostSpec, *, env: Mapping[str, str] | None = None, log_path: Path | None = None
    ) -> None:
        """Start a (new) task process for ``host``; state goes back to SUBMITTED."""
        self.close_channel()
        if self.beacon is not None:
            self.beacon.close()
        self.beacon = TaskBeacon.create()
        self.proc, self.conn, self.log = spawn_host(
            host, env=env, log_path=log_path, beacon=self.beacon
        )
        self.state = SideTaskState.SUBMITTED
        self.mode = ""
        self.sigstopped = False
        self.continued_ns = 0
        self.kill_reason = ""

    def send(self, message: dict[str, Any]) -> bool:
        """Send one command; False if the process is gone."""
        if self.conn is None:
            return False
        try:
            self.conn.send_bytes(json.dumps(message).encode())
        except OSError:
            return False
        return True

    def receive(self) -> dict[str, Any] | None:
        """Read one message (call when ``conn`` is readable); None at end of file or on junk."""
        if self.conn is None:
            return None
        try:
            message = decode_host_message(self.conn.recv_bytes(MAX_FRAME_BYTES))
        except (EOFError, OSError):  # gone, a frame over the cap, or one cut short
            self.close_channel()
            return None
        except MessageError as exc:
            log.warning("task %s: ignored a bad message: %s", self.task_id, exc)
            return None
        kind = message.get("type")
        if kind == "state" and message.get("accepted"):
            self.state = SideTaskState(message["state"])
            self.mode = str(message.get("mode", self.mode))
        elif kind == "ack":
            self._acks.append(message)
        elif kind == "paused":
            self.paused.set()
        return message

    def request(
        self,
        message: dict[str, Any],
        *,
        timeout_s: float = 30.0,
        on_message: OnMessage | None = None,
    ) -> bool:
        """Send a command and wait for its ack, handing other messages to ``on_message``.

        A stopped process is continued first. Returns the ack's ``ok`` (False on timeout or
        when the process went away); its message is kept in ``last_reply``.
        """
        if self.sigstopped:
            self.signal(signal.SIGCONT)
        self._acks.clear()
        self.last_reply = ""
        if not self.send(message):
            return False
        deadline = time.monotonic() + timeout_s
        while not self._acks:
            remaining = deadline - time.monotonic()
            if self.conn is None or remaining <= 0:
                return False
            if self.conn.poll(min(0.05, remaining)):
                got = self.receive()
                if got is not None and got.get("type") != "ack" and on_message is not None:
                    on_message(self, got)
            elif not self.alive:
                return False
        ack = self._acks.popleft()
        self.last_reply = str(ack.get("message", ""))
        return bool(ack.get("ok"))

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the process (no-op once it exited); tracks SIGSTOP/SIGCONT."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.kill(self.proc.pid, signum)
        except ProcessLookupError:
            return
        if signum == signal.SIGCONT:
            self.continued_ns = time.monotonic_ns()
        if signum in (signal.SIGSTOP, signal.SIGCONT):
            self.sigstopped = signum == signal.SIGSTOP

    def kill(self, reason: str) -> None:
        """SIGKILL the process and its descendants; ``reason`` becomes its FAILED reason (the
        first reason given sticks)."""
        self.kill_reason = self.kill_reason or reason
        if self.alive:
            assert self.proc is not None
            kill_tree(self.proc.pid)

    def wait_exit(self, grace_s: float) -> None:
        """Wait for the process to exit, killing it after ``grace_s``."""
        if self.proc is None:
            return
        if self.sigstopped:
            self.signal(signal.SIGCONT)
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            log.warning("task %s did not exit within %.1f s; killing it", self.task_id, grace_s)
            self.kill(f"killed: did not stop within {grace_s:.1f} s")
            self.proc.wait()

    def stop(
        self,
        reason: str = "stopped",
        *,
        grace_s: float = STOP_GRACE_S,
        on_message: OnMessage | None = None,
    ) -> None:
        """Ask the task to checkpoint and stop, wait for the process, kill it after ``grace_s``
        (counted from now, the ack included). Idempotent: an exited process is left alone."""
        stop_all([self], reason, grace_s=grace_s, on_message=on_message)

    def __enter__(self) -> TaskProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.close_channel()

    def drain(self) -> list[dict[str, Any]]:
        """Messages still queued on the channel (a process's last words after it exited)."""
        out: list[dict[str, Any]] = []
        while self.conn is not None and self.conn.poll(0):
            message = self.receive()
            if message is not None:
                out.append(message)
        return out

    def close_channel(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def describe(self, *, active: bool) -> dict[str, Any]:
        """This task as the worker's status lists it (``active``: it holds the bubbles)."""
        return {
            "task_id": self.task_id,
            "name": self.spec.display_name,
            "state": str(self.state),
            "mode": self.mode,
            "pid": self.pid,
            "active": active,
            "gating": self.spec.gating,
            "limits": self.spec.limits.to_dict(),
        }

    def close(self) -> None:
        """Close the channel and unmap the beacon (the process is gone or someone else's)."""
        self.close_channel()
        if self.beacon is not None:
            self.beacon.close()

    def __repr__(self) -> str:
        where = "not started" if self.proc is None else f"pid={self.proc.pid}"
        return f"<TaskProcess({self.task_id!r}, {self.state}, {where})>"


def stop_all(
    tasks: Iterable[TaskProcess],
    reason: str,
    *,
    grace_s: float = STOP_GRACE_S,
    on_message: OnMessage | None = None,
) -> None:
    """Ask every live task to checkpoint and stop, all at once, serve their messages while they
    do, and kill (with their descendants) those still running ``grace_s`` from now.

    A task the worker stopped with SIGSTOP is continued first; one that cannot act on the
    command (a step that never returns) is killed at the deadline, so cleanup never takes
    longer than ``grace_s`` however many tasks there are.
    """
    tasks = list(tasks)
    deadline = time.monotonic() + grace_s

    def forward(task: TaskProcess, message: dict[str, Any] | None) -> None:
        """Pass on what the caller serves: not acks and states, which ``receive`` took in."""
        if on_message is None or message is None or message.get("type") in ("ack", "state"):
            return
        on_message(task, message)

    for task in tasks:
        if task.alive and not is_terminal(task.state):
            if task.sigstopped:
                task.signal(signal.SIGCONT)
            task.send({"cmd": "stop", "reason": reason})
    while True:
        running = [t for t in tasks if t.alive]
        remaining = deadline - time.monotonic()
        if not running or remaining <= 0:
            break
        channels = {t.conn: t for t in running if t.conn is not None}
        if not channels:  # every channel has closed: wait for the processes themselves
            with contextlib.suppress(subprocess.TimeoutExpired):
                running[0].proc.wait(min(_POLL_S, remaining))  # type: ignore[union-attr]
            continue
        for ready in wait_for(list(channels), timeout=min(_POLL_S, remaining)):
            task = channels[ready]  # type: ignore[index]
            forward(task, task.receive())
    for task in tasks:
        if task.alive:
            log.warning("task %s did not stop within %g s; killing it", task.task_id, grace_s)
            task.kill(f"killed: did not stop within {grace_s:g} s ({reason})")
        task.wait_exit(_REAP_S)
        # its last words: a process that exits right after its STOPPED state is not alive
        # when the loop above looks again, with the state still queued on its channel
        for message in task.drain():
            forward(task, message)
