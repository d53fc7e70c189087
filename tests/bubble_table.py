"""The complete bubble table's invariants, computed from first principles.

Shared by the property test over generated timelines (``tests/core/test_bubbles.py``) and the
real-run tests (``tests/lab/test_bubble_table_runs.py``); importable from any test module.
Spelled out from ``core/bubbles.py`` [Note: step boundary bubbles]: step s of rank r spans
[window start of s, window start of s+1), or for a step whose successor was not recorded, up to
the later of its window end and the rank's optimizer end; merged busy time (actions and the
optimizer) plus the rank's bubbles fill that span, and no bubble overlaps anything busy.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

import pandas as pd

Interval = tuple[float, float]


def busy_intervals(
    actions: pd.DataFrame, steps: pd.DataFrame
) -> dict[tuple[int, int], list[Interval]]:
    """Per (step, rank) with actions: its action spans and, where known, its optimizer span."""
    busy: dict[tuple[int, int], list[Interval]] = defaultdict(list)
    for s, r, a, b in actions[["step", "rank", "start_ms", "end_ms"]].itertuples(index=False):
        busy[(int(s), int(r))].append((float(a), float(b)))
    cols = ["step", "rank", "optimizer_start_ms", "optimizer_end_ms"]
    for s, r, a, b in steps[cols].itertuples(index=False):
        key = (int(s), int(r))
        if key in busy and not math.isnan(a) and not math.isnan(b) and b >= a:
            busy[key].append((float(a), float(b)))
    return dict(busy)


def merged_ms(intervals: list[Interval]) -> float:
    """Length of the union of ``intervals``."""
    total, reach = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def step_spans(actions: pd.DataFrame, steps: pd.DataFrame) -> dict[tuple[int, int], Interval]:
    """Per (step, rank) with actions: the span its busy time and bubbles must fill. It starts
    at the step's window start, or where the rank's previous step ended when that is later
    (steps may overlap across ranks, never on one rank)."""
    windows = actions.groupby("step").agg(start=("start_ms", "min"), end=("end_ms", "max"))
    spans: dict[tuple[int, int], Interval] = {}
    for (s, r), intervals in sorted(busy_intervals(actions, steps).items()):
        end = windows.loc[s + 1, "start"] if s + 1 in windows.index else windows.loc[s, "end"]
        start = windows.loc[s, "start"]
        if (s - 1, r) in spans:
            start = max(start, spans[(s - 1, r)][1])
        spans[(s, r)] = (start, max(end, max(b for _, b in intervals)))
    return spans


def assert_complete_and_exact(
    actions: pd.DataFrame, steps: pd.DataFrame, bubbles: pd.DataFrame, *, tol_ms: float = 1e-6
) -> None:
    """Busy + bubbles = span per (step, rank); no bubble overlaps busy time or another bubble;
    "boundary" exactly where a bubble lies after its step's window."""
    busy = busy_intervals(actions, steps)
    spans = step_spans(actions, steps)
    window_end = actions.groupby("step")["end_ms"].max()
    idle = bubbles.groupby(["step", "rank"])["duration_ms"].sum()
    assert set(idle.index) <= set(spans), "a bubble in a (step, rank) without actions"
    for key, (start, end) in spans.items():
        got = merged_ms(busy[key]) + float(idle.get(key, 0.0))
        assert abs(got - (end - start)) <= tol_ms, (key, got, end - start)
    all_busy: dict[int, list[Interval]] = defaultdict(list)
    for (_, r), intervals in busy.items():
        all_busy[r].extend(intervals)
    for r, mine in bubbles.groupby("rank"):
        gaps = sorted(zip(mine["start_ms"], mine["end_ms"], strict=True))
        for (_, b0), (a1, _) in itertools.pairwise(gaps):
            assert a1 >= b0 - tol_ms, f"rank {r}: bubbles overlap at {a1}"
        for a, b in gaps:
            for x, y in all_busy[int(r)]:
                assert min(b, y) - max(a, x) <= tol_ms, f"rank {r}: bubble {a, b} vs busy {x, y}"
    for row in bubbles.itertuples(index=False):
        start, end = spans[(row.step, row.rank)]
        assert start - tol_ms <= row.start_ms < row.end_ms <= end + tol_ms, row
        after_window = row.start_ms >= window_end[row.step]  # the very floats the table cut at
        assert (row.kind == "boundary") == after_window, row
