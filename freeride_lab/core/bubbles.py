"""Bubbles: idle gaps of each rank inside a step, their FreeRide labels, and predictions.

Everything here is a pure function over the ``actions`` table (one row per timed compute
action; columns step, rank, stage, action, microbatch, start_ms, end_ms, …), so it runs the
same on an idealised timeline, a finished run or a live partial one.

Idle time follows Holistic Trace Analysis: idle = window - merged busy time. The window is
the **global** window of a step (earliest action start on any rank → latest action end on any
rank); per-rank windows give fractions that fall with rank index and must never be compared
with ``theory_bubble_fraction``.

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

    >>> import pandas as pd
    >>> acts = pd.DataFrame({"step": [0, 0], "rank": [0, 1], "stage": [0, 1],
    ...                      "action": ["F", "F"], "microbatch": [0, 0],
    ...                      "start_ms": [0.0, 1.0], "end_ms": [1.0, 2.0]})
    >>> extract_bubbles(acts)[["rank", "start_ms", "end_ms", "kind"]].to_dict("records")
    [{'rank': 0, 'start_ms': 1.0, 'end_ms': 2.0, 'kind': 'end'}, {'rank': 1, 'start_ms': 0.0, 'end_ms': 1.0, 'kind': 'warmup'}]
"""  # noqa: E501

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Mapping
from typing import Literal

import numpy as np
import pandas as pd

from freeride_lab.core.schedule import Schedule
from freeride_lab.core.theory import NO_FORMULA, theory_bubble_fraction

__all__ = [
    "BUBBLE_COLUMNS",
    "SlotPredictor",
    "bubble_fraction",
    "extract_bubbles",
    "free_memory",
    "predict_bubbles",
    "step_windows",
    "summary",
]

Method = Literal["min", "percentile"]

# pandas' string dtype ("str", NaN for missing) on pandas >= 3; object before (where
# astype("str") would turn NaN into "nan").
_STR = "str" if int(pd.__version__.split(".")[0]) >= 3 else "object"

_ACTION_COLUMNS = ("step", "rank", "stage", "action", "microbatch", "start_ms", "end_ms")
_OPTIMIZER_COLUMNS = ("step", "rank", "optimizer_start_ms", "optimizer_end_ms")
_BACKWARDS = ("B", "I")  # backward-type actions that start a rank's backward phase

_WINDOW_SCHEMA: dict[str, str] = {
    "step": "int64",
    "start_ms": "float64",
    "end_ms": "float64",
    "duration_ms": "float64",
}
_BUBBLE_SCHEMA: dict[str, str] = {
    "step": "int64",
    "rank": "int64",
    "stage": "int64",
    "slot": "int64",
    "start_ms": "float64",
    "end_ms": "float64",
    "duration_ms": "float64",
    "kind": _STR,
    "label": _STR,
    "before": _STR,
    "after": _STR,
}
BUBBLE_COLUMNS: tuple[str, ...] = tuple(_BUBBLE_SCHEMA)
_FRACTION_SCHEMA: dict[str, str] = {
    "rank": "int64",
    "step": "int64",
    "window_ms": "float64",
    "busy_ms": "float64",
    "idle_ms": "float64",
    "idle_frac": "float64",
}
_SUMMARY_SCHEMA: dict[str, str] = {
    "rank": "int64",
    "stage": "int64",
    "measured_frac": "float64",
    "theory_frac": "float64",
    "delta_pts": "float64",
    "largest_gap_ms": "float64",
    "n_bubbles": "float64",
}
_PREDICTION_SCHEMA: dict[str, str] = {
    "rank": "int64",
    "slot": "int64",
    "label": _STR,
    "predicted_ms": "float64",
    "n": "int64",
}
_MEMORY_COLUMNS = ("rank", "step", "peak_reserved_bytes", "capacity_bytes")
_FREE_SCHEMA: dict[str, str] = {
    "rank": "int64",
    "capacity_bytes": "int64",
    "peak_reserved_bytes": "int64",
    "free_bytes": "int64",
}


