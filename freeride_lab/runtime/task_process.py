"""``TaskProcess``: the worker's handle on one task process (``python -m ...task_host``).

    proc = TaskProcess(spec)
    proc.start(HostSpec(task=spec, run_dir=..., rank=0, stage=0), env=env_for(limits, ...))
    proc.request({"cmd": "activate"})        # sends, then serves its messages until the ack
    proc.signal(signal.SIGSTOP)              # imperative tasks outside bubbles
    proc.wait_exit(grace_s=15)               # kills it after the grace

Messages follow [Note: host protocol] in ``task_host``: JSON over a socketpair, never pickle.
``receive`` applies what concerns the handle itself (state, mode, acks, the imperative "paused")
and returns every message so the worker can act on the rest (hung steps).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import freeride_lab
from freeride_lab.core.sidetask_state import SideTaskState, is_terminal
from freeride_lab.runtime.taskspec import HostSpec, TaskSpec

log = logging.getLogger(__name__)

__all__ = ["TaskProcess", "child_env", "spawn_host"]


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment plus ``extra``, with this freeride_lab importable first."""
    env = {**os.environ, **(extra or {})}
    root = str(Path(freeride_lab.__file__).resolve().parents[1])
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        env["PYTHONPATH"] = os.pathsep.join([root, *paths])
    return env


def spawn_host(
    spec: HostSpec, *, env: Mapping[str, str] | None = None, log_path: Path | None = None
) -> tuple[subprocess.Popen[bytes], Connection]:
    """Start a task process for ``spec``; its ``Popen`` and the worker's end of its channel.

    Args:
        env: extra environment (the limits from ``limits.env_for`` and MPS client variables).
        log_path: file for the process's stdout/stderr (appended); None discards them.
    """
    ours, theirs = socket.socketpair()
    fd = theirs.fileno()
    spec = dataclasses.replace(spec, control_fd=fd)
    out: Any = subprocess.DEVNULL
    try:
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            out = open(log_path, "ab")  # noqa: SIM115 - closed below, the child keeps its copy
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "freeride_lab.runtime.task_host",
                "--spec",
                json.dumps(spec.to_dict()),
            ],
            pass_fds=(fd,),
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
        if out is not subprocess.DEVNULL:
            out.close()
    return proc, Connection(ours.detach())


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
        self.last_hung_step_ns = -1
        self._acks: collections.deque[dict[str, Any]] = collections.deque()

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
        self.proc, self.conn = spawn_host(host, env=env, log_path=log_path)
        self.state = SideTaskState.SUBMITTED
        self.mode = ""
        self.sigstopped = False
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
            message: dict[str, Any] = json.loads(self.conn.recv_bytes())
        except (EOFError, OSError):
            self.close_channel()
            return None
        except ValueError:
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
        on_message: Any = None,
    ) -> bool:
        """Send a command and wait for its ack, handing other messages to ``on_message``.

        A stopped process is continued first. Returns the ack's ``ok`` (False on timeout or
        when the process went away).
        """
        if self.sigstopped:
            self.signal(signal.SIGCONT)
        self._acks.clear()
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
        return bool(self._acks.popleft().get("ok"))

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the process (no-op once it exited); tracks SIGSTOP/SIGCONT."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.kill(self.proc.pid, signum)
        except ProcessLookupError:
            return
        if signum in (signal.SIGSTOP, signal.SIGCONT):
            self.sigstopped = signum == signal.SIGSTOP

    def kill(self, reason: str) -> None:
        """SIGKILL the process; ``reason`` becomes its FAILED reason."""
        self.kill_reason = reason
        if self.alive:
            assert self.proc is not None
            self.proc.kill()

    def wait_exit(self, grace_s: float) -> None:
        """Wait for the process to exit, killing it after ``grace_s``."""
        if self.proc is None:
            return
        if self.sigstopped:
            self.signal(signal.SIGCONT)
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            log.warning("task %s did not exit within %.0f s; killing it", self.task_id, grace_s)
            self.kill_reason = self.kill_reason or f"killed: did not stop within {grace_s:.0f} s"
            self.proc.kill()
            self.proc.wait()

    def stop(
        self, reason: str = "stopped", *, grace_s: float = 15.0, on_message: Any = None
    ) -> None:
        """Ask the task to checkpoint and stop, wait for the process, kill it after ``grace_s``.

        Idempotent: a process that already exited is left alone.
        """
        if self.alive and not is_terminal(self.state):
            self.request(
                {"cmd": "stop", "reason": reason}, timeout_s=grace_s, on_message=on_message
            )
        self.wait_exit(grace_s)

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

    def __repr__(self) -> str:
        where = "not started" if self.proc is None else f"pid={self.proc.pid}"
        return f"<TaskProcess({self.task_id!r}, {self.state}, {where})>"
