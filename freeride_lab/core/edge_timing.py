"""When will the next bubble start? A per-slot clock of training's compute between bubbles.

A side task that sleeps until a bubble's start edge wakes tens of microseconds late (a wake-up
through the kernel on a VM costs 40-70 µs before any Python runs). Training is periodic, though:
after bubble k of a step ends, the rank computes for about as long as it did after bubble k of
the previous steps. ``NextBubbleClock`` learns those compute gaps per slot from the edges the
reader sees and predicts the next start, so the reader can sleep until just before it and check
the edge file in a short spin across the predicted moment (``EdgeReader.wait(spin_s=)``) instead
of waiting to be woken.

    >>> clock = NextBubbleClock()
    >>> clock.bubble_ended(slot=0, end_ns=1_000)
    >>> clock.next_start_ns() is None  # nothing learned yet
    True
    >>> clock.bubble_started(start_ns=4_000, previous_slot=0, previous_end_ns=1_000)
    >>> clock.bubble_ended(slot=0, end_ns=11_000)
    >>> clock.next_start_ns()  # 3 µs of compute followed slot 0 last time
    14000

Pure: no clock of its own, no I/O.
"""

from __future__ import annotations

from collections import deque

__all__ = ["NextBubbleClock"]


class NextBubbleClock:
    """Predicts the start of the next bubble from the compute gaps seen after each slot.

    Args:
        history: gaps kept per slot; the prediction takes their minimum, so it errs early
            (a spin that starts a little early costs CPU, one that starts late costs latency).
    """

    def __init__(self, history: int = 4) -> None:
        if history < 1:
            raise ValueError(f"history={history} must be >= 1")
        self.history = history
        self._gaps: dict[int, deque[int]] = {}
        self._ended: tuple[int, int] | None = None  # (slot, end_ns) of the last bubble that ended

    def __repr__(self) -> str:
        known = {slot: min(gaps) for slot, gaps in sorted(self._gaps.items())}
        return f"<NextBubbleClock min gap ns by slot={known} ended={self._ended}>"

    def bubble_started(
        self, *, start_ns: int, previous_slot: int, previous_end_ns: int | None
    ) -> None:
        """A bubble began at ``start_ns``; the last one before it was ``previous_slot``, which
        ended at ``previous_end_ns`` (None before any ended)."""
        self._ended = None
        if previous_end_ns is None or previous_slot < 0 or start_ns < previous_end_ns:
            return
        gaps = self._gaps.setdefault(previous_slot, deque(maxlen=self.history))
        gaps.append(start_ns - previous_end_ns)

    def bubble_ended(self, *, slot: int, end_ns: int) -> None:
        """Bubble ``slot`` ended at ``end_ns``: training computes until the next one."""
        self._ended = (slot, end_ns)

    def next_start_ns(self) -> int | None:
        """When the next bubble should start; None inside a bubble or before the gap after
        the last ended slot was ever seen."""
        if self._ended is None:
            return None
        slot, end_ns = self._ended
        gaps = self._gaps.get(slot)
        if not gaps:
            return None
        return end_ns + min(gaps)