def step_windows(actions: pd.DataFrame) -> pd.DataFrame:
    """The global window of each step: earliest action start → latest action end, any rank.

    Columns, in order: step (int64), start_ms, end_ms, duration_ms (float64); one row per
    step, ascending.
    """
    _require(actions, ("step", "start_ms", "end_ms"), "actions")
    if actions.empty:
        return _empty(_WINDOW_SCHEMA)
    w = actions.groupby("step", sort=True).agg(
        start_ms=("start_ms", "min"), end_ms=("end_ms", "max")
    )
    w["duration_ms"] = w["end_ms"] - w["start_ms"]
    return _typed(w.reset_index(), _WINDOW_SCHEMA)


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


def extract_bubbles(
    actions: pd.DataFrame,
    *,
    steps: pd.DataFrame | None = None,
    schedule: str | None = None,
    stages: int | None = None,
    microbatches: int | None = None,
    chunks: int | None = None,
    min_ms: float = 0.0,
) -> pd.DataFrame:
    """Idle gaps of each rank in each step, in time order.

    Without ``steps`` the gaps lie inside each step's global window: for each (step, rank),
    window start → first action, between consecutive actions (overlapping actions are merged),
    last action → window end. With ``steps`` the table is complete (see [Note: step boundary
    bubbles]): each rank's optimizer counts as busy, and the idle from the window end to the
    next step's window start is added as "boundary" gaps. Only gaps longer than ``min_ms`` are
    kept; real runs have sub-ms dispatch and communication gaps between every pair of actions,
    so pass e.g. ``min_ms=1.0`` to keep only schedule bubbles.

    With ``steps`` and ``min_ms=0``, per (step, rank): merged actions + optimizer + the gaps'
    ``duration_ms`` = the step's span, from its window start to the next step's window start
    (for the last recorded step: to the later of its window end and the rank's optimizer end),
    and no gap overlaps an action or the optimizer. Steps must not overlap in time (in a run
    every rank's step s ends before any rank's step s+1 starts: the ranks agree on stopping
    in between).

    ``kind`` says where a gap sits in the rank's step ("backward-type" = B or I):

    - "boundary": after the step's window end (needs ``steps``);
    - "end": after the rank's last action, up to the window end;
    - "warmup": before the rank's first backward-type action starts (every gap when the
      rank runs no backward);
    - "cooldown": after the rank's last forward ended;
    - "steady": between the two (after the first backward started, before the last forward).

    Args:
        steps: the run's steps table (``lab.tables.steps_frame``): columns step, rank,
            optimizer_start_ms, optimizer_end_ms (same clock as ``actions``; NaN: unknown).
            None keeps to the windows, as ``bubble_fraction`` and ``summary`` do.
        schedule: labels A-D are set only for 1F1B (see [Note: FreeRide labels] in this
            module); other schedules and None leave ``label`` NaN.
        stages: pipeline ranks S (to know the last stage); None infers max(stage) + 1.
        microbatches: when given, a (step, rank) with fewer or more forwards than
            ``microbatches`` (e.g. a step still in progress) is left unlabelled.
        chunks: checked against the schedule (``Schedule.resolve_chunks``).
        min_ms: keep gaps with duration_ms > min_ms (>= 0).

    Returns:
        Columns, in order: step, rank, stage (the rank's lowest stage index), slot (0-based
        index of the gap among the rank's kept gaps in the step, in time order) (int64);
        start_ms, end_ms, duration_ms (float64); kind, label ("A".."D" or NaN), before
        (short form of the action after the gap, e.g. "1B0", or "optimizer"; "" when the gap
        ends at a window edge), after (the same for what precedes the gap; "" when it starts
        at a window edge) (str). Sorted by step, rank, start_ms.

    Raises:
        ValueError: missing columns, negative ``min_ms``, an unknown schedule / chunks, or
            ``stages`` below a stage present in ``actions``.
    """
    _require(actions, _ACTION_COLUMNS, "actions")
    if steps is not None:
        _require(steps, _OPTIMIZER_COLUMNS, "steps")
    if min_ms < 0 or not math.isfinite(min_ms):
        raise ValueError(f"min_ms={min_ms} must be a finite number >= 0; use 0.0 to keep all gaps")
    spec = Schedule.from_name(schedule) if schedule is not None else None
    if spec is not None:
        spec.resolve_chunks(chunks)
    if actions.empty:
        return _empty(_BUBBLE_SCHEMA)

    a = _sorted_actions(actions)
    keys = [a["step"], a["rank"]]
    pos = a.groupby(keys, sort=False).cumcount()
    n = pos.groupby(keys).transform("size")
    is_fwd = a["action"].eq("F")
    is_bwd = a["action"].isin(_BACKWARDS)
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
        busy = pd.concat([busy, _optimizer_spans(steps, busy)], ignore_index=True)
        busy = busy.sort_values(["step", "rank", "start_ms", "end_ms"], kind="stable")
        busy = busy.reset_index(drop=True)

    g = _gaps(busy, step_windows(a).set_index("step"), to_next_window=steps is not None)
    g = g[g["duration_ms"] > min_ms]
    g = g.sort_values(["step", "rank", "start_ms"], kind="stable").reset_index(drop=True)

    rank_stage = a.groupby("rank")["stage"].min()
    g["stage"] = g["rank"].map(rank_stage)
    g["slot"] = g.groupby(["step", "rank"], sort=False).cumcount()
    is_end = g["pos"].eq(g["n"])
    g["kind"] = np.select(
        [g["boundary"], is_end, g["pos"] <= g["first_bwd"], g["pos"] > g["last_fwd"]],
        ["boundary", "end", "warmup", "cooldown"],
        "steady",
    )
    g["label"] = np.nan
    if spec is not None and spec.name == "1F1B":
        n_stages = int(a["stage"].max()) + 1 if stages is None else stages
        if n_stages < int(a["stage"].max()) + 1:
            raise ValueError(
                f"stages={stages} but actions hold stage {int(a['stage'].max())}; pass the "
                "run's pipeline ranks (RunConfig.stages) or None to infer it"
            )
        complete = _complete_groups(a, g, microbatches)
        g["label"] = _freeride_labels(g, n_stages).where(complete)
    return _typed(g, _BUBBLE_SCHEMA)


