"""Bubble-length prediction with feedback, and a replay that scores any predictor on a trace.

A rank announces each bubble with its predicted end; a side task starts a step only if it fits
before that end, and stops launching once the bubble is seen to end. A prediction that is too
short leaves the bubble's tail empty; one that is too long lets the last step run into
training's compute. FreeRide predicts the minimum of a slot's last five lengths
(``core.bubbles.SlotPredictor(k=5, method="min")``): one short outlier sets the next five
predictions, and a slot whose lengths are steady still misses about one bubble in six (a new
length below the five before it), without ever learning from it.

``FeedbackSlotPredictor`` closes that loop ([Note: miss-rate feedback]). ``replay`` runs any
predictor over recorded lengths, as a rank would, and scores it (``ReplayScore``): how much of
the idle time a prediction let a task plan for, and how far and how often it promised more
than the bubble held.

[Note: miss-rate feedback]
Per slot the predictor keeps the last ``k`` lengths and predicts their ``q``-th percentile, q
starting at ``q0``. Each new length is checked against the prediction made for it: a *miss*
(the bubble was shorter than predicted) lowers that slot's q by ``gain x (1 - target_miss)``
points, a hit raises it by ``gain x target_miss``. q therefore settles where misses happen at
the rate ``target_miss`` (a Robbins-Monro quantile tracker), within [0, ``q_max``]: a steady
slot climbs towards longer predictions and uses more of each bubble, a jittery one sinks
towards its minimum, and a slot whose bubbles shorten is corrected by its own misses instead
of by a fixed window. Only q is learnt; the lengths it indexes are always the last ``k``.

The defaults aim at one miss in ten, about half of what min-of-5 misses on a steady slot. The
gain is small on purpose: a large one throws q against 0 after every miss, and the clamp then
swallows part of the correction, so misses run above the target (on a steady slot with 4 ms
bubbles and 30 µs jitter: 10.1% at gain 2, 14% at gain 20; ``tests/core``).

    >>> p = FeedbackSlotPredictor(k=8, q0=10.0)
    >>> p.predict("a") is None
    True
    >>> for d in (100, 100, 100, 100):
    ...     p.observe("a", d)
    >>> p.predict("a")
    100
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "FeedbackSlotPredictor",
    "Predictor",
    "ReplayScore",
    "check_counts",
    "check_length",
    "percentile_of_sorted",
    "predictions",
    "replay",
    "score",
]


class Predictor(Protocol):
    """What a rank asks of a bubble-length predictor (``core.bubbles.SlotPredictor`` is one)."""

    def observe(self, slot: Hashable, duration_ns: int) -> None: ...

    def predict(self, slot: Hashable) -> int | None: ...


@dataclass(slots=True)
class _Slot:
    lengths: deque[int]
    q: float
    pending: int | None = None  # the prediction made for the next length, not yet checked


class FeedbackSlotPredictor:
    """Per-slot bubble length as a percentile of its last ``k`` lengths, the percentile moved
    by the predictions' own misses (see [Note: miss-rate feedback]).

    Args:
        k: lengths kept per slot.
        q0: the percentile a slot starts at.
        target_miss: the share of bubbles that may end before their prediction.
        gain: points of percentile per unit of error (a miss moves q down by
            ``gain x (1 - target_miss)``, a hit up by ``gain x target_miss``).
        q_max: the highest percentile a slot may reach.
    """

    __slots__ = ("_slots", "gain", "k", "q0", "q_max", "target_miss")

    def __init__(
        self,
        k: int = 16,
        *,
        q0: float = 10.0,
        target_miss: float = 0.1,
        gain: float = 2.0,
        q_max: float = 50.0,
    ) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k={k!r} must be an integer >= 1 (lengths kept per slot)")
        if not 0 < target_miss < 1:
            raise ValueError(f"target_miss={target_miss} must be in (0, 1); e.g. 0.05 = 5%")
        if not (math.isfinite(gain) and gain > 0):
            raise ValueError(f"gain={gain} must be > 0 (percentile points per unit of error)")
        if not 0 <= q0 <= q_max <= 100:
            raise ValueError(f"need 0 <= q0={q0} <= q_max={q_max} <= 100 (percentiles)")
        self.k = k
        self.q0 = float(q0)
        self.target_miss = float(target_miss)
        self.gain = float(gain)
        self.q_max = float(q_max)
        self._slots: dict[Hashable, _Slot] = {}

    def observe(self, slot: Hashable, duration_ns: int) -> None:
        """Record one measured bubble of ``slot`` (ns) and learn from the prediction made
        for it, if there was one."""
        check_length(slot, duration_ns)
        s = self._slots.get(slot)
        if s is None:
            s = self._slots[slot] = _Slot(deque(maxlen=self.k), self.q0)
        if s.pending is not None:
            missed = duration_ns < s.pending
            step = -(1.0 - self.target_miss) if missed else self.target_miss
            s.q = min(self.q_max, max(0.0, s.q + self.gain * step))
            s.pending = None
        s.lengths.append(int(duration_ns))

    def predict(self, slot: Hashable) -> int | None:
        """Predicted duration of ``slot``'s next bubble in ns; None before its first length."""
        s = self._slots.get(slot)
        if s is None or not s.lengths:
            return None
        s.pending = percentile_of_sorted(sorted(s.lengths), s.q)
        return s.pending

    def percentile(self, slot: Hashable) -> float | None:
        """The percentile ``slot`` predicts at now; None for a slot never seen."""
        s = self._slots.get(slot)
        return None if s is None else s.q

    def __repr__(self) -> str:
        return (
            f"FeedbackSlotPredictor(k={self.k}, q0={self.q0:g}, target_miss="
            f"{self.target_miss:g}, gain={self.gain:g}, q_max={self.q_max:g}, "
            f"slots={len(self._slots)})"
        )


