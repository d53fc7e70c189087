"""Live bubble edges of a training rank: what receives them, what was announced, and the
thread that announces them on CUDA once the device reaches them.

``ActionRecorder`` (``pipeline.timed_stage``) decides which gaps to announce ([Note: quiet
slots] there); ``_EdgeTracker`` calls the receiver and keeps the record, and on CUDA
``_CudaEdgeWatcher`` waits for each edge's event with the GIL released, then hands it to the
tracker. Errors in the receiver are counted, never raised into training.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

log = logging.getLogger(__name__)

__all__ = ["BubbleEdges", "EdgeRecord"]


class BubbleEdges(Protocol):
    """Receiver of live bubble edges (the side-task worker's shared-memory channel)."""

    def bubble_start(
        self, step: int, slot: int, t_ns: int, predicted_end_ns: int | None
    ) -> None: ...

    def bubble_end(self, step: int, slot: int, t_ns: int) -> None: ...


@dataclass(frozen=True, slots=True)
class EdgeRecord:
    """A bubble edge as it was announced: ``edge`` "start" (with prediction) or "end"."""

    step: int
    slot: int
    edge: Literal["start", "end"]
    t_ns: int
    predicted_end_ns: int | None = None


class _EdgeTracker:
    """Announces bubble slots to ``edges`` and keeps a record of what it announced.

    Used by one thread at a time (the main thread on CPU, the watcher thread on CUDA); the
    prediction comes with each ``open``, made on the main thread. Errors in ``edges`` are logged
    once and counted, never raised.
    """

    def __init__(self, edges: BubbleEdges) -> None:
        self.edges = edges
        self.records: collections.deque[EdgeRecord] = collections.deque(maxlen=100_000)
        self.errors = 0
        self._open: tuple[int, int, int] | None = None  # (step, slot, start_ns)

    def open(self, step: int, slot: int, t_ns: int, duration_ns: int | None) -> None:
        predicted_end = None if duration_ns is None else t_ns + int(duration_ns)
        try:
            self.edges.bubble_start(step, slot, t_ns, predicted_end)
        except Exception:
            self.error("bubble_start")
        self._open = (step, slot, t_ns)
        self.records.append(EdgeRecord(step, slot, "start", t_ns, predicted_end))

    def close(self, t_ns: int) -> None:
        if self._open is None:
            return
        step, slot, _ = self._open
        self._open = None
        try:
            self.edges.bubble_end(step, slot, t_ns)
        except Exception:
            self.error("bubble_end")
        self.records.append(EdgeRecord(step, slot, "end", t_ns))

    def error(self, where: str) -> None:
        """Count a failure of ``where``; log the first."""
        self.errors += 1
        if self.errors == 1:
            log.exception("bubble edge %s failed; further errors are only counted", where)


class _CudaEdgeWatcher:
    """Daemon thread that turns recorded CUDA events into live bubble edges as they complete.

    It waits on each event with ``synchronize()``, which releases the GIL; with the recorder's
    blocking-sync events the thread sleeps until the device reaches the event.
    """

    def __init__(
        self,
        tracker: _EdgeTracker,
        clock_offset_ns: int,
        release: Callable[[Any], None] = lambda event: None,
    ) -> None:
        self._tracker = tracker
        self._offset = clock_offset_ns
        self._release = release  # the event may be recycled once waited on
        self._queue: collections.deque[tuple[str, int, int, Any, int | None]] = collections.deque()
        self._wake = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="bubble-edge-watcher", daemon=True)
        self._thread.start()

    def push(
        self, edge: str, step: int, slot: int, event: Any, duration_ns: int | None = None
    ) -> None:
        """Queue an edge that happens when ``event`` completes (cheap; hot path); a start
        carries its predicted duration."""
        self._queue.append((edge, step, slot, event, duration_ns))
        self._wake.set()

    def close(self, timeout_s: float = 1.0) -> None:
        self._closed = True
        self._wake.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._closed:
            if not self._edge_queued():
                continue
            edge, step, slot, event, duration_ns = self._queue.popleft()
            event.synchronize()  # GIL released while waiting
            self._announce(edge, step, slot, event, duration_ns)

    def _edge_queued(self) -> bool:
        """True when an edge waits in the queue; otherwise sleep until one is pushed (at most
        0.1 s, so that ``close`` is noticed) and return False."""
        if self._queue:
            return True
        self._wake.wait(0.1)
        self._wake.clear()
        return False

    def _announce(
        self, edge: str, step: int, slot: int, event: Any, duration_ns: int | None
    ) -> None:
        """Hand an edge whose ``event`` has completed to the tracker, stamped now on the run
        clock, and give the event back for reuse."""
        t_ns = time.time_ns() + self._offset
        self._release(event)
        if edge == "start":
            self._tracker.open(step, slot, t_ns, duration_ns)
        else:
            self._tracker.close(t_ns)
