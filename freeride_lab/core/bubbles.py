"""Bubbles: idle gaps of each rank inside a step, their FreeRide labels, and predictions.

Everything here is a pure function over the ``actions`` table (one row per timed compute
action; columns step, rank, stage, action, microbatch, start_ms, end_ms, …), so it runs the
same on an idealised timeline, a finished run or a live partial one.

Idle time follows Holistic Trace Analysis: idle = window - merged busy time. The window is
the **global** window of a step (earliest action start on any rank → latest action end on any
rank); per-rank windows give fractions that fall with rank index and must never be compared
with ``theory_bubble_fraction``.

The step boundary ([Note: step boundary bubbles]), the busy spans and the gaps between them
and the FreeRide labels ([Note: FreeRide labels]) are in ``core.bubble_spans``.

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

from freeride_lab.core.bubble_prediction import check_length, percentile_of_sorted
from freeride_lab.core.bubble_spans import (
    OPTIMIZER_COLUMNS,
    busy_spans,
    complete_groups,
    freeride_labels,
    gaps,
)
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
        schedule: labels A-D are set only for 1F1B (see [Note: FreeRide labels] in
            ``core.bubble_spans``); other schedules and None leave ``label`` NaN.
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
        _require(steps, OPTIMIZER_COLUMNS, "steps")
    if min_ms < 0 or not math.isfinite(min_ms):
        raise ValueError(f"min_ms={min_ms} must be a finite number >= 0; use 0.0 to keep all gaps")
    spec = Schedule.from_name(schedule) if schedule is not None else None
    if spec is not None:
        spec.resolve_chunks(chunks)
    if actions.empty:
        return _empty(_BUBBLE_SCHEMA)

    a = _sorted_actions(actions)
    busy = busy_spans(a, steps)
    g = gaps(busy, step_windows(a).set_index("step"), to_next_window=steps is not None)
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
        complete = complete_groups(a, g, microbatches)
        g["label"] = freeride_labels(g, n_stages).where(complete)
    return _typed(g, _BUBBLE_SCHEMA)


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
        check_length(slot, duration_ns)
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
        return percentile_of_sorted(sorted(history), self.q)

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
