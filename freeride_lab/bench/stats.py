"""The bookkeeping of ``freeride-lab bench``: block order, medians, ratios, bubble use, harvest,
cost. Pure functions over numbers a benchmark has measured; ``bench/driver.py`` does the measuring,
``bench.tables`` builds the per-stage and pipeline tables from them.

A benchmark run interleaves *blocks* of training steps in different *modes* (A B C A B C …) so
that slow drift (clocks, temperature, other load) hits every mode alike, and reports medians
and ratios, never one absolute time:

- ``vanilla``: side tasks attached but parked (no step starts): the baseline;
- ``plain``: vanilla with plain ``PipelineStage`` instead of the timed one (instrumentation cost);
- ``managed``: FreeRide's gating: side-task steps only inside predicted bubbles;
- ``governed``: managed, with the overhead governor adjusting the step budget;
- ``trickle``: governed, and between bubbles as much as the same governor, at the same
  overhead target, lets the task step through training's compute (gating "trickle");
- ``naive``: the side task runs continuously beside training (the negative control).

[Note: paired ratios]
A mode's step-time ratio is taken block by block against the vanilla blocks next to it in run
order (the mean of the nearest one before and the nearest one after); a drift that is linear
over a few blocks cancels. The overhead is the mean of those paired differences (ratio - 1)
with a 95% t-interval over the blocks (``core.intervals`` [Note: paired design]: neighbouring
differences share a vanilla block, and the interval accounts for it). The median of the
ratios, which one disturbed block moves little, is kept beside it (``overhead_median_frac``);
the mean is the headline because it is what the interval is about.

Cost and harvest go through ``core.accounting`` (FreeRide's formulas), so the benchmark's numbers
cannot drift from the library's:

    >>> interleave(["vanilla", "managed"], 2)
    [(0, 'vanilla'), (0, 'managed'), (1, 'vanilla'), (1, 'managed')]
    >>> round(pipeline_cost({"resnet18": 998.7}, overhead_frac=0.0).saving_published_frac, 4)
    0.0455
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from freeride_lab.core.accounting import CostModel, CostSaving, cost_saving
from freeride_lab.core.idle_use import merge_intervals
from freeride_lab.core.intervals import Interval, mean_interval

__all__ = [
    "BLOCK_COLUMNS",
    "GATED_MODES",
    "IDLE_SPLIT_COLUMNS",
    "LEFTOVERS_COLUMNS",
    "MODES",
    "REFERENCE_MODE",
    "SPREAD_FLAG_FRAC",
    "SegmentKey",
    "announce_lag_ms",
    "bubble_use_frac",
    "dedicated_speed",
    "dedicated_throughput_per_s",
    "handon_latency_ms",
    "interleave",
    "leftovers_key",
    "median",
    "merge_intervals",
    "overhead_interval",
    "overlap_ms",
    "paired_ratios",
    "pause_latency_ms",
    "percentile",
    "pipeline_cost",
    "side_work",
    "signal_latency_ms",
    "spin_catches",
    "step_periods_ms",
    "wake_latency_ms",
]

MODES: tuple[str, ...] = ("vanilla", "plain", "managed", "governed", "trickle", "naive")
#: The modes in which the task follows the bubble edges (the product's modes).
GATED_MODES: tuple[str, ...] = ("managed", "governed", "trickle")
REFERENCE_MODE = "vanilla"
#: One segment of a run: (run, case, stage, task); its solo phases give its dedicated speed.
SegmentKey = tuple[str, str, int, str]

#: The block columns that split the rest of bubble_ms by where it went (core.idle_use): before
#: a bubble's first step, between its steps, after its last step, in bubbles where no step ran;
#: then the real rank's bubbles in the block (gaps > 1 ms) and the ones no step ran in; the
#: unused ones a step as short as the block's shortest would have fitted, of those the ones
#: the rank never announced, the announced ones predicted too short for that step, of the
#: rest those predicted within the guard the host held them to (NaN where no step of the
#: block recorded its guard), and of the rest again those a checkpoint of the stage's tasks
#: held their host across; last, the part of the time after the last step that lay past
#: the bubbles' predicted end (NaN where no announcement carried one). Results recorded before
#: each split lack its columns.
IDLE_SPLIT_COLUMNS: tuple[str, ...] = (
    "idle_lead_ms",
    "idle_between_ms",
    "idle_tail_ms",
    "idle_unused_ms",
    "idle_unused_fit_ms",
    "idle_unused_silent_ms",
    "idle_unused_short_ms",
    "idle_unused_guard_ms",
    "idle_unused_held_ms",
    "idle_tail_unpromised_ms",
    "bubbles",
    "unused_bubbles",
)

#: Columns of the blocks table ``bench/driver.py`` builds (one row per block), in order.
#: The block columns of the task beside the segment's that took its leftovers (gating
#: "leftovers"): its name ("" for none), its units done inside the block and their name. The
#: block's steps, busy time, idle split, latencies and overruns are both tasks' (the stage's
#: side work); ``progress`` and ``unit`` stay the segment's task's. Results recorded before
#: them lack these columns.
LEFTOVERS_COLUMNS: tuple[str, ...] = ("leftovers_task", "leftovers_progress", "leftovers_unit")

BLOCK_COLUMNS: tuple[str, ...] = (
    "run",  # which pipeline run (one process tree): e.g. "m4-timeslice"
    "case",  # what its side tasks were: "mix", a task name, or "instrumentation"
    "stage",  # the real rank (its lowest stage index) in this block
    "task",  # the side task on that stage ("" for none)
    "mode",  # one of MODES
    "repeat",  # 0-based repeat of the interleaved sequence
    "order",  # 0-based position of the block in its run
    "first_step",  # first measured training step
    "steps",  # measured step periods in the block
    "step_ms_median",  # median step period (start to next start), ms
    "wall_s",  # first measured step start to the start after the last one
    "bubble_ms",  # the real rank's idle time inside step windows (gaps > 1 ms), summed
    "progress",  # side-task units done inside the block
    "unit",  # the side task's progress unit ("" for none)
    "side_steps",  # side-task steps that started inside the block
    "busy_ms",  # summed side-task step durations
    "busy_in_bubble_ms",  # the part of busy_ms that lies inside the real rank's bubbles
    *IDLE_SPLIT_COLUMNS,
    "overruns",  # side-task steps that ran past their bubble's end
    "overrun_ms_total",
    "latency_ms",  # tuple: bubble start edge → first side-task step start, per bubble used
    # tuple: its first hop, bubble start edge → the side task's host saw it, per bubble used
    # whose first step recorded when (``SideTaskStep.seen_ns``); the rest is the host's path
    "wake_ms",
    # tuples, per bubble used whose first step recorded them (``spin_catches``): its start
    # against the start its host expected, ms (late > 0); and 1.0 where the edge came inside
    # the host's spin window, 0.0 where the host spun but the edge came outside it
    "late_ms",
    "spun",
    # tuple: the hop before them, the device reaching a bubble's start (the resolved
    # timeline) → the rank announcing it, per start edge (``announce_lag_ms``)
    "announce_ms",
    # tuple: bubble end edge → the last side-task step that still started after it (0 when
    # none did), per bubble used; empty in trickle blocks, whose steps run between bubbles
    "pause_ms",
    # tuple: with a leftovers task, bubble start edge → its first step, per bubble the stage's
    # task left whole and it used (``handon_latency_ms``); latency_ms, wake_ms, late_ms and
    # spun are then the stage's task's own
    "handon_ms",
    "sm_clock_mhz",  # median NVML SM clock in the block (NaN without NVML)
    "power_w",  # median NVML board power in the block (NaN without NVML)
    *LEFTOVERS_COLUMNS,
)


def side_work(row: Mapping[str, Any]) -> str:
    """A summary row's side work in words: its task, and the task that took its leftovers.

    >>> side_work({"task": "vgg19", "leftovers_task": "image"})
    'vgg19 + image (leftovers)'
    >>> side_work({"task": "vgg19"})
    'vgg19'
    """
    task, rest = str(row.get("task") or ""), row.get("leftovers_task") or ""
    return f"{task} + {leftovers_key(str(rest))}" if rest else task


def leftovers_key(task: str) -> str:
    """The name a leftovers task's dedicated speed goes by in its segment's ``SegmentKey``
    (apart from the segment's own task, which may be the same task).

        >>> leftovers_key("image")
        'image (leftovers)'
    """
    return f"{task} (leftovers)"


# -- order and statistics ---------------------------------------------------------------------


def interleave(
    modes: Sequence[str], repeats: int, *, closed: bool = False
) -> list[tuple[int, str]]:
    """(repeat, mode) in run order: every mode once per repeat, in the given order (A B A B).

    Args:
        closed: end with one more block of the first mode (A B A B A), so that every other
            block has a block of the first mode (the reference) on both sides.

    Raises:
        ValueError: repeats < 1, no modes, a repeated or unknown mode.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r} must be an integer >= 1")
    if not modes:
        raise ValueError(f"no modes given; valid: {', '.join(MODES)}")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown mode(s) {unknown}; valid: {', '.join(MODES)}")
    if len(set(modes)) != len(modes):
        raise ValueError(f"modes {list(modes)} repeat a mode; list each once")
    order = [(r, m) for r in range(repeats) for m in modes]
    return [*order, (repeats, modes[0])] if closed else order