def _optimizer_spans(steps: pd.DataFrame, busy: pd.DataFrame) -> pd.DataFrame:
    """Busy rows for the optimizer of each (step, rank) that has actions; after every action."""
    per_rank = busy.groupby(["step", "rank"], sort=False)[["n", "first_bwd", "last_fwd"]].first()
    o = steps[list(_OPTIMIZER_COLUMNS)].copy()
    o["start_ms"] = pd.to_numeric(o["optimizer_start_ms"], errors="coerce")
    o["end_ms"] = pd.to_numeric(o["optimizer_end_ms"], errors="coerce")
    o = o[o["start_ms"].notna() & (o["end_ms"] >= o["start_ms"])]
    o = o.astype({"step": "int64", "rank": "int64"}).drop_duplicates(["step", "rank"], keep="last")
    o = o.join(per_rank, on=["step", "rank"], how="inner")
    o["pos"] = o["n"]
    o["short"] = "optimizer"
    o["kind"] = "optimizer"
    return o[list(busy.columns)]


def _gaps(busy: pd.DataFrame, windows: pd.DataFrame, *, to_next_window: bool) -> pd.DataFrame:
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


def _freeride_labels(g: pd.DataFrame, n_stages: int) -> pd.Series:
    """A-D per gap of a 1F1B step (see [Note: FreeRide labels]); NaN where none applies."""
    s = g["stage"]
    is_end = g["pos"].eq(g["n"])
    inner_stage = s <= n_stages - 2
    next_bwd = g["next_kind"].isin(_BACKWARDS)
    prev_bwd = g["prev_kind"].isin(_BACKWARDS)
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


