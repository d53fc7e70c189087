"""A bubble that outlives its predicted end: how much longer it may last, from its slot's past.

A rank announces each bubble with a prediction made before it began (FreeRide's minimum of the
slot's last five, say); a side task stops launching steps once the next one would not end
before it. A bubble still open past that point has told the task something the prediction
did not know: it is not one of the slot's short ones. ``SurvivorLengths`` keeps the slot's
recent lengths as the side task saw them and answers, for a bubble that has lasted
``elapsed_ns``, with the shortest of those lengths that are longer than that, the survivors'
minimum ([Note: survivors' minimum]), and, where that is too close for a step, when the next
one will be.

[Note: survivors' minimum]
The minimum of the last k lengths is the unconditional rule: a step starts only if every
recent bubble of the slot would still have held it. Once the bubble has lasted e, the bubbles
that ended before e are out of the question, and the same rule over the rest, the survivors,
says how far this one goes: start + min{L_i : L_i > e}. On a slot whose bubbles are of two
kinds (a short one when a peer is early, a long one otherwise) the minimum of five predicts the
short kind; the survivors' minimum, once the short length has passed, predicts the long kind,
and the task fills it. On a steady slot the survivors sit just above e and add little, which
is what the task should do there.

A step launched on that answer overruns when the bubble ends before it, as one launched on the
rank's prediction does when the bubble is shorter than predicted. Two limits keep that rare:
an answer needs at least ``min_survivors`` recent lengths longer than e (the fewer there are,
the less one of them says), and it never comes from lengths older than the last ``k``.
``core.budget.should_step`` then decides with it as it does with the rank's prediction.

    >>> s = SurvivorLengths(k=8, min_survivors=2)
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

from freeride_lab.core.bubble_prediction import check_length

__all__ = ["SurvivorLengths"]


class SurvivorLengths:
    """Per slot, the last ``k`` bubble lengths; for a bubble that has lasted a while, the
    shortest of them longer than that ([Note: survivors' minimum]).

    Args:
        k: lengths kept per slot.
        min_survivors: how many kept lengths must be longer than the time the bubble has
            lasted for an answer (1 takes the word of a single past bubble).
    """

    __slots__ = ("_lengths", "k", "min_survivors")

    def __init__(self, k: int = 16, *, min_survivors: int = 3) -> None:
        for name, value in (("k", k), ("min_survivors", min_survivors)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be an integer >= 1")
        if min_survivors > k:
            raise ValueError(
                f"min_survivors={min_survivors} > k={k}: no slot could ever answer; keep more "
                "lengths or ask for fewer survivors"
            )
        self.k = k
        self.min_survivors = min_survivors
        self._lengths: dict[Hashable, deque[int]] = {}

    def observe(self, slot: Hashable, duration_ns: int) -> None:
        """Record one bubble of ``slot`` that lasted ``duration_ns``."""
        check_length(slot, duration_ns)
        lengths = self._lengths.get(slot)
        if lengths is None:
            lengths = self._lengths[slot] = deque(maxlen=self.k)
        lengths.append(int(duration_ns))

    def room_after(self, slot: Hashable, elapsed_ns: int, guard_ns: int) -> tuple[int, int] | None:
        """Where a step that needs more than ``guard_ns`` fits in a bubble of ``slot`` that has
        lasted ``elapsed_ns``: (from, length), the earliest time since the bubble's start, not
        before ``elapsed_ns``, at which the survivors' minimum (the shortest kept length longer
        than that time) is more than ``guard_ns`` away, and that minimum; None if no such time
        comes before too few survivors are left. A survivor too close for a step is waited
        out: once it has passed, the next one is the minimum.

            >>> s = SurvivorLengths(k=8, min_survivors=2)
            >>> for length in (12, 60, 12, 61):
            ...     s.observe(0, length)
            >>> s.room_after(0, 4, guard_ns=2)    # 12 is 8 away: now, until 12
            (4, 12)
            >>> s.room_after(0, 11, guard_ns=2)   # 12 is too close: from 12, until 60
            (12, 60)
            >>> s.room_after(0, 59, guard_ns=2) is None
            True
        """
        lengths = self._lengths.get(slot)
        if lengths is None:
            return None
        ahead = sorted(length for length in lengths if length > elapsed_ns)
        at = elapsed_ns
        for i, length in enumerate(ahead):
            if length <= at:
                continue  # passed with an equal one before it
            if len(ahead) - i < self.min_survivors:
                return None
            if length - at > guard_ns:
                return at, length
            at = length  # too close: wait it out
        return None

    def __repr__(self) -> str:
        return (
            f"SurvivorLengths(k={self.k}, min_survivors={self.min_survivors}, "
            f"slots={len(self._lengths)})"
        )