def check_counts(**counts: object) -> None:
    """Refuse any of ``counts`` that is not an integer >= 1 (ValueError naming it)."""
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be an integer >= 1")


def check_length(slot: Hashable, duration_ns: int) -> None:
    """Refuse a negative bubble length (ValueError naming the slot and the fix)."""
    if duration_ns < 0:
        raise ValueError(
            f"duration_ns={duration_ns} < 0 for slot {slot!r}; pass end_ns - start_ns of "
            "the idle gap"
        )


def percentile_of_sorted(values: Sequence[int], q: float) -> int:
    """The ``q``-th percentile of sorted, non-empty ``values`` (linear interpolation, floored
    to whole ns); ``core.bubbles.SlotPredictor`` uses it too."""
    at = (len(values) - 1) * q / 100.0
    lo = math.floor(at)
    hi = min(lo + 1, len(values) - 1)
    return math.floor(values[lo] + (values[hi] - values[lo]) * (at - lo))


@dataclass(frozen=True, slots=True)
class ReplayScore:
    """How a predictor did over a trace (durations in ms; bubbles it could not predict yet,
    a slot's first, are left out of every figure).

    Attributes:
        bubbles: bubbles predicted.
        idle_ms: their summed lengths.
        planned_ms: sum of min(prediction, length): the idle time a task could plan steps for.
        over_ms: sum of max(0, prediction - length): how far predictions promised more than
            the bubbles held (a step planned to the prediction runs that far into compute).
        misses: bubbles shorter than their prediction.
    """

    bubbles: int
    idle_ms: float
    planned_ms: float
    over_ms: float
    misses: int

    @property
    def planned_frac(self) -> float:
        return self.planned_ms / self.idle_ms if self.idle_ms > 0 else math.nan

    @property
    def over_frac(self) -> float:
        return self.over_ms / self.idle_ms if self.idle_ms > 0 else math.nan

    @property
    def miss_frac(self) -> float:
        return self.misses / self.bubbles if self.bubbles else math.nan


def predictions(predictor: Predictor, trace: Iterable[tuple[Hashable, int]]) -> list[int | None]:
    """Run ``predictor`` over ``trace``, (slot, length in ns) in the order a rank meets them,
    predicting each bubble before learning its length, as the rank does; the predictions
    (None where the slot had no length yet)."""
    out = []
    for slot, length in trace:
        out.append(predictor.predict(slot))
        predictor.observe(slot, length)
    return out


def score(predicted: Sequence[int | None], lengths: Sequence[int]) -> ReplayScore:
    """How ``predicted`` did against the ``lengths`` it was made for (see ``ReplayScore``)."""
    bubbles = misses = 0
    idle_ns = planned_ns = over_ns = 0
    for p, length in zip(predicted, lengths, strict=True):
        if p is None:
            continue
        bubbles += 1
        idle_ns += length
        planned_ns += min(p, length)
        over_ns += max(0, p - length)
        misses += p > length
    return ReplayScore(bubbles, idle_ns / 1e6, planned_ns / 1e6, over_ns / 1e6, misses)


def replay(predictor: Predictor, trace: Iterable[tuple[Hashable, int]]) -> ReplayScore:
    """``predictions`` over ``trace``, scored.

    >>> from freeride_lab.core.bubbles import SlotPredictor
    >>> s = replay(SlotPredictor(k=2), [("a", 4_000_000), ("a", 2_000_000), ("a", 3_000_000)])
    >>> (s.bubbles, s.planned_ms, s.over_ms, s.misses)
    (2, 4.0, 2.0, 1)
    """
    trace = list(trace)
    return score(predictions(predictor, trace), [length for _, length in trace])
