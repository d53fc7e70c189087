"""The tables a run's report shows: bubbles and step times per rank, what side tasks cost.

Pure functions over a run's tables (pandas in, pandas or a dict out), so a report, a notebook
and a test read the same numbers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from freeride_lab.core.attribution import PART_COLUMNS
from freeride_lab.core.budget import overrun_mask
from freeride_lab.core.intervals import mean_interval, quotient_interval

__all__ = ["as_frame", "bubble_table", "failed_tasks", "label_table", "overheads", "step_table"]

#: Columns of :func:`failed_tasks`, in order.
FAILED_COLUMNS = ["id", "name", "stage", "error"]


def as_frame(value: Any) -> pd.DataFrame | None:
    """A DataFrame from a frame, a dataclass or a mapping (scalars make one row)."""
    if value is None:
        return None
    if isinstance(value, pd.DataFrame):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, Mapping):
        if all(not isinstance(v, list | tuple | Mapping) for v in value.values()):
            return pd.DataFrame([dict(value)])
        return pd.DataFrame(value)
    raise TypeError(f"expected a DataFrame, a dataclass or a mapping, got {type(value).__name__}")


def bubble_table(bubbles: pd.DataFrame, summary: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per rank: steps, bubbles per step, bubble ms per step, mean bubble ms, measured/theory frac.

    Columns (in order): rank, steps, bubbles_per_step, bubble_ms_per_step, mean_bubble_ms;
    schedule_ms_per_step, peer_ms_per_step, host_ms_per_step when ``bubbles`` carries
    ``core.attribution``'s parts (why the bubbles are there); and ``measured_frac``/
    ``theory_frac`` when ``summary`` has them.
    """
    grouped = bubbles.groupby("rank", sort=True)
    n_steps = grouped["step"].nunique()
    columns = {
        "steps": n_steps,
        "bubbles_per_step": grouped.size() / n_steps,
        "bubble_ms_per_step": grouped["duration_ms"].sum() / n_steps,
        "mean_bubble_ms": grouped["duration_ms"].mean(),
    }
    if set(PART_COLUMNS) <= set(bubbles.columns):
        for part in PART_COLUMNS:
            columns[part.replace("_ms", "_ms_per_step")] = grouped[part].sum(min_count=1) / n_steps
    out = pd.DataFrame(columns).reset_index()
    if summary is not None and {"rank", "measured_frac", "theory_frac"} <= set(summary.columns):
        fractions = summary[["rank", "measured_frac", "theory_frac"]]
        out = out.merge(fractions, on="rank", how="outer").sort_values("rank")
    return out.reset_index(drop=True)


def label_table(bubbles: pd.DataFrame) -> pd.DataFrame:
    """Mean bubble ms per rank and label (or kind, where unlabelled), one column per label."""
    if bubbles.empty:
        return pd.DataFrame()
    labels = bubbles["label"] if "label" in bubbles else pd.Series(None, index=bubbles.index)
    name = labels.where(labels.notna() & (labels != ""), bubbles["kind"]).astype(str)
    pivot = bubbles.assign(bubble=name).pivot_table(
        index="rank", columns="bubble", values="duration_ms", aggfunc="mean"
    )
    pivot.columns = [f"{c}_ms" for c in pivot.columns]
    return pivot.reset_index()


def step_table(steps: pd.DataFrame) -> pd.DataFrame:
    """Per rank: steps, step-time p50/p95/mean ms (the first step, warm-up, is left out if > 1)."""
    if steps.empty:
        return pd.DataFrame(columns=["rank", "steps", "p50_ms", "p95_ms", "mean_ms"])
    first = steps["step"].min()
    body = steps[steps["step"] > first] if steps["step"].nunique() > 1 else steps
    grouped = body.groupby("rank", sort=True)["duration_ms"]
    return pd.DataFrame(
        {
            "steps": grouped.size(),
            "p50_ms": grouped.quantile(0.5),
            "p95_ms": grouped.quantile(0.95),
            "mean_ms": grouped.mean(),
        }
    ).reset_index()


def overheads(steps: pd.DataFrame, side_task_steps: pd.DataFrame) -> dict[str, float]:
    """What side tasks cost the training run, from its own tables.

    A step's time is its slowest rank's ``duration_ms``; steps that hosted a side-task step are
    compared with those that did not (the first step, warm-up, is left out when there are more).
    Keys: steps_without_side_tasks, steps_with_side_tasks, step_p50_ms_without_side_tasks,
    step_p50_ms_with_side_tasks, training_overhead_frac (ratio of the medians - 1; NaN without
    both kinds of step), training_overhead_mean_frac with training_overhead_lo_frac and
    training_overhead_hi_frac (ratio of the mean step times - 1 and its 95% interval, which
    needs two steps of each kind), side_task_steps, side_task_overruns, side_task_overrun_ms.
    """
    nan = math.nan
    per_step = steps.groupby("step")["duration_ms"].max() if len(steps) else pd.Series(dtype=float)
    if len(per_step) > 1:
        per_step = per_step.iloc[1:]
    hosted = set(side_task_steps["step"].astype(int)) if len(side_task_steps) else set()
    with_tasks = per_step[per_step.index.isin(hosted)]
    without = per_step[~per_step.index.isin(hosted)]
    p50_with = float(with_tasks.median()) if len(with_tasks) else nan
    p50_without = float(without.median()) if len(without) else nan
    ratio = quotient_interval(
        mean_interval(list(with_tasks.dropna())), mean_interval(list(without.dropna()))
    )
    overrun = (
        side_task_steps["overrun_ms"].fillna(0.0)
        if "overrun_ms" in side_task_steps
        else pd.Series(dtype=float)
    )
    return {
        "steps_without_side_tasks": float(len(without)),
        "steps_with_side_tasks": float(len(with_tasks)),
        "step_p50_ms_without_side_tasks": p50_without,
        "step_p50_ms_with_side_tasks": p50_with,
        "training_overhead_frac": p50_with / p50_without - 1 if p50_without > 0 else nan,
        "training_overhead_mean_frac": ratio.value - 1,
        "training_overhead_lo_frac": ratio.lo - 1,
        "training_overhead_hi_frac": ratio.hi - 1,
        "side_task_steps": float(len(side_task_steps)),
        "side_task_overruns": float(overrun_mask(overrun).sum()),
        "side_task_overrun_ms": float(overrun.sum()),
    }


def failed_tasks(tasks: Any) -> pd.DataFrame:
    """The side tasks that failed, with their error: id, name, stage, error.

    ``tasks`` is ``Session.tasks`` (a list of task dicts) or a frame of them; tasks in any
    other state are left out.
    """
    rows = tasks.to_dict("records") if isinstance(tasks, pd.DataFrame) else list(tasks or [])
    failed = [
        {
            "id": str(t.get("id", "")),
            "name": str(t.get("name", "")),
            "stage": t.get("stage"),
            "error": str(t.get("error") or t.get("reason") or "no error message recorded"),
        }
        for t in rows
        if str(t.get("state", "")).upper() == "FAILED"
    ]
    return pd.DataFrame(failed, columns=FAILED_COLUMNS)