def _complete_groups(a: pd.DataFrame, g: pd.DataFrame, microbatches: int | None) -> pd.Series:
    """True for gaps whose (step, rank) ran exactly ``microbatches`` forwards (all if None)."""
    if microbatches is None:
        return pd.Series(True, index=g.index)
    forwards = a["action"].eq("F").groupby([a["step"], a["rank"]]).sum()
    ok = forwards[forwards == microbatches].index
    return pd.Series(pd.MultiIndex.from_frame(g[["step", "rank"]]).isin(ok), index=g.index)


def bubble_fraction(actions: pd.DataFrame) -> pd.DataFrame:
    """Idle share of each rank in each step's global window (HTA's idle time).

    idle_ms = window_ms - busy_ms, where busy_ms is the union of the rank's action intervals
    (overlapping actions counted once); idle_frac = idle_ms / window_ms (NaN for an empty
    window). Equals the summed ``duration_ms`` of ``extract_bubbles(actions)`` (no ``steps``:
    window gaps only) per (step, rank).

    Columns, in order: rank, step (int64), window_ms, busy_ms, idle_ms, idle_frac (float64).
    Sorted by rank, step.
    """
    _require(actions, ("step", "rank", "start_ms", "end_ms"), "actions")
    if actions.empty:
        return _empty(_FRACTION_SCHEMA)
    a = actions[["step", "rank", "start_ms", "end_ms"]].sort_values(
        ["step", "rank", "start_ms", "end_ms"], kind="stable"
    )
    keys = [a["step"], a["rank"]]
    prev_reach = a["end_ms"].groupby(keys).cummax().groupby(keys).shift(1)
    own_start = np.maximum(a["start_ms"], prev_reach.fillna(-np.inf))
    busy = (a["end_ms"] - own_start).clip(lower=0.0).groupby(keys).sum().rename("busy_ms")
    f = busy.reset_index()
    win = step_windows(a).set_index("step")
    f["window_ms"] = f["step"].map(win["duration_ms"])
    f["idle_ms"] = f["window_ms"] - f["busy_ms"]
    f["idle_frac"] = f["idle_ms"] / f["window_ms"].where(f["window_ms"] > 0)
    f = f.sort_values(["rank", "step"], kind="stable")
    return _typed(f, _FRACTION_SCHEMA)


def summary(
    actions: pd.DataFrame,
    schedule: str,
    stages: int,
    microbatches: int,
    chunks: int | None = None,
    *,
    skip_steps: int = 1,
    min_ms: float = 0.0,
) -> pd.DataFrame:
    """Measured vs theory bubble fraction per rank, averaged over steps after ``skip_steps``.

    The first ``skip_steps`` recorded steps (warm-up: allocation, first-call overheads) are
    left out; the rest are averaged. The zero-bubble formula gets the measured medians of
    F, I (or B) and W durations as its costs.

    Columns, in order: rank, stage (the rank's lowest stage) (int64); measured_frac (mean
    ``idle_frac``), theory_frac (NaN for DualPipeV), delta_pts ((measured - theory) * 100),
    largest_gap_ms (mean over steps of the rank's longest gap), n_bubbles (mean gaps per
    step longer than ``min_ms``) (float64). Sorted by rank.

    Raises:
        ValueError: ``skip_steps`` < 0 or leaving no step, or an invalid schedule/sizes.
    """
    _require(actions, _ACTION_COLUMNS, "actions")
    if skip_steps < 0:
        raise ValueError(f"skip_steps={skip_steps} must be >= 0; use 0 to keep every step")
    spec = Schedule.from_name(schedule)
    if actions.empty:
        return _empty(_SUMMARY_SCHEMA)
    steps = np.sort(actions["step"].unique())
    if skip_steps >= len(steps):
        raise ValueError(
            f"skip_steps={skip_steps} leaves none of the {len(steps)} recorded step(s); "
            f"lower it (e.g. skip_steps={max(0, len(steps) - 1)}) or record more steps"
        )
    kept = actions[actions["step"].isin(steps[skip_steps:])]

    frac = bubble_fraction(kept)
    per_rank = frac.groupby("rank")["idle_frac"].mean().rename("measured_frac").to_frame()
    per_rank["stage"] = kept.groupby("rank")["stage"].min()

    b = extract_bubbles(kept, min_ms=min_ms)
    per_step = frac[["rank", "step"]].merge(
        b.groupby(["rank", "step"])["duration_ms"].agg(["max", "size"]).reset_index(),
        on=["rank", "step"],
        how="left",
    )
    per_step = per_step.fillna({"max": 0.0, "size": 0})
    gaps = per_step.groupby("rank")[["max", "size"]].mean()
    per_rank["largest_gap_ms"] = gaps["max"]
    per_rank["n_bubbles"] = gaps["size"]

    if spec.name in NO_FORMULA:
        theory = math.nan
    else:
        theory = theory_bubble_fraction(
            spec.name, stages, microbatches, chunks, **_measured_costs(kept)
        )
    per_rank["theory_frac"] = theory
    per_rank["delta_pts"] = (per_rank["measured_frac"] - theory) * 100.0
    return _typed(per_rank.reset_index().sort_values("rank"), _SUMMARY_SCHEMA)


