"""A bubble that outlives its predicted end: how much longer it may last, from its slot's past.

A rank announces each bubble with a prediction made before it began (FreeRide's minimum of the
slot's last five, say); a side task stops launching steps once the next one would not end
before it. A bubble still open past that point has told the task something the prediction
did not know: it is not one of the slot's short ones. ``SurvivorLengths`` keeps the slot's
recent lengths as the side task saw them and answers, for a bubble that has lasted a while,
how long it is now taken to last, from the lengths longer than that: the survivors ([Note:
survivors' minimum]), and, where that is too close for a step, from when there is room.

[Note: survivors' minimum]
The minimum of the last k lengths is the unconditional rule: a step starts only if every
recent bubble of the slot would still have held it. Once the bubble has lasted e, the bubbles
that ended before e are out of the question, and the same rule over the rest, the survivors,
says how far this one goes: start + min{L_i : L_i > e}. On a slot whose bubbles are of two
kinds (a short one when a peer is early, a long one otherwise) the minimum of five predicts the
short kind; the survivors' minimum, once the short length has passed, predicts the long kind,
and the task fills it.

Most slots are not of two kinds: their lengths spread over a few milliseconds around a median
(the peers' jitter), the rank's minimum sits at the low end, and the survivors' minimum sits
just above e, never a step away. ``max_early`` loosens the rule to a low quantile of the
survivors: a step may start where up to that share of them would have ended before it
(the minimum over the rest). A step launched on it overruns in about that share of the
bubbles that reach it, by part of one step, so the share fits short steps (a graph
iteration's 0.2 ms) and costs more with long ones; the guard in force then decides, with this
end, as with the rank's (``core.budget.should_step``). Two more limits: an answer needs at
least ``min_survivors`` kept lengths longer than e (the fewer, the less they say), and lengths
older than the last ``k`` say nothing.

When the end is too close for a step, the next moment it can change is when the shortest
survivor passes: the answer's earliest time is e or one of the kept lengths, and a host sleeps
until then instead of polling.

    >>> s = SurvivorLengths(k=8, min_survivors=2, max_early=0.0)
    >>> for length in (5, 50, 5, 52, 51):
    ...     s.observe(0, length)
    >>> s.room_after(0, 1, guard_ns=2)    # all five outlast 1 ns: the shortest, 5, has room
    (1, 5)
    >>> s.room_after(0, 4, guard_ns=2)    # 5 is too close: wait it out, then 50
    (5, 50)
    >>> s.room_after(0, 51, guard_ns=0) is None   # one survivor says too little
    True
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

from freeride_lab.core.bubble_prediction import check_counts, check_length

__all__ = ["SurvivorLengths"]


class SurvivorLengths:
    """Per slot, the last ``k`` bubble lengths; for a bubble that has lasted a while, how long
    it is taken to last from those longer than that ([Note: survivors' minimum]).

    Args:
        k: lengths kept per slot.
        min_survivors: how many kept lengths must be longer than the time the bubble has
            lasted for an answer (1 takes the word of a single past bubble).
        max_early: the share of those survivors that may end before a step planned on the
            answer does (0: none, the survivors' minimum); in [0, 1).
    """

    __slots__ = ("_lengths", "k", "max_early", "min_survivors")

    def __init__(self, k: int = 16, *, min_survivors: int = 3, max_early: float = 0.2) -> None:
        check_counts(k=k, min_survivors=min_survivors)
        if min_survivors > k:
            raise ValueError(
                f"min_survivors={min_survivors} > k={k}: no slot could ever answer; keep more "
                "lengths or ask for fewer survivors"
            )
        if isinstance(max_early, bool) or not (
            isinstance(max_early, int | float) and 0 <= max_early < 1
        ):
            raise ValueError(
                f"max_early={max_early!r} must be a share in [0, 1): 0 plans to the shortest "
                "survivor, 0.2 lets one in five end before the step"
            )
        self.k = k
        self.min_survivors = min_survivors
        self.max_early = float(max_early)
        self._lengths: dict[Hashable, deque[int]] = {}

    def observe(self, slot: Hashable, duration_ns: int) -> None:
        """Record one bubble of ``slot`` that lasted ``duration_ns``."""
        check_length(slot, duration_ns)
        lengths = self._lengths.get(slot)
        if lengths is None:
            lengths = self._lengths[slot] = deque(maxlen=self.k)
        lengths.append(int(duration_ns))

    def end_after(self, slot: Hashable, elapsed_ns: int) -> int | None:
        """How long a bubble of ``slot`` that has lasted ``elapsed_ns`` is taken to last: of
        the kept lengths longer than that (the survivors), the shortest once the
        ``max_early`` share of them is set aside; None with fewer than ``min_survivors``."""
        ahead = sorted(x for x in self._lengths.get(slot, ()) if x > elapsed_ns)
        if len(ahead) < self.min_survivors:
            return None
        return ahead[int(self.max_early * len(ahead))]

    def room_after(self, slot: Hashable, elapsed_ns: int, guard_ns: int) -> tuple[int, int] | None:
        """Where a step that needs more than ``guard_ns`` fits in a bubble of ``slot`` that has
        lasted ``elapsed_ns``: (from, length), the earliest time since the bubble's start, not
        before ``elapsed_ns``, at which ``end_after`` is more than ``guard_ns`` away, and that
        end; None if there is no such time before too few survivors are left. Between two
        kept lengths the end stays and time runs towards it, so the earliest time is
        ``elapsed_ns`` or the moment a kept length passes.

            >>> s = SurvivorLengths(k=8, min_survivors=2, max_early=0.0)
            >>> for length in (12, 60, 12, 61):
            ...     s.observe(0, length)
            >>> s.room_after(0, 4, guard_ns=2)    # 12 is 8 away: now, until 12
            (4, 12)
            >>> s.room_after(0, 11, guard_ns=2)   # 12 is too close: from 12, until 60
            (12, 60)
            >>> s.room_after(0, 59, guard_ns=2) is None
            True
        """
        at = elapsed_ns
        while True:
            end = self.end_after(slot, at)
            if end is None:
                return None
            if end - at > guard_ns:
                return at, end
            at = min(x for x in self._lengths[slot] if x > at)  # the next to pass

    def __repr__(self) -> str:
        return (
            f"SurvivorLengths(k={self.k}, min_survivors={self.min_survivors}, "
            f"max_early={self.max_early:g}, slots={len(self._lengths)})"
        )