def median(values: Iterable[float]) -> float:
    """The median, ignoring NaN; NaN when nothing is left."""
    a = np.asarray([v for v in values if not _isnan(v)], dtype=float)
    return float(np.median(a)) if a.size else math.nan


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (0-100, linear), ignoring NaN; NaN when nothing is left."""
    if not 0 <= q <= 100:
        raise ValueError(f"q={q} must be in [0, 100]")
    a = np.asarray([v for v in values if not _isnan(v)], dtype=float)
    return float(np.percentile(a, q)) if a.size else math.nan


def step_periods_ms(start_ns: Sequence[int]) -> list[float]:
    """Start-to-next-start periods in ms of consecutive steps (one fewer than starts).

    Raises:
        ValueError: starts that do not increase.
    """
    a = np.asarray(start_ns, dtype=np.int64)
    d = np.diff(a)
    if (d <= 0).any():
        raise ValueError(f"step starts must increase; got differences {d.tolist()} ns")
    return [float(x) / 1e6 for x in d]


def paired_ratios(
    order: Sequence[int],
    modes: Sequence[str],
    step_ms: Sequence[float],
    mode: str,
    *,
    reference: str = REFERENCE_MODE,
) -> list[float]:
    """Per block of ``mode``: its step time ÷ its neighbouring reference blocks' mean.

    Args:
        order, modes, step_ms: one entry per block (run order, mode, median step ms) of one
            segment; the neighbours are the nearest ``reference`` blocks before and after in
            ``order`` (one side only at the ends).

    Returns:
        One ratio per ``mode`` block that has a reference neighbour, in run order.
    """
    return [1.0 + d for d in _paired(order, modes, step_ms, mode, reference)[0]]


def overhead_interval(
    order: Sequence[int],
    modes: Sequence[str],
    step_ms: Sequence[float],
    mode: str,
    *,
    reference: str = REFERENCE_MODE,
) -> Interval:
    """The mean of ``mode``'s per-block paired differences (ratio - 1) with its t-interval,
    corrected for the reference blocks that neighbouring differences share
    (``core.intervals`` [Note: paired design])."""
    diffs, design = _paired(order, modes, step_ms, mode, reference)
    return mean_interval(diffs, design=design)


def _paired(
    order: Sequence[int],
    modes: Sequence[str],
    step_ms: Sequence[float],
    mode: str,
    reference: str,
) -> tuple[list[float], np.ndarray]:
    """Paired differences of ``mode``'s blocks, in run order, and their design C = WWᵀ."""
    if not len(order) == len(modes) == len(step_ms):
        raise ValueError(
            f"order, modes and step_ms differ in length ({len(order)}, {len(modes)}, "
            f"{len(step_ms)}); give one entry per block"
        )
    rows = sorted(zip(order, modes, step_ms, strict=True))
    refs = [(i, v) for i, (_, m, v) in enumerate(rows) if m == reference and not _isnan(v)]
    diffs: list[float] = []
    weights: list[dict[int, float]] = []  # block index -> weight, one dict per difference
    for i, (_, m, v) in enumerate(rows):
        if m != mode or _isnan(v):
            continue
        before = [r for r in refs if r[0] < i]
        after = [r for r in refs if r[0] > i]
        near = ([before[-1]] if before else []) + ([after[0]] if after else [])
        if not near:
            continue
        diffs.append(v / (sum(x[1] for x in near) / len(near)) - 1.0)
        w = {i: 1.0}
        for j, _ in near:
            w[j] = w.get(j, 0.0) - 1.0 / len(near)
        weights.append(w)
    big_w = np.zeros((len(diffs), len(rows)))
    for k, w in enumerate(weights):
        for j, x in w.items():
            big_w[k, j] = x
    return diffs, big_w @ big_w.T


