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

# [Note: spin window]
The prediction is the shortest recent gap, so a start comes at or after it; how far after is
the gap's jitter, which a fixed spin around the prediction does not know: a spin shorter than
the jitter misses most starts and the reader pays the wake-up after all. The clock therefore
also keeps, per slot, how late each start came against the prediction it held for it (the
value ``bubble_started`` returns), and ``spin_window`` spans from ``lead_ns`` before the
prediction to the 90th percentile of that slot's recent lateness after it (at least
``lead_ns``), never longer than ``most_ns`` in all: a reader that spins across it sees nine
starts in ten without a wake-up, at the price of spinning about as long as the jitter.

Pure: no clock of its own, no I/O.
"""

from __future__ import annotations

import math
from collections import deque

__all__ = ["NextBubbleClock"]


class NextBubbleClock:
    """Predicts the start of the next bubble from the compute gaps seen after each slot.

    Args:
        history: gaps kept per slot; the prediction takes their minimum, so it errs early
            (a spin that starts a little early costs CPU, one that starts late costs latency).
        lateness_history: how late starts came against their predictions, kept per slot
            for ``spin_window`` ([Note: spin window]).
    """

    def __init__(self, history: int = 4, lateness_history: int = 16) -> None:
        if history < 1:
            raise ValueError(f"history={history} must be >= 1")
        if lateness_history < 1:
            raise ValueError(f"lateness_history={lateness_history} must be >= 1")
        self.history = history
        self.lateness_history = lateness_history
        self._gaps: dict[int, deque[int]] = {}
        self._late: dict[int, deque[int]] = {}  # slot -> start minus its prediction, ns
        self._ended: tuple[int, int] | None = None  # (slot, end_ns) of the last bubble that ended

    def __repr__(self) -> str:
        known = {slot: min(gaps) for slot, gaps in sorted(self._gaps.items())}
        return f"<NextBubbleClock min gap ns by slot={known} ended={self._ended}>"

    def bubble_started(
        self, *, start_ns: int, previous_slot: int, previous_end_ns: int | None
    ) -> int | None:
        """A bubble began at ``start_ns``; the last one before it was ``previous_slot``, which
        ended at ``previous_end_ns`` (None before any ended). Returns the start this clock
        predicted for it, None if it held none (nothing learned yet, or the end it predicted
        from is not the one the bubble followed: an edge was missed)."""
        predicted = self.next_start_ns()
        ended, self._ended = self._ended, None
        if ended != (previous_slot, previous_end_ns):
            predicted = None
        if previous_end_ns is None or previous_slot < 0 or start_ns < previous_end_ns:
            return predicted
        gaps = self._gaps.setdefault(previous_slot, deque(maxlen=self.history))
        gaps.append(start_ns - previous_end_ns)
        if predicted is not None:
            late = self._late.setdefault(previous_slot, deque(maxlen=self.lateness_history))
            late.append(start_ns - predicted)
        return predicted

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

    def spin_window(self, lead_ns: int, most_ns: int) -> tuple[int, int] | None:
        """Where to spin for the next start, (from, until) on the clock the edges use: from
        ``lead_ns`` before the predicted start to the 90th percentile of the slot's recent
        lateness after it (at least ``lead_ns`` after), at most ``most_ns`` long ([Note: spin
        window]); None when no start is predicted.

            >>> clock = NextBubbleClock()
            >>> for k, late in enumerate([0, 0, 900, 0, 400]):  # 10 µs gaps, some late
            ...     end = 100_000 * k
            ...     clock.bubble_ended(slot=0, end_ns=end)
            ...     _ = clock.bubble_started(start_ns=end + 10_000 + late, previous_slot=0,
            ...                              previous_end_ns=end)
            >>> clock.bubble_ended(slot=0, end_ns=1_000_000)
            >>> clock.next_start_ns()
            1010000
            >>> clock.spin_window(lead_ns=300, most_ns=5_000)
            (1009700, 1010900)
            >>> clock.spin_window(lead_ns=300, most_ns=1_000)  # at most 1 µs of spinning
            (1009700, 1010700)
        """
        predicted = self.next_start_ns()
        if predicted is None:
            return None
        assert self._ended is not None
        late = self._late.get(self._ended[0])
        after = lead_ns
        if late:
            ranked = sorted(late)
            after = max(lead_ns, ranked[math.ceil(0.9 * len(ranked)) - 1])
        start = predicted - lead_ns
        return start, start + min(most_ns, lead_ns + after)
