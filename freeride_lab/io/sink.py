"""``EventSink``: a process's non-blocking outlet for events.

The caller (a training rank's hot path) only appends the event to an in-memory queue; a daemon
thread turns events into JSON lines (off the training thread: a rank emits dozens a step), writes
them to the process's event file (the source of truth) and forwards the same bytes to the
session's live bus when one is configured. If the queue is full the event is dropped and
counted (``dropped``) — training never waits on telemetry.

    sink = EventSink.for_rank(RunDir(path), rank)      # file + the bus named in run.json
    sink.emit(ActionTimed(...))                        # never blocks
    sink.close()                                       # writes the rest, then stops

[Note: a full disk]
A write that fails (ENOSPC, EIO, a quota) never reaches the caller. The file is cut back to its
last whole line, so readers never see a torn one, and the lines are kept in a backlog of at most
``backlog_bytes``; the writer retries every ``retry_s`` and, once the disk has room again, writes
the backlog and resumes. Only what does not fit in the backlog is dropped, and counted in
``dropped``. The bus gets lines only after they are in the file, so the bus and the file keep the
same byte offsets (see ``freeride_lab.io.bus``): during an outage the session sees no new
events, then all of them at once.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time
from pathlib import Path

from freeride_lab.core.events import Event, to_json
from freeride_lab.io.bus import BusAddress, BusPublisher
from freeride_lab.io.rundir import RunDir, open_append

log = logging.getLogger(__name__)

__all__ = ["EventSink"]


class EventSink:
    """Append-only event writer with a bounded queue and a background writer thread.

    Args:
        path: the event file (appended to; created with its parent directory).
        bus: ``(address, secret)`` of the session's ``BusServer``; None writes the file only.
            Bus trouble never slows the file: see ``BusPublisher``.
        backlog_bytes: lines kept while the file cannot be written (see [Note: a full disk]).
        retry_s: seconds between two attempts to write the file after a failed one.
    """

    def __init__(
        self,
        path: Path,
        *,
        bus: tuple[BusAddress, bytes] | None = None,
        capacity: int = 1_000_000,
        flush_interval_s: float = 0.05,
        backlog_bytes: int = 8 << 20,
        retry_s: float = 1.0,
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.capacity = capacity
        self.backlog_bytes = backlog_bytes
        self.retry_s = retry_s
        self.dropped = 0  # events lost: the queue was full, or the backlog of a failing disk
        self.write_errors = 0  # failed attempts to write the file
        self.last_write_error = ""  # e.g. "[Errno 28] No space left on device"
        self._queue: collections.deque[Event] = collections.deque()  # frozen: safe to encode later
        self.encode_errors = 0  # events that could not be turned into JSON (dropped, counted)
        self._wake = threading.Event()
        self._closed = False
        self._flush_interval_s = flush_interval_s
        self._backlog = bytearray()  # whole lines not yet in the file
        self._backlog_lines = 0
        self._failing = False
        self._retry_at = 0.0  # monotonic time of the next attempt while failing
        # unbuffered: a failed write leaves nothing behind in a buffer to be written later
        self._file = os.fdopen(open_append(self.path), "ab", buffering=0)  # closed in close()
        self._offset = self._file.tell()  # byte offset of the next line (see bus wire format)
        self._publisher: BusPublisher | None = None
        if bus is not None:
            try:
                self._publisher = BusPublisher(bus[0], bus[1], source=self.path.name)
            except ValueError as e:  # e.g. a file name the bus cannot carry: the file still works
                log.warning("event sink %s: no live bus (%s)", self.path, e)
        self._thread = threading.Thread(
            target=self._run, name=f"event-sink:{self.path.name}", daemon=True
        )
        self._thread.start()

    @classmethod
    def for_rank(cls, run_dir: RunDir, rank: int, *, worker: bool = False) -> EventSink:
        """The sink of rank ``rank`` (or of its side-task worker), wired to the run's bus."""
        path = run_dir.worker_events(rank) if worker else run_dir.rank_events(rank)
        return cls.in_run(run_dir, path)

    @classmethod
    def in_run(cls, run_dir: RunDir, path: Path) -> EventSink:
        """A sink for any event file of the run (``events/<name>.jsonl``), wired to its bus.

        The bus address comes from run.json (``"bus": {"address": [host, port]}``) and the
        secret from the run directory; without them the sink writes the file only.
        """
        return cls(path, bus=cls._bus_of(run_dir))

    @staticmethod
    def _bus_of(run_dir: RunDir) -> tuple[BusAddress, bytes] | None:
        try:
            address = run_dir.read_run().get("bus", {}).get("address")
            secret = run_dir.secret()
        except (OSError, ValueError) as e:
            log.warning("no live bus for %s (%s); events go to the files only", run_dir.path, e)
            return None
        if not address:
            return None
        return (str(address[0]), int(address[1])), secret

    @property
    def bus_dropped(self) -> int:
        """Batches not delivered to the bus (they are still in the file)."""
        return self._publisher.dropped_batches if self._publisher is not None else 0

    @property
    def unwritten(self) -> int:
        """Events held back because the file could not be written (0 while writes succeed)."""
        return self._backlog_lines

    def emit(self, event: Event) -> bool:
        """Queue an event; returns False (and counts it) if it had to be dropped."""
        if self._closed or len(self._queue) >= self.capacity:
            self.dropped += 1
            return False
        self._queue.append(event)
        return True

    def flush(self) -> None:
        """Ask the writer to write what is queued now (does not wait)."""
        self._wake.set()

    def close(self, timeout_s: float = 5.0) -> None:
        """Write everything queued (one last try if the disk is failing), then stop. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        self._thread.join(timeout_s)
        self._drain(force=True)
        if self._backlog_lines:
            log.warning(
                "event sink %s: closing with %d event(s) unwritten (%s); they are lost",
                self.path,
                self._backlog_lines,
                self.last_write_error,
            )
            self.dropped += self._backlog_lines
            self._backlog, self._backlog_lines = bytearray(), 0
        self._file.close()
        if self._publisher is not None:
            self._publisher.close(min(timeout_s, 1.0))

    def __repr__(self) -> str:
        return (
            f"<EventSink {self.path.name} queued={len(self._queue)} dropped={self.dropped}"
            f" unwritten={self._backlog_lines} bus={'on' if self._publisher else 'off'}>"
        )

    def _drain(self, *, force: bool = False) -> None:
        lines: list[str] = []
        while self._queue:
            event = self._queue.popleft()
            try:
                lines.append(to_json(event))
            except (TypeError, ValueError):  # e.g. a payload JSON cannot carry
                self.dropped += 1
                self.encode_errors += 1
                if self.encode_errors == 1:
                    log.exception("event sink %s: cannot encode %r; dropped", self.path, event)
        if self._file.closed:
            return
        if lines:
            chunk = ("\n".join(lines) + "\n").encode()
            if self._backlog_lines and len(self._backlog) + len(chunk) > self.backlog_bytes:
                self.dropped += len(lines)  # the file still fails and the backlog is full
            else:
                self._backlog += chunk
                self._backlog_lines += len(lines)
        if not self._backlog_lines or (self._failing and not force and not self._retry_due()):
            return
        payload = bytes(self._backlog)
        try:
            self._write_all(payload)
        except OSError as e:
            self._write_failed(e)
            self._trim_backlog()
            return
        if self._failing:
            log.warning(
                "event sink %s: writing again after %d failed attempt(s); %d event(s) dropped",
                self.path,
                self.write_errors,
                self.dropped,
            )
            self._failing = False
        lines_written = self._backlog_lines
        self._backlog, self._backlog_lines = bytearray(), 0
        offset, self._offset = self._offset, self._offset + len(payload)
        if self._publisher is not None and lines_written:
            self._publisher.publish(offset, payload)

    def _trim_backlog(self) -> None:
        """Keep the oldest whole lines that fit ``backlog_bytes``; drop and count the rest.

        What one drain hands over goes into the backlog whole while writes succeed (it is about
        to be written), so after the write that failed the backlog may be over its size."""
        if len(self._backlog) <= self.backlog_bytes:
            return
        cut = self._backlog.rfind(b"\n", 0, self.backlog_bytes) + 1  # 0: not one line fits
        kept = self._backlog.count(b"\n", 0, cut)
        self.dropped += self._backlog_lines - kept
        del self._backlog[cut:]
        self._backlog_lines = kept

    def _retry_due(self) -> bool:
        return time.monotonic() >= self._retry_at

    def _write_all(self, payload: bytes) -> None:
        view = memoryview(payload)
        while view:
            written = self._file.write(view)
            if not written:  # a regular file never does this; do not spin
                raise OSError(f"wrote nothing of {len(view)} bytes to {self.path}")
            view = view[written:]

    def _write_failed(self, error: OSError) -> None:
        """Cut the file back to its last whole line and retry later (see [Note: a full disk])."""
        self.write_errors += 1
        self.last_write_error = str(error)
        self._retry_at = time.monotonic() + self.retry_s
        with contextlib.suppress(OSError):  # cutting a file frees space; it works on a full disk
            os.ftruncate(self._file.fileno(), self._offset)
        if not self._failing:
            log.warning(
                "event sink %s: cannot write (%s); keeping up to %d MiB of events and retrying "
                "every %.1f s, training goes on",
                self.path,
                error,
                self.backlog_bytes >> 20,
                self.retry_s,
            )
        self._failing = True

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self._flush_interval_s)
            self._wake.clear()
            try:
                self._drain()
            except Exception:  # nothing here may take the trainer down
                log.exception("event sink %s failed to write", self.path)
                self.dropped += len(self._queue)
                self._queue.clear()