# -- intervals ------------------------------------------------------------------------------


def overlap_ms(a: Iterable[tuple[float, float]], b: Iterable[tuple[float, float]]) -> float:
    """Total length of the intersection of two sets of intervals (each merged first)."""
    x, y = merge_intervals(a), merge_intervals(b)
    total, i, j = 0.0, 0, 0
    while i < len(x) and j < len(y):
        lo = max(x[i][0], y[j][0])
        hi = min(x[i][1], y[j][1])
        if hi > lo:
            total += hi - lo
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


def bubble_use_frac(
    bubbles: Iterable[tuple[float, float]], busy: Iterable[tuple[float, float]]
) -> float:
    """Side-task busy time inside bubbles ÷ bubble time (NaN without bubble time)."""
    merged = merge_intervals(bubbles)
    total = sum(e - s for s, e in merged)
    return overlap_ms(merged, busy) / total if total > 0 else math.nan


def signal_latency_ms(
    edge_start_ns: Sequence[int], edge_end_ns: Sequence[int], step_start_ns: Sequence[int]
) -> list[float]:
    """Bubble start → first side-task step start, for every bubble a step started in.

    Args:
        edge_start_ns, edge_end_ns: the bubbles' start and end edges (pairs, same length).
        step_start_ns: side-task step starts.
    """
    _, used = _used_bubbles(edge_start_ns, edge_end_ns, step_start_ns)
    return [float(first - start) / 1e6 for start, _, _, first in used]


