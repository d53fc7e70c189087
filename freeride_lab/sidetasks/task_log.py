"""``TaskLog``: a task process's stdout and stderr, copied into its log file up to a cap.

    log = TaskLog.open(run_dir.logs_dir / "task-t1.log")   # a pipe and its reader thread
    subprocess.Popen(..., stdout=log.write_fd, stderr=subprocess.STDOUT)
    log.close_write_end()                                     # the child holds its own copy

A side task is user code, and user code may print without end. Its output goes through a pipe
to a thread of the worker that appends it to ``logs/task-<id>.log`` while the file is below
``cap_bytes`` (10 MB by default, counting what earlier processes of the same task wrote), then
writes one "output truncated" line and from there on only reads and counts: the task never
blocks on a full pipe, never dies of a file-size limit, and the disk, the kernel and training
never see the flood. When the task's output ends the dropped byte count is appended too, if it
still fits, and the worker logs it. Nothing is written past the cap.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from pathlib import Path

from freeride_lab.io.rundir import open_append
from freeride_lab.sidetasks.child_fd import ChildFd

log = logging.getLogger(__name__)

__all__ = ["TASK_LOG_CAP_BYTES", "TaskLog"]

TASK_LOG_CAP_BYTES = 10_000_000  # 10 MB of log per task, the notes below included
_NOTE_ROOM_BYTES = 512  # kept free below the cap for the two notes
_CHUNK_BYTES = 1 << 16


class TaskLog:
    """The reading end of one task process's output pipe and the thread that drains it.

    Args:
        path: the log file (appended to; created if missing).
        cap_bytes: the most the file may hold, from earlier processes of the task included.
    """

    def __init__(self, path: Path, read_fd: int, write_fd: int, *, cap_bytes: int) -> None:
        if cap_bytes <= _NOTE_ROOM_BYTES:
            raise ValueError(f"cap_bytes={cap_bytes} must be > {_NOTE_ROOM_BYTES}")
        self.path = path
        self.cap_bytes = cap_bytes
        self.written_bytes = 0  # of the task's output, in this process's lifetime
        self.dropped_bytes = 0
        self._read_fd = read_fd
        self._write_end = ChildFd(
            write_fd, closed_message="the write end is closed; only the task process holds it now"
        )
        self._thread = threading.Thread(target=self._drain, name="task-log", daemon=True)

    @classmethod
    def open(cls, path: Path, *, cap_bytes: int = TASK_LOG_CAP_BYTES) -> TaskLog:
        """A new pipe whose ``write_fd`` the task process gets as stdout; draining already."""
        path.parent.mkdir(parents=True, exist_ok=True)
        read_fd, write_fd = os.pipe()
        task_log = cls(path, read_fd, write_fd, cap_bytes=cap_bytes)
        task_log._thread.start()
        return task_log

    @property
    def write_fd(self) -> int:
        return self._write_end.fd

    def close_write_end(self) -> None:
        """Close this process's copy of the write end (after the child inherited it), so the
        thread sees the end of the output when the task's processes are gone."""
        self._write_end.close()

    def join(self, timeout_s: float) -> bool:
        """Wait for the output to end; whether it did."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _drain(self) -> None:
        out: int | None = None
        try:
            out = open_append(self.path)
            size = os.fstat(out).st_size
        except OSError as exc:
            log.warning("cannot write the task log %s (%s); its output is dropped", self.path, exc)
            size = self.cap_bytes
        room = max(0, self.cap_bytes - _NOTE_ROOM_BYTES - size)
        noted = False
        try:
            while chunk := os.read(self._read_fd, _CHUNK_BYTES):
                keep = chunk[:room]
                if keep and out is not None:
                    try:
                        os.write(out, keep)
                    except OSError as exc:  # disk full, say: drain on, write no more
                        log.warning("task log %s: %s; dropping the rest", self.path, exc)
                        room, keep = 0, b""
                room -= len(keep)
                self.written_bytes += len(keep)
                if len(keep) < len(chunk):
                    self.dropped_bytes += len(chunk) - len(keep)
                    if not noted:
                        noted = True
                        self._note(
                            out,
                            f"\n[freeride_lab] output truncated: this log keeps at most "
                            f"{self.cap_bytes:,} bytes per task; the rest is dropped and "
                            "counted\n",
                        )
        except OSError as exc:
            log.warning("reading the output of the task logging to %s: %s", self.path, exc)
        finally:
            if self.dropped_bytes:
                self._note(out, f"[freeride_lab] {self.dropped_bytes:,} bytes of output dropped\n")
                log.warning(
                    "task log %s truncated: %d bytes of output dropped",
                    self.path,
                    self.dropped_bytes,
                )
            with contextlib.suppress(OSError):
                os.close(self._read_fd)
            if out is not None:
                with contextlib.suppress(OSError):
                    os.close(out)

    def _note(self, out: int | None, text: str) -> None:
        """Append ``text`` if it fits below the cap."""
        if out is None:
            return
        data = text.encode()
        with contextlib.suppress(OSError):
            if os.fstat(out).st_size + len(data) <= self.cap_bytes:
                os.write(out, data)

    def __repr__(self) -> str:
        return (
            f"<TaskLog({str(self.path)!r}, written={self.written_bytes}, "
            f"dropped={self.dropped_bytes})>"
        )
