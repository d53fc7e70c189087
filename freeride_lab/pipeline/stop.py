"""``StopControl``: how a training rank stops. SIGINT is ignored, SIGTERM is a graceful stop,
and the launcher's death counts as SIGTERM.

    stop = StopControl(grace_s=10)
    stop.install()                 # main thread, before training
    stop.on_abort = write_failure  # called if a stop is not honoured within grace_s
    ... if stop.requested.is_set(): finish the step and leave ...
    stop.done()                    # training loop ended: no abort
    stop.exit_within(10, code=0)   # what is left (closing the group) may not keep us alive
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["StopAgreement", "StopControl"]

_PR_SET_PDEATHSIG = 1


class StopControl:
    """SIGINT immunity, SIGTERM as a graceful stop, and a parent-death watchdog.

    A stop request sets ``requested``; the training loop stops at the next step boundary and
    calls ``done()``. If it has not within ``grace_s``, ``on_abort`` runs on a helper thread
    (it writes RankFailed) and the process exits with code 1.

    [Note: SIGTERM is handled off the main thread]
    Python runs signal handlers on the main thread between bytecodes, so a handler cannot run
    while the main thread waits inside a gloo/NCCL call (for a peer that died, say). The C-level
    handler does write the signal number to ``signal.set_wakeup_fd`` at once, though, so a
    helper thread reading that socket sees SIGTERM immediately and starts the grace timer.
    The Python-level handler does nothing: it exists so that SIGTERM does not kill the process.
    A handler that took a lock could interrupt the main thread inside that same lock (a second
    SIGTERM while the first was being recorded, the launcher's death signal right after a
    ``kill``) and deadlock it, and the whole pipeline with it.
    """

    def __init__(self, *, grace_s: float = 10.0, poll_parent_s: float = 1.0) -> None:
        self.grace_s = grace_s
        self.poll_parent_s = poll_parent_s
        self.requested = threading.Event()
        self.reason = ""
        self.on_abort: Callable[[str], None] | None = None
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._timer: threading.Thread | None = None
        self._parent_pid = os.getppid()

    def __repr__(self) -> str:
        return f"StopControl(requested={self.requested.is_set()}, reason={self.reason!r})"

    def install(self) -> None:
        """Install the handlers and watcher threads (call on the main thread)."""
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, _ignore_here)  # seen by the wakeup reader instead
        rsock, wsock = socket.socketpair()
        rsock.setblocking(True)
        wsock.setblocking(False)
        signal.set_wakeup_fd(wsock.fileno(), warn_on_full_buffer=False)
        self._sockets = (rsock, wsock)  # keep both alive
        threading.Thread(
            target=self._read_wakeups, args=(rsock,), name="sigterm-watch", daemon=True
        ).start()
        _set_parent_death_signal(signal.SIGTERM)
        threading.Thread(target=self._watch_parent, name="parent-watch", daemon=True).start()

    def request(self, reason: str) -> None:
        """Ask for a graceful stop (idempotent); starts the grace timer."""
        with self._lock:
            if self.requested.is_set():
                return
            self.reason = reason
            self.requested.set()
            self._timer = threading.Thread(
                target=self._abort_after_grace, name="stop-grace", daemon=True
            )
            self._timer.start()
        log.warning(
            "stop requested (%s); finishing the current step, grace %.1f s", reason, self.grace_s
        )

    def done(self) -> None:
        """The training loop has ended; the grace timer will not abort."""
        self._done.set()

    def exit_within(self, limit_s: float, *, code: int) -> None:
        """Leave with ``code`` if the process is still alive ``limit_s`` from now.

        Called once the outcome is recorded: releasing the process group can block for as long
        as the collective timeout when a peer or the rendezvous store went away with the
        launcher, and a rank that has said how it ended must not linger (the launcher may be
        gone and nobody would reap it).
        """

        def leave() -> None:
            time.sleep(limit_s)
            log.warning("still closing %.0f s after the end; exiting with code %d", limit_s, code)
            logging.shutdown()
            os._exit(code)

        threading.Thread(target=leave, name="exit-deadline", daemon=True).start()

    def _read_wakeups(self, rsock: socket.socket) -> None:
        while True:
            try:
                data = rsock.recv(64)
            except OSError:
                return
            if not data:
                return
            if signal.SIGTERM in data:
                self.request("SIGTERM")

    def _watch_parent(self) -> None:
        while not self._done.is_set():
            if os.getppid() != self._parent_pid:
                self.request(f"parent {self._parent_pid} died")
                return
            self._done.wait(self.poll_parent_s)

    def _abort_after_grace(self) -> None:
        if self._done.wait(self.grace_s):
            return
        message = (
            f"stopped by {self.reason}: the current step did not finish within "
            f"stop_grace_s={self.grace_s}; aborted"
        )
        log.error("%s", message)
        try:
            if self.on_abort is not None:
                self.on_abort(message)
        finally:
            os._exit(1)


def _ignore_here(signum: int, frame: FrameType | None) -> None:
    """SIGTERM's Python-level handler ([Note: SIGTERM is handled off the main thread])."""


def _set_parent_death_signal(sig: int) -> None:
    """Ask Linux to send ``sig`` when the parent exits (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            log.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
    except (OSError, AttributeError):
        log.warning("prctl unavailable; relying on the parent-pid watcher")


class StopAgreement:
    """Every rank learns of a stop request at the same step, without waiting for it.

    Each step, ``poll`` reads the result of the all-reduce it started one step earlier (done by
    now: a few bytes over a gloo group, on the host) and starts the next one. Every rank reads
    the same reduced flag at the same step, so all stop before the same step, one step after
    the request, and training never waits on the device or on its peers for it.

    Args:
        group: a gloo process group over all ranks (host tensors; no device sync).
    """

    def __init__(self, group: Any = None) -> None:
        self.group = group
        self._flag: Any = None
        self._work: Any = None

    def poll(self, requested: bool) -> bool:
        """Whether to stop now; ``requested`` is this rank's own request (collective)."""
        import torch
        import torch.distributed as dist

        if self._work is not None:
            self._work.wait()
            self._work = None
            if int(self._flag.item()):
                return True
        self._flag = torch.tensor([int(requested)], dtype=torch.int32)
        self._work = dist.all_reduce(
            self._flag, op=dist.ReduceOp.MAX, group=self.group, async_op=True
        )
        return False

    def finish(self) -> None:
        """Wait for the all-reduce in flight (every rank, at the end of training)."""
        work, self._work = self._work, None
        if work is not None:
            work.wait()