def handon_latency_ms(
    edge_start_ns: Sequence[int],
    edge_end_ns: Sequence[int],
    main_step_start_ns: Sequence[int],
    rest_step_start_ns: Sequence[int],
) -> list[float]:
    """Bubble start → the leftovers task's first step start, for every bubble the stage's
    main task left whole (no step of its own started in it) and the leftovers task used: the
    main task's host seeing the edge and leaving the bubble, the hand-on, and the leftovers
    task's host seeing it and stepping (``host.iterative`` [Note: leftovers]).

        >>> handon_latency_ms([0, 10_000_000], [5_000_000, 15_000_000],
        ...                   [1_000_000], [3_000_000, 10_400_000])
        [0.4]
    """
    _, taken = _used_bubbles(edge_start_ns, edge_end_ns, main_step_start_ns)
    used = {(start, end) for start, end, _, _ in taken}
    left = [(a, e) for a, e in zip(edge_start_ns, edge_end_ns, strict=True) if (a, e) not in used]
    return signal_latency_ms([a for a, _ in left], [e for _, e in left], rest_step_start_ns)


def announce_lag_ms(
    gaps_ns: Sequence[tuple[int, int]], edge_start_ns: Sequence[int]
) -> list[float]:
    """The hop before ``signal_latency_ms``: the device reaching a bubble's start (the
    measured gap's start, from the resolved timeline) → the rank announcing it (the start
    edge's stamp, taken when the rank's edge watcher woke). One value per start edge that lies
    inside a measured gap; an edge outside every gap (its bubble shorter than the gaps kept, or
    already over) has no value.

    Args:
        gaps_ns: the rank's measured idle gaps as (start, end), on the run clock.
        edge_start_ns: the start edges the rank announced, on the run clock.

        >>> announce_lag_ms([(0, 10_000_000), (20_000_000, 30_000_000)],
        ...                 [40_000, 20_100_000, 35_000_000])
        [0.04, 0.1]
    """
    spans = sorted((int(a), int(e)) for a, e in gaps_ns if e > a)
    starts = [a for a, _ in spans]
    out = []
    for t in sorted(int(x) for x in edge_start_ns):
        i = bisect.bisect_right(starts, t) - 1
        if i >= 0 and t < spans[i][1]:
            out.append((t - spans[i][0]) / 1e6)
    return out