def _measured_costs(actions: pd.DataFrame) -> dict[str, float]:
    """Median F, I (or full B) and W durations; 1.0 for a kind never run (W: 0 if B ran)."""
    med = (actions["end_ms"] - actions["start_ms"]).groupby(actions["action"].astype(str)).median()
    t_i = med.get("I", med.get("B", 1.0))
    t_w = med.get("W", 0.0 if "B" in med.index and "I" not in med.index else 1.0)
    costs = {
        "t_forward": float(med.get("F", 1.0)),
        "t_backward_input": float(t_i),
        "t_backward_weight": float(t_w),
    }
    if sum(costs.values()) <= 0:  # zero-length actions (a degenerate trace): fall back
        costs = dict.fromkeys(costs, 1.0)
    return costs


def predict_bubbles(
    bubbles: pd.DataFrame, *, k: int = 5, method: Method = "min", q: float = 10.0
) -> pd.DataFrame:
    """Predicted duration per (rank, slot) from its last ``k`` steps.

    ``method="min"`` takes the minimum (FreeRide's conservative choice); ``"percentile"``
    the ``q``-th percentile (linear interpolation, as ``SlotPredictor``).

    Columns, in order: rank, slot (int64), label (the most recent non-NaN one; str, NaN if
    none),
    predicted_ms (float64), n (int64, instances used, <= k). Sorted by rank, slot.

    Raises:
        ValueError: ``k`` < 1, unknown ``method`` or ``q`` outside [0, 100].
    """
    _check_predictor(k, method, q)
    _require(bubbles, ("step", "rank", "slot", "label", "duration_ms"), "bubbles")
    if bubbles.empty:
        return _empty(_PREDICTION_SCHEMA)
    b = bubbles.sort_values("step", kind="stable")
    recent = b.groupby(["rank", "slot"], sort=False).tail(k)
    grouped = recent.groupby(["rank", "slot"], sort=True)
    if method == "min":
        predicted = grouped["duration_ms"].min()
    else:
        predicted = grouped["duration_ms"].quantile(q / 100.0)
    p = pd.DataFrame(
        {
            "label": grouped["label"].last(),  # last non-NaN in step order
            "predicted_ms": predicted,
            "n": grouped["duration_ms"].size(),
        }
    ).reset_index()
    return _typed(p, _PREDICTION_SCHEMA)


