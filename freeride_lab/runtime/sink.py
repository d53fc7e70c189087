"""``EventSink``: a process's non-blocking outlet for events.

The caller (a training rank's hot path) only appends to an in-memory queue; a daemon thread
writes JSON lines to the process's event file (the source of truth) and forwards them to the
session's live bus when one is configured. If the queue is full the event is dropped and
counted (``dropped``) — training never waits on telemetry.
"""

from __future__ import annotations

import collections
import logging
import threading
from pathlib import Path

from freeride_lab.core.events import Event, to_json

log = logging.getLogger(__name__)

__all__ = ["EventSink"]


class EventSink:
    """Append-only event writer with a bounded queue and a background writer thread."""

    def __init__(self, path: Path, *, capacity: int = 1_000_000, flush_interval_s: float = 0.05) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.capacity = capacity
        self.dropped = 0
        self._queue: collections.deque[str] = collections.deque()
        self._wake = threading.Event()
        self._closed = False
        self._flush_interval_s = flush_interval_s
        self._file = open(self.path, "a", buffering=1 << 16)  # noqa: SIM115 - closed in close()
        self._listeners: list[object] = []
        self._thread = threading.Thread(target=self._run, name=f"event-sink:{self.path.name}", daemon=True)
        self._thread.start()

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

    def _drain(self) -> list[str]:
        lines: list[str] = []
        while self._queue:
            lines.append(self._queue.popleft())
        if lines and not self._file.closed:
            self._file.write("\n".join(lines) + "\n")
            self._file.flush()
        return lines

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
