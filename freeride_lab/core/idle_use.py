"""Where a rank's idle time went: side-task work, or which of four kinds of leftover.

Harvest falls short of the idle time for different reasons, and each has its own remedy, so
a single "bubble use" share does not say what to fix. Every bubble's time is split into:

- ``covered``: a side-task step ran (steps are clipped to the bubble and merged);
- ``lead``: from the bubble's start to its first step (the bubble-edge wake-up and the step
  launch: faster edges shrink it);
- ``between``: between two steps of one bubble (the host's per-step round trip);
- ``tail``: after the last step's end, when the next step was predicted not to fit (finer
  steps shrink it; where the announcements carry their predicted end, ``tail_unpromised`` is
  the part after it: the bubble outlasted its prediction, and only a better predictor reaches
  that part);
- ``unused``: bubbles where no step ran at all (too short for any step, not announced, or the
  task was paused; a lower announce threshold or smaller steps shrink it).

The five parts sum to the bubbles' total, so each is a share of the measured idle time. The
unused part is split further when the caller knows the task's shortest step (``fit_ms``) and
which bubbles the rank announced (``announced``): ``unused_fit`` is the unused bubbles a step
that short would have fitted (the rest were too short for any step: only finer steps reach
them), and ``unused_silent`` the part of those no announcement overlapped (the rank never
told the host: a lower announce threshold or a better prediction reaches them; the announced
rest the host saw and left). Where the announcements carry their predicted end, ``unused_short``
is the part of the announced ones whose prediction left less than the shortest step (the
predictor stands in the way). Where they also carry the guard the host held them to (the
smallest step's, which a bubble's predicted length must exceed for any step),
``unused_guard`` is the part of the rest whose every prediction left no more than that guard:
the guard, not the predictor, stands in the way. The announced rest was predicted long enough
for a step and its guard, and left by the host; where the caller knows when a host was busy
with something else (``held``: its checkpoints), ``unused_held`` is the part of that rest such
a hold overlapped (a paused task, a command, an edge seen late are what remains).

    >>> use = idle_use([(0.0, 10.0), (20.0, 22.0)], [(1.0, 4.0), (4.5, 8.0)])
    >>> use.covered_ms, use.lead_ms, use.between_ms, use.tail_ms, use.unused_ms
    (6.5, 1.0, 0.5, 2.0, 2.0)
    >>> use.bubbles, use.unused_bubbles, round(use.share("covered"), 3)
    (2, 1, 0.542)
    >>> gaps = [(0.0, 10.0), (20.0, 22.0), (30.0, 40.0), (50.0, 60.0)]
    >>> use = idle_use(gaps, [(1.0, 4.0)], fit_ms=3.0, announced=[(29.5, 39.0)])
    >>> use.unused_ms, use.unused_fit_ms, use.unused_silent_ms
    (22.0, 20.0, 10.0)
    >>> told = [(29.5, 39.0, 31.5), (50.5, 60.0, 58.0)]  # (start, end, predicted end)
    >>> use = idle_use(gaps, [(1.0, 4.0)], fit_ms=3.0, announced=told)
    >>> use.unused_fit_ms, use.unused_silent_ms, use.unused_short_ms
    (20.0, 0.0, 10.0)
    >>> told = [(29.5, 39.0, 31.5, 4.0), (50.5, 60.0, 58.0, 8.0)]  # ..., the guard held to
    >>> use = idle_use(gaps, [(1.0, 4.0)], fit_ms=3.0, announced=told)
    >>> use.unused_short_ms, use.unused_guard_ms
    (10.0, 10.0)
    >>> told = [(29.5, 39.0, 31.5, 4.0), (50.5, 60.0, 58.0, 4.0)]  # (50, 60): room past 4.0
    >>> use = idle_use(gaps, [(1.0, 4.0)], fit_ms=3.0, announced=told, held=[(49.0, 52.0)])
    >>> use.unused_short_ms, use.unused_guard_ms, use.unused_held_ms  # its host was busy
    (10.0, 0.0, 10.0)
    >>> told = [(0.5, 9.5, 7.0)]  # the used bubble (0, 10) was promised until 7.0
    >>> use = idle_use(gaps[:1], [(1.0, 4.0)], announced=told)
    >>> use.tail_ms, use.tail_unpromised_ms
    (6.0, 3.0)
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass, fields

__all__ = ["PARTS", "IdleUse", "idle_use", "merge_intervals"]

#: The parts of the idle time, in the order a bubble passes through them.
PARTS: tuple[str, ...] = ("lead", "covered", "between", "tail", "unused")


@dataclass(frozen=True)
class IdleUse:
    """Milliseconds of bubble time in each part (``PARTS``), and how many bubbles had no step;
    ``unused_fit_ms`` and ``unused_silent_ms`` split ``unused_ms`` further (0 when not asked)."""

    covered_ms: float = 0.0
    lead_ms: float = 0.0
    between_ms: float = 0.0
    tail_ms: float = 0.0
    unused_ms: float = 0.0
    bubbles: int = 0
    unused_bubbles: int = 0
    unused_fit_ms: float = 0.0  # unused bubbles at least ``fit_ms`` long
    unused_silent_ms: float = 0.0  # ... of which no announced bubble overlapped
    unused_short_ms: float = 0.0  # ... announced, every prediction under ``fit_ms``
    unused_guard_ms: float = 0.0  # ... not those, every prediction within its guard
    unused_held_ms: float = 0.0  # ... not those either, a host's hold (``held``) overlapped
    tail_unpromised_ms: float = 0.0  # of ``tail_ms``, after the latest predicted end

    @property
    def total_ms(self) -> float:
        """All the bubble time split here: the five parts summed."""
        return sum(self.ms(p) for p in PARTS)

    def ms(self, part: str) -> float:
        """One part's milliseconds."""
        if part not in PARTS:
            raise ValueError(f"unknown part {part!r}; the parts are {', '.join(PARTS)}")
        return float(getattr(self, f"{part}_ms"))

    def share(self, part: str) -> float:
        """One part ÷ the bubble time (NaN without bubble time)."""
        total = self.total_ms
        return self.ms(part) / total if total > 0 else math.nan

    def __add__(self, other: IdleUse) -> IdleUse:
        """Two splits pooled (e.g. the blocks of one mode)."""
        return IdleUse(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        )


