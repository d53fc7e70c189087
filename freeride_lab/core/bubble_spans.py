"""Busy spans of each rank and the idle gaps between them: the mechanics of ``core.bubbles``.

``busy_spans`` lays out each (step, rank)'s actions (and, given the steps table, its optimizer)
as busy intervals; ``gaps`` finds the idle between them inside each step's span and cuts it at
the window end into in-window and boundary gaps; ``freeride_labels`` names 1F1B's gaps A-D.
``core.bubbles`` builds its tables from these.

[Note: step boundary bubbles]
Between two steps each rank idles too: after its last action it waits for the window to end,
runs its optimizer, agrees on stopping with the other ranks and waits for its first input of
the next step. Given the run's ``steps`` table (the optimizer spans), ``extract_bubbles``
covers that time as well: the optimizer is compute (busy, like an action), and the idle after
the step's window end up to the next step's window start is a bubble of kind "boundary".

A boundary bubble belongs to the step it **follows**: step s of rank r then spans
[window start of s, window start of s+1) — the start-to-start step time that benchmarks
report — and, per rank and step, merged actions + optimizer + bubbles = that span exactly.
The boundary rows come after the step's in-window gaps, so slot k keeps its meaning in every
step (``predict_bubbles`` groups by slot); putting them first would shift every slot of every
step but the first. The last recorded step has no next window: it ends at its window end, or
at the rank's optimizer end when that is later.

The live bubble edges (``pipeline.timed_stage``, [Note: bubble slots] there) announce the idle
from the optimizer's end to the first action of step s+1 as one slot, slot 0 of step s+1
(``carry_gap``), so that one prediction covers it. In this table that span is step s's last
boundary row plus step s+1's leading row, cut at step s+1's window start: together they are
the carried slot, and no instant is counted twice. A side task that ran in a carried slot
reports the step of its edge (s+1), so join side-task steps to bubbles by time, not by step.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = [
    "BACKWARDS",
    "OPTIMIZER_COLUMNS",
    "busy_spans",
    "complete_groups",
    "freeride_labels",
    "gaps",
]

OPTIMIZER_COLUMNS = ("step", "rank", "optimizer_start_ms", "optimizer_end_ms")
BACKWARDS = ("B", "I")  # backward-type actions that start a rank's backward phase


def busy_spans(a: pd.DataFrame, steps: pd.DataFrame | None) -> pd.DataFrame:
    """Busy rows of each (step, rank), sorted by start: its actions (``a``, sorted by step,
    rank, start), then its optimizer when ``steps`` is given; with each row's position in the
    rank's step, the step's action count and the positions of its first backward and last
    forward.
    """
    keys = [a["step"], a["rank"]]
    pos = a.groupby(keys, sort=False).cumcount()
    n = pos.groupby(keys).transform("size")
    is_fwd = a["action"].eq("F")
    is_bwd = a["action"].isin(BACKWARDS)
    busy = pd.DataFrame(
        {
            "step": a["step"],
            "rank": a["rank"],
            "start_ms": a["start_ms"],
            "end_ms": a["end_ms"],
            "pos": pos,  # index of the action in the rank's step; n for the optimizer
            "n": n,
            "first_bwd": pos.where(is_bwd).groupby(keys).transform("min").fillna(n),
            "last_fwd": pos.where(is_fwd).groupby(keys).transform("max").fillna(-1),
            "short": a["stage"].astype(str) + a["action"] + a["microbatch"].astype(str),
            "kind": a["action"],
        }
    )
    if steps is not None:
        busy = pd.concat([busy, optimizer_spans(steps, busy)], ignore_index=True)
        busy = busy.sort_values(["step", "rank", "start_ms", "end_ms"], kind="stable")
        busy = busy.reset_index(drop=True)
    return busy


# [Note: FreeRide labels]
# FreeRide (arXiv 2409.06941; freeride-paper.md §3.2) names the bubbles of a 1F1B step A-D.
# We derive them from the rank's action ORDER around each gap, never from positions fixed
# for one (S, M); S = ``stages`` (pipeline ranks, one stage each), s = the rank's stage:
#   A  the gap before the rank's first action (s >= 1: waiting for the first activation).
#      On the last stage (s = S-1) the trailing gap to the window end is labelled A too:
#      the paper merges that drain idle into the next step's A (it is one idle span that
#      crosses the step boundary, cut in two by our per-step windows), so the last stage
#      shows only A — twice per step, fill (slot 0, kind "warmup") and drain (kind "end").
#      Boundary gaps (after the window end, [Note: step boundary bubbles]) on s >= 1 are A
#      as well: the step is over and the rank waits for the next step's first input.
#   B  the gap right before the rank's first backward when the action before it is a
#      forward (the last warm-up forward), s <= S-2: waiting for the first gradient.
#   D  a gap between two consecutive backwards, s <= S-2: the cool-down slot where 1F1B
#      would interleave a forward but none is left. Torch's 1F1B runs min(M, S-s) warm-up
#      forwards, so there are min(M, S-s) - 1 = min(M-1, S-1-s) such gaps.
#   C  the trailing gap after the rank's last action up to the window end, 1 <= s <= S-2:
#      waiting for earlier stages to drain (stage 0 ends the window, so it has none).
# Any other gap (sub-ms dispatch between two warm-up forwards or around the last stage's F,
# whose loss is timed inside it, steady-state jitter) gets no label; ``min_ms`` drops such
# slivers so that slots line up with the idealised schedule.


def optimizer_spans(steps: pd.DataFrame, busy: pd.DataFrame) -> pd.DataFrame:
    """Busy rows for the optimizer of each (step, rank) that has actions; after every action."""
    per_rank = busy.groupby(["step", "rank"], sort=False)[["n", "first_bwd", "last_fwd"]].first()
    o = steps[list(OPTIMIZER_COLUMNS)].copy()
    o["start_ms"] = pd.to_numeric(o["optimizer_start_ms"], errors="coerce")
    o["end_ms"] = pd.to_numeric(o["optimizer_end_ms"], errors="coerce")
    o = o[o["start_ms"].notna() & (o["end_ms"] >= o["start_ms"])]
    o = o.astype({"step": "int64", "rank": "int64"}).drop_duplicates(["step", "rank"], keep="last")
    o = o.join(per_rank, on=["step", "rank"], how="inner")
    o["pos"] = o["n"]
    o["short"] = "optimizer"
    o["kind"] = "optimizer"
    return o[list(busy.columns)]


def gaps(busy: pd.DataFrame, windows: pd.DataFrame, *, to_next_window: bool) -> pd.DataFrame:
    """The idle gaps around ``busy`` (sorted by step, rank, start) per (step, rank).

    Each (step, rank) spans [start, end). Start is the window start (with ``to_next_window``:
    or the rank's previous step's end, when that is later). End is the window end, or with
    ``to_next_window`` the next step's window start when that step was recorded; never before
    the rank's last busy moment. Gaps that cross the window end are cut there; the part after
    it is a boundary gap (column ``boundary``).

    [Note: overlapping steps]
    Steps may overlap across ranks: nothing holds a rank at a step boundary (the stop agreement
    runs behind the step), so in zero-bubble and V schedules a rank can start its next step's
    first action while a peer still runs the last weight gradients of the step before. A
    rank's own steps never overlap, so its spans are cut where its previous step ended: its
    bubbles never overlap its own busy time, and a rank still busy when the next step starts
    has no boundary bubble for that step.
    """
    keys = [busy["step"], busy["rank"]]
    win_start = busy["step"].map(windows["start_ms"])
    win_end = busy["step"].map(windows["end_ms"])
    reach = busy["end_ms"].groupby(keys).cummax()  # latest end so far: merges overlaps
    if to_next_window:  # spans tile each rank's time ([Note: overlapping steps])
        last_end = reach.groupby([busy["step"], busy["rank"]]).max()
        before = pd.MultiIndex.from_arrays([busy["step"] - 1, busy["rank"]])
        prev_end = pd.Series(last_end.reindex(before).to_numpy(), index=busy.index)
        win_start = np.maximum(win_start, prev_end.fillna(-np.inf))
    span_end = win_end
    if to_next_window:
        next_start = windows["start_ms"].reindex(windows.index + 1).to_numpy()
        following = pd.Series(next_start, index=windows.index)
        span_end = busy["step"].map(following).fillna(win_end)
    span_end = np.maximum(span_end, reach.groupby(keys).transform("max"))
    cols = ["step", "rank", "pos", "n", "first_bwd", "last_fwd"]
    inner = busy[cols].assign(
        start_ms=reach.groupby(keys).shift(1).fillna(win_start),
        end_ms=busy["start_ms"],
        before=busy["short"],
        after=busy["short"].groupby(keys).shift(1).fillna(""),
        next_kind=busy["kind"],
        prev_kind=busy["kind"].groupby(keys).shift(1).fillna(""),
        win_end=win_end,
    )
    last = ~busy.duplicated(["step", "rank"], keep="last")
    trailing = busy.loc[last, cols].assign(
        pos=busy["n"][last],
        start_ms=reach[last],
        end_ms=span_end[last],
        before="",
        after=busy["short"][last],
        next_kind="",
        prev_kind=busy["kind"][last],
        win_end=win_end[last],
    )
    g = pd.concat([inner, trailing], ignore_index=True)
    cross = (g["start_ms"] < g["win_end"]) & (g["end_ms"] > g["win_end"])
    head = g[cross].assign(end_ms=g["win_end"][cross], before="")
    tail = g[cross].assign(start_ms=g["win_end"][cross], after="")
    g = pd.concat([g[~cross], head, tail], ignore_index=True)
    g["boundary"] = g["start_ms"] >= g["win_end"]
    g["duration_ms"] = g["end_ms"] - g["start_ms"]
    return g


def freeride_labels(g: pd.DataFrame, n_stages: int) -> pd.Series:
    """A-D per gap of a 1F1B step ([Note: FreeRide labels]); NaN where none applies."""
    s = g["stage"]
    is_end = g["pos"].eq(g["n"])
    inner_stage = s <= n_stages - 2
    next_bwd = g["next_kind"].isin(BACKWARDS)
    prev_bwd = g["prev_kind"].isin(BACKWARDS)
    labels = np.select(
        [
            g["boundary"] & (s >= 1),
            g["pos"].eq(0) & ~is_end & (s >= 1),
            is_end & (s == n_stages - 1) & (n_stages >= 2),
            is_end & (s >= 1) & inner_stage,
            next_bwd & g["pos"].eq(g["first_bwd"]) & g["prev_kind"].eq("F") & inner_stage,
            next_bwd & prev_bwd & inner_stage,
        ],
        ["A", "A", "A", "C", "B", "D"],
        default="",
    )
    return pd.Series(labels, index=g.index).replace("", np.nan)


def complete_groups(a: pd.DataFrame, g: pd.DataFrame, microbatches: int | None) -> pd.Series:
    """True for gaps whose (step, rank) ran exactly ``microbatches`` forwards (all if None)."""
    if microbatches is None:
        return pd.Series(True, index=g.index)
    forwards = a["action"].eq("F").groupby([a["step"], a["rank"]]).sum()
    ok = forwards[forwards == microbatches].index
    return pd.Series(pd.MultiIndex.from_frame(g[["step", "rank"]]).isin(ok), index=g.index)
