"""Wake-ups from an edge file's writer to its readers in other processes, through named pipes.

# [Note: edge wake-up]
Each reader owns a FIFO beside the edge file, ``<edge file>.wake/<token>.fifo``: it makes it
under a temporary name, opens it for reading, renames it into place (so the writer never finds
one that no reader holds yet) and then stores a fresh random token in the file's ``readers``
word. After each record the writer writes one byte to every reader's FIFO, never blocking; it
lists the FIFOs again only when the ``readers`` word differs from the one it saw at its last
listing. A reader checks the record; if nothing is new, it drains its FIFO, checks again and,
if still nothing is new, waits in ``select`` until its FIFO is readable: a byte written after
the drain stays there until the next drain, so no wake-up is lost (a new edge is returned
before any drain: ``edges`` [Note: no syscall before the edge]). A full FIFO (a reader that
has not waited for a long while) still wakes its reader; one whose reader has gone (EPIPE, or
ENXIO when opened) is closed and removed by the writer. ``interrupt`` writes a byte to the
reader's own FIFO, waking that reader only. Where no FIFO can be made (a file system without
them) a reader checks every 0.5 ms.

Plain POSIX (``os.mkfifo``, ``poll``), so no system call numbers and no ``ctypes``; a pipe
wakes one reader, so each reader has its own and the writer pays one non-blocking ``write``
per reader per edge. ``benchmarks/bench_edge_latency.py`` measures what a wake-up costs.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import secrets
import select
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["WakeReceiver", "WakeSender", "wake_dir"]

_FALLBACK_POLL_S = 0.0005
_FD_SETSIZE = 1024  # select() takes descriptors below this only
_SUFFIX = ".fifo"


def wake_dir(edge_file: Path) -> Path:
    """The folder of the readers' FIFOs of ``edge_file``."""
    return edge_file.with_name(edge_file.name + ".wake")


class WakeSender:
    """The writer's end: one byte to every reader's FIFO. Never blocks, never raises.

    Args:
        folder: ``wake_dir`` of the edge file.
        readers_word: reads the edge file's ``readers`` word (changed by each new reader).
    """

    def __init__(self, folder: Path, readers_word: Callable[[], int]) -> None:
        self._folder = folder
        self._readers_word = readers_word
        self._listed: int | None = None  # the word at the last listing; None: never listed
        self._fds: dict[str, int] = {}  # FIFO name -> write end

    @property
    def readers(self) -> int:
        """How many readers there are: those registered since the last listing are counted,
        one that has gone is dropped at the next ``wake_all``. Never raises."""
        self._relist()
        return len(self._fds)

    def wake_all(self) -> None:
        """Wake every reader waiting on the edge file (after a record is complete)."""
        try:
            self._relist()
            for name, fd in list(self._fds.items()):
                try:
                    os.write(fd, b"\0")
                except BlockingIOError:
                    pass  # the FIFO is full of unread wake-ups: its reader wakes anyway
                except OSError:  # EPIPE: its reader has gone
                    self._drop(name, unlink=True)
        except Exception:  # the training hot path: a wake-up lost costs a reader <= 0.25 s
            pass

    def close(self) -> None:
        """Close the write ends (the FIFOs stay for their readers). Idempotent."""
        for name in list(self._fds):
            self._drop(name, unlink=False)

    def _relist(self) -> None:
        """List the FIFOs again if a reader came since the last listing."""
        try:
            word = self._readers_word()
        except Exception:  # an unmapped file: nothing to list
            return
        if word != self._listed:
            self._listed = word
            self._list()

    def _list(self) -> None:
        try:
            names = {e.name for e in os.scandir(self._folder) if e.name.endswith(_SUFFIX)}
        except OSError:
            names = set()
        for name in set(self._fds) - names:
            self._drop(name, unlink=False)
        for name in names - set(self._fds):
            try:
                self._fds[name] = os.open(self._folder / name, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # no reader holds it: its reader has gone
                    with contextlib.suppress(OSError):
                        (self._folder / name).unlink()

    def _drop(self, name: str, *, unlink: bool) -> None:
        fd = self._fds.pop(name, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        if unlink:
            with contextlib.suppress(OSError):
                (self._folder / name).unlink()


class WakeReceiver:
    """A reader's end: its own FIFO, registered with the writer through ``set_readers_word``.

    Args:
        folder: ``wake_dir`` of the edge file (made if missing).
        set_readers_word: stores a new token in the edge file's ``readers`` word.
    """

    def __init__(self, folder: Path, set_readers_word: Callable[[int], None]) -> None:
        self._read_fd = -1
        self._write_fd = -1
        self._poll: select.poll | None = None
        self.path: Path | None = None
        token = secrets.randbits(63)
        tmp = folder / f".{token:016x}.tmp"
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.mkfifo(tmp, 0o600)
            self._read_fd = os.open(tmp, os.O_RDONLY | os.O_NONBLOCK)
            self._write_fd = os.open(tmp, os.O_WRONLY | os.O_NONBLOCK)  # for interrupt()
            path = folder / f"{token:016x}{_SUFFIX}"
            self._poll = select.poll()
            self._poll.register(self._read_fd, select.POLLIN)
            os.replace(tmp, path)
            self.path = path
        except OSError:  # no FIFOs here: poll instead
            self._close_fds()
            with contextlib.suppress(OSError):
                tmp.unlink()
            return
        set_readers_word(token)

    @property
    def available(self) -> bool:
        """True when the writer can wake this reader; False when it polls every 0.5 ms."""
        return self.path is not None

    def drain(self) -> None:
        """Consume the wake-ups received so far (before looking at the record)."""
        if self._read_fd < 0:
            return
        with contextlib.suppress(OSError):
            while len(os.read(self._read_fd, 4096)) == 4096:
                pass

    def sleep(self, timeout_s: float) -> None:
        """Wait until woken, at most ``timeout_s`` (may return early, never much later).

        ``select`` takes the timeout to the microsecond; ``poll`` takes whole milliseconds
        and rounds a fraction up, so a reader that sleeps until just before an edge it expects
        (``EdgeReader.wait(spin_s=)``) would wake up to a millisecond late, after the edge,
        and pay the wake-up it meant to spin past. ``poll`` is left for a descriptor beyond
        ``select``'s reach, asked for whole milliseconds rounded down.
        """
        if self._poll is None:
            time.sleep(min(timeout_s, _FALLBACK_POLL_S))
            return
        timeout_s = max(0.0, timeout_s)
        if self._read_fd < _FD_SETSIZE:
            select.select([self._read_fd], [], [], timeout_s)
        else:
            self._poll.poll(math.floor(timeout_s * 1000))

    def poke(self) -> None:
        """Wake this reader's ``sleep`` (from another thread of its process)."""
        if self._write_fd < 0:
            return
        with contextlib.suppress(OSError):
            os.write(self._write_fd, b"\0")

    def close(self) -> None:
        """Close and remove the FIFO. Idempotent."""
        self._close_fds()
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
            self.path = None

    def _close_fds(self) -> None:
        for fd in (self._read_fd, self._write_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._read_fd = self._write_fd = -1
        self._poll = None