def merge_intervals(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, non-overlapping union of (start, end) intervals; empty ones are dropped."""
    out: list[tuple[float, float]] = []
    for s, e in sorted((float(s), float(e)) for s, e in intervals if e > s):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _clipped(
    intervals: list[tuple[float, float]], starts: list[float], lo: float, hi: float
) -> list[tuple[float, float]]:
    """The sorted, merged ``intervals`` (their ``starts``) that overlap (lo, hi), clipped to it."""
    i = max(bisect.bisect_right(starts, lo) - 1, 0)
    inside: list[tuple[float, float]] = []
    for s, e in intervals[i:]:
        if s >= hi:
            break
        if e > lo:
            inside.append((max(s, lo), min(e, hi)))
    return inside


def idle_use(
    bubbles: Iterable[tuple[float, float]],
    steps: Iterable[tuple[float, float]],
    *,
    fit_ms: float | None = None,
    announced: Iterable[tuple[float, ...]] = (),
    held: Iterable[tuple[float, float]] = (),
) -> IdleUse:
    """Split the bubbles' time by what the side-task ``steps`` made of it (all in ms).

    Args:
        bubbles: one rank's bubbles as (start, end); overlapping ones are merged first.
        steps: that rank's side-task steps as (start, end), from any task; a step that
            straddles a bubble's edge counts only inside it.
        fit_ms: the task's shortest step; unused bubbles at least this long count in
            ``unused_fit_ms`` (None: that split is not made).
        announced: the bubbles the rank announced to the host, as (start, end), (start, end,
            predicted end) or (start, end, predicted end, guard); unused bubbles of
            ``unused_fit_ms`` that none overlaps count in ``unused_silent_ms``, those whose
            overlapping announcements all predicted an end sooner than ``fit_ms`` after their
            start in ``unused_short_ms``, and of the rest those whose overlapping announcements
            all carry a guard and predicted no more than it in ``unused_guard_ms``. In a
            bubble with steps, the tail after the latest predicted end of the announcements
            overlapping it counts in ``tail_unpromised_ms`` (none where none predicted).
        held: when a side task's host did nothing but something else (its checkpoints), as
            (start, end); of the announced unused bubbles none of the above took, those one
            overlaps count in ``unused_held_ms``.
    """
    work = merge_intervals(steps)
    starts = [s for s, _ in work]
    told_all = sorted(tuple(float(x) for x in a) for a in announced)
    told = merge_intervals((a[0], a[1]) for a in told_all)
    told_starts = [s for s, _ in told]
    # announcements with a prediction, as (start, end) spans and whether it fitted a step
    with_end = [a for a in told_all if len(a) > 2]
    predicted = [(a[0], a[1]) for a in with_end]
    predicted_fit = [fit_ms is not None and a[2] - a[0] >= fit_ms for a in with_end]
    # and whether it left room past the guard the host held it to (True where none is known)
    past_guard = [len(a) < 4 or a[2] - a[0] > a[3] for a in with_end]
    predicted_starts = [s for s, _ in predicted]
    reach = list(itertools.accumulate((e for _, e in predicted), max))  # the latest end so far
    holds = merge_intervals(held)
    hold_starts = [s for s, _ in holds]
    parts = dict.fromkeys(PARTS, 0.0)
    fit = silent = short = guard = busy = unpromised = 0.0
    count = unused = 0
    for lo, hi in merge_intervals(bubbles):
        count += 1
        inside = _clipped(work, starts, lo, hi)
        if not inside:
            parts["unused"] += hi - lo
            unused += 1
            if fit_ms is not None and hi - lo >= fit_ms:
                fit += hi - lo
                if not _clipped(told, told_starts, lo, hi):
                    silent += hi - lo
                elif _no_room_predicted(predicted, predicted_starts, reach, predicted_fit, lo, hi):
                    short += hi - lo
                elif _no_room_predicted(predicted, predicted_starts, reach, past_guard, lo, hi):
                    guard += hi - lo
                elif _clipped(holds, hold_starts, lo, hi):
                    busy += hi - lo
            continue
        covered = sum(e - s for s, e in inside)
        parts["covered"] += covered
        parts["lead"] += inside[0][0] - lo
        parts["tail"] += hi - inside[-1][1]
        promised = _predicted_end(with_end, predicted, predicted_starts, reach, lo, hi)
        if promised is not None:
            unpromised += max(hi - max(promised, inside[-1][1]), 0.0)
        parts["between"] += (inside[-1][1] - inside[0][0]) - covered
    return IdleUse(
        **{f"{p}_ms": v for p, v in parts.items()},
        bubbles=count,
        unused_bubbles=unused,
        unused_fit_ms=fit,
        unused_silent_ms=silent,
        unused_short_ms=short,
        unused_guard_ms=guard,
        unused_held_ms=busy,
        tail_unpromised_ms=unpromised,
    )


def _overlapping(
    spans: list[tuple[float, float]], starts: list[float], reach: list[float], lo: float, hi: float
) -> list[int]:
    """The indices of the announcements in ``spans`` (sorted by start; ``starts`` theirs,
    ``reach`` their running latest end; not merged, since two announcements of one bubble may
    predict differently) that overlap (lo, hi)."""
    i = bisect.bisect_left(starts, lo)
    while i > 0 and reach[i - 1] > lo:  # an earlier start may still reach into the bubble
        i -= 1
    out: list[int] = []
    for j in range(i, len(spans)):
        s, e = spans[j]
        if s >= hi:
            break
        if e > lo:
            out.append(j)
    return out


def _predicted_end(
    told: list[tuple[float, ...]],
    spans: list[tuple[float, float]],
    starts: list[float],
    reach: list[float],
    lo: float,
    hi: float,
) -> float | None:
    """The latest predicted end among the announcements ``told`` (each with a prediction;
    ``spans`` their (start, end)) that overlap (lo, hi); None if none does."""
    ends = [told[j][2] for j in _overlapping(spans, starts, reach, lo, hi)]
    return max(ends) if ends else None


def _no_room_predicted(
    spans: list[tuple[float, float]],
    starts: list[float],
    reach: list[float],
    room: list[bool],
    lo: float,
    hi: float,
) -> bool:
    """Whether some announcement with a prediction overlaps (lo, hi) and none of those
    predicted room (``room``, per announcement: for the shortest step, or past its guard)."""
    seen = _overlapping(spans, starts, reach, lo, hi)
    return bool(seen) and not any(room[j] for j in seen)
