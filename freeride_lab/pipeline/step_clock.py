"""``StepClock``: run-clock stamps for a training rank, read without stalling the device.

On CPU a stamp is the host clock (``time.time_ns() + clock_offset_ns``) and a step's record is
ready at once. On CUDA a stamp is a timing-enabled CUDA event recorded on the current stream:
recording costs a few microseconds and never waits. A step's stamps are turned into run-clock
times only once its last stamp has completed on the device, checked with a non-blocking
``query()`` after the next step is queued, so the host never waits for the device to read them.

    clock = StepClock(device="cuda:0", clock_offset_ns=offset)
    start = clock.begin_step()          # the step's first stamp (and, rarely, a re-anchor)
    ... work ...; end = clock.stamp()
    clock.defer(end, lambda resolve: (resolve(start), resolve(end)))
    for start_ns, end_ns in clock.ready():   # the steps whose events have completed
        ...
    clock.flush()                       # at the end: waits for the rest

[Note: anchoring CUDA events to the host clock]
An event only says how far it lies from another event (``elapsed_time``). One device
synchronisation pins a reference event to the host clock: right after it the device is idle,
so an event recorded then completes within microseconds of being recorded, and its host time
is the midpoint of the record call. Every later event is that anchor plus its distance from the
reference. ``elapsed_time`` is a float32 of milliseconds, whose resolution is 2 µs at 30 s and
degrades with the distance, and the device timer may drift from the host clock, so the clock
re-anchors every ``resync_s`` (30 s): one ``torch.cuda.synchronize`` at a step start per 30 s,
instead of two per step. Each re-anchor measures how far the old anchor had drifted
(``max_drift_ns``).
"""

from __future__ import annotations

import collections
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

log = logging.getLogger(__name__)

__all__ = ["StepClock"]

T = TypeVar("T")

Resolve = Callable[[Any], int]


@dataclass(frozen=True, slots=True)
class _Anchor:
    ref: Any  # a CUDA event recorded on an idle device
    host_ns: int  # its run-clock time


@dataclass(slots=True)
class _Pending(Generic[T]):
    last: Any  # the stamp whose completion makes every stamp of the step readable
    anchor: _Anchor | None
    build: Callable[[Resolve], T]
    events: list[Any]


class StepClock:
    """Run-clock stamps (host on CPU, CUDA events on CUDA) resolved off the critical path.

    Args:
        device: the rank's device; CUDA turns on event stamps.
        clock_offset_ns: added to the host clock to give the run clock (rank 0's).
        resync_s: on CUDA, re-anchor the events to the host clock this often (one device
            synchronisation each; see [Note: anchoring CUDA events to the host clock]).
        blocking: create blocking-sync events, so that a thread waiting on one with
            ``synchronize()`` sleeps instead of spinning.
        reuse_events: recycle a step's events once it is resolved, except those another
            thread (a bubble-edge watcher) holds (``hold``/``release``).
    """

    def __init__(
        self,
        device: torch.device | str = "cpu",
        clock_offset_ns: int = 0,
        *,
        resync_s: float = 30.0,
        blocking: bool = False,
        reuse_events: bool = True,
    ) -> None:
        self.device = torch.device(device)
        self.is_cuda = self.device.type == "cuda"
        self.clock_offset_ns = clock_offset_ns
        self.resync_s = resync_s
        self.blocking = blocking
        self.reuse_events = reuse_events
        self.resyncs = 0
        self.max_drift_ns = 0
        self._anchor: _Anchor | None = None
        self._anchored_at = -math.inf
        self._pending: collections.deque[_Pending[Any]] = collections.deque()
        self._events: list[Any] = []  # stamped since the last ``defer``
        self._free: list[Any] = []
        self._held: set[int] = set()  # ids of events another thread still waits on

    def __repr__(self) -> str:
        return (
            f"StepClock(device={str(self.device)!r}, pending={len(self._pending)}, "
            f"resyncs={self.resyncs})"
        )

    @property
    def pending(self) -> int:
        """Deferred steps not yet handed out by ``ready``/``flush``."""
        return len(self._pending)

    def now_ns(self) -> int:
        """The run clock now (host)."""
        return time.time_ns() + self.clock_offset_ns

    def stamp(self) -> Any:
        """This moment: run-clock ns on CPU, a recorded CUDA event on CUDA (never waits)."""
        if not self.is_cuda:
            return time.time_ns() + self.clock_offset_ns
        free = self._free
        event = free.pop() if free else self._new_event()
        event.record()
        self._events.append(event)
        return event

    def hold(self, stamp: Any) -> None:
        """Keep ``stamp``'s event out of recycling until ``release``: another thread waits on
        it. A held event whose step is resolved meanwhile is dropped, never reused."""
        if self.is_cuda:
            self._held.add(id(stamp))

    def release(self, stamp: Any) -> None:
        """The other thread is done with ``stamp`` (any thread may call this)."""
        self._held.discard(id(stamp))

    def begin_step(self) -> Any:
        """The first stamp of a step. On CUDA, re-anchors first when ``resync_s`` has passed."""
        if self.is_cuda and time.monotonic() - self._anchored_at >= self.resync_s:
            self._reanchor()
        return self.stamp()

    def defer(self, last: Any, build: Callable[[Resolve], T]) -> None:
        """Queue a step: once ``last`` (its final stamp) has completed, ``ready`` returns
        ``build(resolve)``, where ``resolve(stamp)`` gives a stamp's run-clock ns."""
        events, self._events = self._events, []
        self._pending.append(_Pending(last, self._anchor, build, events))

    def ready(self) -> list[Any]:
        """The deferred steps whose stamps have all completed, oldest first (never waits)."""
        return self._collect(wait=False)

    def flush(self) -> list[Any]:
        """Every deferred step, waiting for the device if it must (end of training)."""
        return self._collect(wait=True)

    # -- internals -------------------------------------------------------------------------

    def _new_event(self) -> Any:
        return torch.cuda.Event(enable_timing=True, blocking=self.blocking)  # type: ignore[no-untyped-call]

    def _collect(self, *, wait: bool) -> list[Any]:
        out: list[Any] = []
        while self._pending:
            item = self._pending[0]
            if self.is_cuda:
                if wait:
                    item.last.synchronize()
                elif not item.last.query():
                    break
            self._pending.popleft()
            out.append(item.build(self._resolver(item.anchor)))
            if self.is_cuda and self.reuse_events:
                held = self._held
                self._free.extend(e for e in item.events if id(e) not in held)
        return out

    def _resolver(self, anchor: _Anchor | None) -> Resolve:
        if anchor is None:
            return int
        ref, host_ns = anchor.ref, anchor.host_ns
        return lambda event: host_ns + round(float(ref.elapsed_time(event)) * 1e6)

    def _reanchor(self) -> None:
        """Pin a fresh reference event to the host clock (one device synchronisation)."""
        torch.cuda.synchronize(self.device)
        ref = self._new_event()
        before = self.now_ns()
        ref.record()
        after = self.now_ns()
        ref.synchronize()
        anchor = _Anchor(ref, (before + after) // 2)
        old = self._anchor
        if old is not None:  # how far the old anchor had drifted from the host clock
            predicted = old.host_ns + round(float(old.ref.elapsed_time(ref)) * 1e6)
            drift = predicted - anchor.host_ns
            self.max_drift_ns = max(self.max_drift_ns, abs(drift))
            if abs(drift) > 100_000:
                log.warning("CUDA event clock drifted %d µs from the host clock", drift // 1000)
        self._anchor = anchor
        self._anchored_at = time.monotonic()
        self.resyncs += 1
