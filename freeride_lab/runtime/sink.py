"""``EventSink``: a process's non-blocking outlet for events.

The caller (a training rank's hot path) only appends to an in-memory queue; a daemon thread
writes JSON lines to the process's event file (the source of truth) and forwards the same bytes
to the session's live bus when one is configured. If the queue is full the event is dropped and
counted (``dropped``) — training never waits on telemetry.

    sink = EventSink.for_rank(RunDir(path), rank)      # file + the bus named in run.json
    sink.emit(ActionTimed(...))                        # never blocks
    sink.close()                                       # writes the rest, then stops
"""

from __future__ import annotations

import collections
import logging
import threading
from pathlib import Path

from freeride_lab.core.events import Event, to_json
from freeride_lab.runtime.bus import BusAddress, BusPublisher
from freeride_lab.runtime.rundir import RunDir

log = logging.getLogger(__name__)

__all__ = ["EventSink"]


class EventSink:
    """Append-only event writer with a bounded queue and a background writer thread.

    Args:
        path: the event file (appended to; created with its parent directory).
        bus: ``(address, secret)`` of the session's ``BusServer``; None writes the file only.
            Bus trouble never slows the file: see ``BusPublisher``.
    """

    def __init__(
        self,
        path: Path,
        *,
        bus: tuple[BusAddress, bytes] | None = None,
        capacity: int = 1_000_000,
        flush_interval_s: float = 0.05,
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.capacity = capacity
        self.dropped = 0
        self._queue: collections.deque[str] = collections.deque()
        self._wake = threading.Event()
        self._closed = False
        self._flush_interval_s = flush_interval_s
        self._file = open(self.path, "ab")  # noqa: SIM115 - closed in close()
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

    def emit(self, event: Event) -> bool:
        """Queue an event; returns False (and counts it) if it had to be dropped."""
        if self._closed or len(self._queue) >= self.capacity:
            self.dropped += 1
            return False
        self._queue.append(to_json(event))
        return True

    def flush(self) -> None:
        """Ask the writer to write what is queued now (does not wait)."""
        self._wake.set()

    def close(self, timeout_s: float = 5.0) -> None:
        """Write everything queued, then stop the writer. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        self._thread.join(timeout_s)
        self._drain()
        self._file.close()
        if self._publisher is not None:
            self._publisher.close(min(timeout_s, 1.0))

    def __repr__(self) -> str:
        return (
            f"<EventSink {self.path.name} queued={len(self._queue)} dropped={self.dropped}"
            f" bus={'on' if self._publisher else 'off'}>"
        )

    def _drain(self) -> None:
        lines: list[str] = []
        while self._queue:
            lines.append(self._queue.popleft())
        if not lines or self._file.closed:
            return
        payload = ("\n".join(lines) + "\n").encode()
        self._file.write(payload)
        self._file.flush()
        offset, self._offset = self._offset, self._offset + len(payload)
        if self._publisher is not None:
            self._publisher.publish(offset, payload)

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self._flush_interval_s)
            self._wake.clear()
            try:
                self._drain()
            except Exception:  # a full disk must not take the trainer down
                log.exception("event sink %s failed to write", self.path)
                self.dropped += len(self._queue)
                self._queue.clear()
