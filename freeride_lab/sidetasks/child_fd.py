"""``ChildFd``: a descriptor this process holds only until a child process has inherited it.

A task process inherits two descriptors from its worker: the beacon's memory file and the write
end of its output pipe. The worker must close its own copy once the child is started (a pipe
whose write end stays open in the worker never shows the reader the end of the output), and
asking for the descriptor after that is a bug worth a clear error rather than a stale number.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["ChildFd"]


class ChildFd:
    """An open descriptor to pass to a child, and the one ``close`` that drops it here.

    Args:
        fd: the descriptor (owned from now on).
        closed_message: the ``RuntimeError`` message for ``fd`` asked after ``close``.
    """

    def __init__(self, fd: int, *, closed_message: str) -> None:
        self._fd: int | None = fd
        self._closed_message = closed_message

    @property
    def fd(self) -> int:
        """The descriptor, for ``pass_fds`` or ``stdout`` of the child (until ``close``)."""
        if self._fd is None:
            raise RuntimeError(self._closed_message)
        return self._fd

    def close(self) -> None:
        """Close this process's copy (idempotent; the child keeps its own)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