def wake_latency_ms(
    edge_start_ns: Sequence[int],
    edge_end_ns: Sequence[int],
    step_start_ns: Sequence[int],
    step_seen_ns: Sequence[float],
) -> list[float]:
    """Bubble start → when the side task's host saw that edge: the first hop of
    ``signal_latency_ms``, for every bubble whose first step recorded it.

    Args: as ``signal_latency_ms``, and ``step_seen_ns``: per step start, when its host saw the
    edge it answered (NaN or 0 where not recorded: steps after a bubble's first). A time
    outside [the bubble's start, its first step's start] belongs to another edge and is
    skipped.

        >>> wake_latency_ms([0], [10_000_000], [2_000_000, 5_000_000], [500_000, 0])
        [0.5]
    """
    seen = dict(zip((int(x) for x in step_start_ns), step_seen_ns, strict=True))
    _, used = _used_bubbles(edge_start_ns, edge_end_ns, step_start_ns)
    out = []
    for start, _, _, first in used:
        t = seen.get(first, math.nan)
        if math.isfinite(t) and start <= t <= first:
            out.append(float(t - start) / 1e6)
    return out


def spin_catches(
    edge_start_ns: Sequence[int],
    edge_end_ns: Sequence[int],
    step_start_ns: Sequence[int],
    step_expected_ns: Sequence[float],
    step_spin_ns: Sequence[tuple[float, float]],
) -> tuple[list[float], list[float]]:
    """Why the host saw an edge when it did, for every bubble a step started in: how late the
    bubble started against the start its host's clock expected (ms; negative: early), where
    the first step recorded a prediction; and whether the edge came inside the spin window the
    host waited with (1.0) or not (0.0: the host slept until woken), where it spun.

    Args: as ``signal_latency_ms``, and per step start ``step_expected_ns`` (NaN or 0 where
    not recorded) and ``step_spin_ns`` (from, until; NaN or 0 where the host did not spin).

        >>> spin_catches([1_000_000, 5_000_000], [3_000_000, 9_000_000],
        ...              [1_100_000, 5_200_000], [900_000, 4_000_000],
        ...              [(600_000, 1_500_000), (3_700_000, 4_500_000)])
        ([0.1, 1.0], [1.0, 0.0])
    """
    expected = dict(zip((int(x) for x in step_start_ns), step_expected_ns, strict=True))
    spins = dict(zip((int(x) for x in step_start_ns), step_spin_ns, strict=True))
    _, used = _used_bubbles(edge_start_ns, edge_end_ns, step_start_ns)
    late: list[float] = []
    caught: list[float] = []
    for start, _, _, first in used:
        t = expected.get(first, math.nan)
        if math.isfinite(t) and t > 0:
            late.append(float(start - t) / 1e6)
        lo, hi = spins.get(first, (math.nan, math.nan))
        if math.isfinite(lo) and math.isfinite(hi) and 0 < lo <= hi:
            caught.append(1.0 if lo <= start <= hi else 0.0)
    return late, caught


def pause_latency_ms(
    edge_start_ns: Sequence[int],
    edge_end_ns: Sequence[int],
    step_start_ns: Sequence[int],
    *,
    open_start_ns: Sequence[int] = (),
) -> list[float]:
    """Bubble end → the last side-task step that still started after it, for every bubble a
    step started in: how long the task went on launching new work once training had resumed
    (0 where no step started late). A step starting at or after a bubble's end edge and before
    the next bubble's start edge is late for that bubble.

    Args: as ``signal_latency_ms``, and ``open_start_ns``: starts of bubbles whose end is not
    among the edges (a block's window closed first). They are not timed, but a step in one is
    not late for the bubble before it.
    """
    steps, used = _used_bubbles(edge_start_ns, edge_end_ns, step_start_ns, open_start_ns)
    out: list[float] = []
    for _, end, until, _ in used:
        late = steps[(steps >= end) & (steps < until)]
        out.append(float(late[-1] - end) / 1e6 if late.size else 0.0)
    return out


