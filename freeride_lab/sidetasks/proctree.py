"""``kill_tree``: SIGKILL a process and everything it started, found by walking the process table.

Side-task processes stay in the process group of whoever launched the run (a notebook kernel's
group, so that stopping the kernel stops them), so a hung one cannot be killed with ``killpg``
without killing its siblings; its descendants (data-loader workers, a worker's task processes)
are found through their parent links instead, before the kill, while those links still hold.
SIGKILL also ends a SIGSTOPped process.
"""

from __future__ import annotations

import contextlib
import logging
import signal

import psutil

log = logging.getLogger(__name__)

__all__ = ["kill_tree"]


def kill_tree(pid: int) -> list[int]:
    """SIGKILL ``pid`` and its descendants (children first); the pids that were signalled."""
    try:
        root = psutil.Process(pid)
    except psutil.Error:
        return []
    with contextlib.suppress(psutil.Error):
        root.send_signal(signal.SIGSTOP)  # no new children while the tree is walked
    try:
        family = [*root.children(recursive=True), root]
    except psutil.Error:
        family = [root]
    killed: list[int] = []
    for proc in family:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            continue
        except psutil.AccessDenied:
            log.warning("no permission to kill pid %d (a child of %d)", proc.pid, pid)
            continue
        killed.append(proc.pid)
    return killed
