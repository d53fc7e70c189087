"""Waiting for a child process to exit without polling: ``wait_exit(proc, timeout_s)``.

``subprocess.Popen.wait(timeout)`` polls: it sleeps 1, 2, 4, ... ms (at most 50) between
``waitpid`` calls, about eight wake-ups per 0.1 s. The processes that watch a run (the launcher
watching torchrun, the owner watching the launcher) wait like this for the whole run, on the
same cores as the training ranks. On Linux a pidfd becomes readable when the child exits, so
``wait_exit`` sleeps in the kernel until the child exits or the time is up: one wake-up per call.
Elsewhere (no ``os.pidfd_open``, or a kernel without it) it falls back to ``Popen.wait``.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess

__all__ = ["wait_exit"]


def wait_exit(
    proc: subprocess.Popen[bytes] | subprocess.Popen[str], timeout_s: float
) -> int | None:
    """``proc``'s exit code once it has exited, waiting at most ``timeout_s`` seconds; None if
    it is still running then. The child is reaped, as ``Popen.wait`` does."""
    if proc.returncode is not None:
        return proc.returncode
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd here, or the child is already reaped
        with contextlib.suppress(subprocess.TimeoutExpired):
            return proc.wait(timeout=max(0.0, timeout_s))
        return None
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.poll(max(0, round(timeout_s * 1000)))  # ms; a signal handler may end it early
    finally:
        os.close(fd)
    return proc.poll()