def _used_bubbles(
    edge_start_ns: Sequence[int],
    edge_end_ns: Sequence[int],
    step_start_ns: Sequence[int],
    open_start_ns: Sequence[int] = (),
) -> tuple[np.ndarray, list[tuple[int, int, int, int]]]:
    """The sorted step starts, and (start, end, next bubble's start, first step start) of
    every bubble, in time order, that a step started in; the next start may be an open one."""
    if len(edge_start_ns) != len(edge_end_ns):
        raise ValueError(
            f"{len(edge_start_ns)} start edges but {len(edge_end_ns)} end edges; pass pairs"
        )
    steps = np.sort(np.asarray(step_start_ns, dtype=np.int64))
    starts = np.sort(np.asarray([*edge_start_ns, *open_start_ns], dtype=np.int64))
    never = int(np.iinfo(np.int64).max)
    used = []
    for start, end in sorted(zip(edge_start_ns, edge_end_ns, strict=True)):
        i = int(np.searchsorted(steps, start, side="left"))
        if i < steps.size and steps[i] < end:
            k = int(np.searchsorted(starts, start, side="right"))
            until = int(starts[k]) if k < starts.size else never
            used.append((int(start), int(end), until, int(steps[i])))
    return steps, used


# -- side-task speed, harvest, cost ---------------------------------------------------------


def dedicated_throughput_per_s(
    progress: Sequence[float], duration_ms: Sequence[float], *, skip: int = 2
) -> float:
    """Units per second of step time, leaving out the first ``skip`` steps (warm-up).

    A task whose progress comes in whole units every few steps (an image resized in bands:
    fifteen steps of 0, then 1) is measured over whole cycles only: from just after the first
    step that made progress to the last one that did, when at least two did. Otherwise a
    window that ends mid-image would count the bands it did as no work.
    NaN when no step is left or they took no time.
    """
    if len(progress) != len(duration_ms):
        raise ValueError(f"{len(progress)} progress values but {len(duration_ms)} durations")
    p = np.asarray(progress, dtype=float)[skip:]
    d = np.asarray(duration_ms, dtype=float)[skip:]
    done = np.flatnonzero(p > 0)
    if done.size >= 2 and done.size < p.size:  # not every step made progress: whole cycles
        p, d = p[done[0] + 1 : done[-1] + 1], d[done[0] + 1 : done[-1] + 1]
    total_s = float(d.sum()) / 1e3
    return float(p.sum()) / total_s if p.size and total_s > 0 else math.nan


#: A segment whose dedicated speeds before and after its blocks differ by more than this
#: (relative to their mean) is flagged: its harvest rests on a speed that moved.
SPREAD_FLAG_FRAC = 0.10


def dedicated_speed(before: float | None, after: float | None) -> dict[str, float | bool | None]:
    """The speed a segment's harvest uses and how far it moved.

    Returns:
        dedicated_per_s: the mean of the solo speeds before and after the segment's blocks (or
        the one measured; None without either); dedicated_spread_frac: |after - before| ÷
        that mean (None unless both were measured); dedicated_unstable: the spread is over
        ``SPREAD_FLAG_FRAC``.
    """
    measured = [float(v) for v in (before, after) if v is not None and math.isfinite(v)]
    used = sum(measured) / len(measured) if measured else None
    spread = (
        abs(float(after) - float(before)) / used
        if len(measured) == 2 and used and before is not None and after is not None
        else None
    )
    return {
        "dedicated_per_s": used,
        "dedicated_spread_frac": spread,
        "dedicated_unstable": spread is not None and spread > SPREAD_FLAG_FRAC,
    }


def pipeline_cost(
    rates_per_s: Mapping[str, float],
    *,
    overhead_frac: float,
    model: CostModel | None = None,
) -> CostSaving:
    """FreeRide's cost figures for side-task rates summed over the pipeline's stages.

    Goes through ``accounting.cost_saving`` with T_v = 1 s and T_f = 1 + overhead, P_k =
    rate_k · T_f: the same formulas as a full run of length T_f (both are linear in time).

    Args:
        rates_per_s: units per second of training wall time per FreeRide reference key
            ("resnet18", "sgd", …), summed over stages.
        overhead_frac: the training slowdown the side tasks cause (T_f / T_v - 1).
    """
    if not math.isfinite(overhead_frac) or overhead_frac <= -1:
        raise ValueError(f"overhead_frac={overhead_frac!r} must be a finite number > -1")
    freeride_s = 1.0 + overhead_frac
    progress = {k: float(v) * freeride_s for k, v in rates_per_s.items()}
    return cost_saving(progress, vanilla_s=1.0, freeride_s=freeride_s, model=model)


def _isnan(v: object) -> bool:
    try:
        return math.isnan(float(v))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return True
