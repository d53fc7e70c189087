"""A bubble that outlives its predicted end: how much longer it may last, from its slot's past.

A rank announces each bubble with a prediction made before it began (FreeRide's minimum of the
slot's last five, say); a side task stops launching steps once the next one would not end
before it. A bubble still open past that point has told the task something the prediction
did not know: it is not one of the slot's short ones. ``SurvivorLengths`` keeps the slot's
recent lengths as the side task saw them and answers, for a bubble that has lasted
``elapsed_ns``, with the shortest of those lengths that are longer than that: the survivors'
minimum ([Note: survivors' minimum]).

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
the answer needs at least ``min_survivors`` recent lengths longer than e (the fewer there are,
the less one of them says), and it never comes from lengths older than the last ``k``.
``core.budget.should_step`` then decides with it as it does with the rank's prediction.

    >>> s = SurvivorLengths(k=8, min_survivors=2)
    >>> for length in (5, 50, 5, 52, 51):
    ...     s.observe(0, length)
    >>> s.length_after(0, 3)      # all five outlast 3: the shortest, 5
    5
    >>> s.length_after(0, 6)      # past the short kind: the long ones remain
    50
    >>> s.length_after(0, 51) is None   # one survivor says too little
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

    def length_after(self, slot: Hashable, elapsed_ns: int) -> int | None:
        """The shortest recent length of ``slot`` longer than ``elapsed_ns``: how long a bubble
        of it that has lasted ``elapsed_ns`` is taken to last; None when fewer than
        ``min_survivors`` recent lengths are longer (or the slot is new)."""
        lengths = self._lengths.get(slot)
        if lengths is None:
            return None
        longer = [length for length in lengths if length > elapsed_ns]
        return min(longer) if len(longer) >= self.min_survivors else None

    def __repr__(self) -> str:
        return (
            f"SurvivorLengths(k={self.k}, min_survivors={self.min_survivors}, "
            f"slots={len(self._lengths)})"
        )