class SlotPredictor:
    """Online bubble-length prediction per slot from its last ``k`` observations.

    Pure and O(k) per call (a small deque per slot, no clocks), for a rank's hot path::

        pred = SlotPredictor(k=5)
        pred.observe(slot=1, duration_ns=4_000_000)
        pred.predict(1)  # -> 4000000; None for a slot never seen

    ``method="min"`` predicts the minimum, ``"percentile"`` the ``q``-th percentile (linear
    interpolation, floored to whole ns) — the same numbers as ``predict_bubbles``.
    """

    __slots__ = ("_history", "k", "method", "q")

    def __init__(self, k: int = 5, method: Method = "min", q: float = 10.0) -> None:
        _check_predictor(k, method, q)
        self.k = k
        self.method: Method = method
        self.q = float(q)
        self._history: dict[Hashable, deque[int]] = {}

    def observe(self, slot: Hashable, duration_ns: int) -> None:
        """Record one measured bubble of ``slot`` (ns); the oldest beyond ``k`` is forgotten."""
        if duration_ns < 0:
            raise ValueError(
                f"duration_ns={duration_ns} < 0 for slot {slot!r}; pass end_ns - start_ns of "
                "the idle gap"
            )
        history = self._history.get(slot)
        if history is None:
            history = self._history[slot] = deque(maxlen=self.k)
        history.append(int(duration_ns))

    def predict(self, slot: Hashable) -> int | None:
        """Predicted duration of ``slot`` in ns, or None before its first observation."""
        history = self._history.get(slot)
        if not history:
            return None
        if self.method == "min":
            return min(history)
        values = sorted(history)
        at = (len(values) - 1) * self.q / 100.0
        lo = math.floor(at)
        hi = min(lo + 1, len(values) - 1)
        return math.floor(values[lo] + (values[hi] - values[lo]) * (at - lo))

    def __repr__(self) -> str:
        return (
            f"SlotPredictor(k={self.k}, method={self.method!r}, q={self.q:g}, "
            f"slots={len(self._history)})"
        )


def free_memory(memory_reports: pd.DataFrame) -> pd.DataFrame:
    """Device memory a side task could use per rank: capacity - the run's peak reserved.

    ``capacity_bytes`` is the smallest reported capacity of the rank (conservative),
    ``peak_reserved_bytes`` the largest peak over all steps; ``free_bytes`` is their
    difference, floored at 0.

    Columns, in order: rank, capacity_bytes, peak_reserved_bytes, free_bytes (int64).
    Sorted by rank.
    """
    _require(memory_reports, _MEMORY_COLUMNS, "memory_reports")
    if memory_reports.empty:
        return _empty(_FREE_SCHEMA)
    f = memory_reports.groupby("rank", sort=True).agg(
        capacity_bytes=("capacity_bytes", "min"),
        peak_reserved_bytes=("peak_reserved_bytes", "max"),
    )
    f["free_bytes"] = (f["capacity_bytes"] - f["peak_reserved_bytes"]).clip(lower=0)
    return _typed(f.reset_index(), _FREE_SCHEMA)


def _sorted_actions(actions: pd.DataFrame) -> pd.DataFrame:
    a = actions[list(_ACTION_COLUMNS)].copy()
    a["action"] = a["action"].astype(str)
    return a.sort_values(["step", "rank", "start_ms", "end_ms"], kind="stable").reset_index(
        drop=True
    )


def _check_predictor(k: int, method: str, q: float) -> None:
    if k < 1:
        raise ValueError(f"k={k} must be >= 1 (steps of history per slot); the default is 5")
    if method not in ("min", "percentile"):
        raise ValueError(f"method={method!r} is unknown; valid: 'min', 'percentile'")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"q={q} must lie in [0, 100] (a percentile); the default is 10")


def _require(frame: pd.DataFrame, columns: tuple[str, ...], what: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(
            f"{what} lacks column(s) {missing}; needs {list(columns)} (has {list(frame.columns)})"
        )


def _empty(schema: Mapping[str, str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in schema.items()})


def _typed(frame: pd.DataFrame, schema: Mapping[str, str]) -> pd.DataFrame:
    out = frame[list(schema)].astype(dict(schema))
    return out.reset_index(drop=True)
