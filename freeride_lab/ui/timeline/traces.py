"""The timeline's data: one :class:`BarTrace` of float64 arrays per category, from the tables.

Each category (compute kinds F/B/I/W, bubbles, each side task, overruns) is one trace, so a redraw
swaps arrays and never adds shapes. A side task's legend name is its label (``SGD-MF``); its
hover gives label, code name and task id, so both spellings and the id are one hover away.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from freeride_lab.core.attribution import PART_COLUMNS
from freeride_lab.ui.names import task_caption, task_label
from freeride_lab.ui.timeline.style import (
    BUBBLE,
    COMPUTE,
    OVERRUN,
    Category,
    side_task_category,
)

__all__ = [
    "SIDE_TASK_COLUMNS",
    "BarTrace",
    "safe_text",
    "side_task_names",
    "steps_in_window",
    "timeline_traces",
]


@dataclass(frozen=True)
class BarTrace:
    """Arrays of one timeline trace (one category); times in ms from run start."""

    category: Category
    base: np.ndarray  # float64 start_ms
    x: np.ndarray  # float64 duration_ms
    y: np.ndarray  # float64 rank (lane)
    customdata: np.ndarray  # object rows of pre-formatted hover fields

    @property
    def name(self) -> str:
        return self.category.name


def _f64(values: Any) -> np.ndarray:
    return np.asarray(values, dtype=np.float64)


def _ms(values: Any) -> list[str]:
    return [f"{v:.2f}" if pd.notna(v) else "-" for v in values]


def _rows(*columns: Sequence[Any]) -> np.ndarray:
    """Hover fields as an object array, one row per bar."""
    data = np.empty((len(columns[0]), len(columns)), dtype=object)
    for j, column in enumerate(columns):
        data[:, j] = list(column)
    return data


def safe_text(value: Any) -> str:
    """A user-provided string made safe for plotly's pseudo-HTML (hover, legend); NaN/None → ""."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return html.escape(str(value), quote=False)


def _bar(
    category: Category, frame: pd.DataFrame, base: Any, x: Any, custom: np.ndarray
) -> BarTrace:
    return BarTrace(category, _f64(base), _f64(x), _f64(frame["rank"]), custom)


def _action_trace(kind: str, f: pd.DataFrame) -> BarTrace:
    short = [f"{int(s)}{kind}{int(m)}" for s, m in zip(f["stage"], f["microbatch"], strict=True)]
    ints = f["step"].astype(int), f["rank"].astype(int)
    custom = _rows(short, ints[0], _ms(f["duration_ms"]), _ms(f["start_ms"]), ints[1])
    return _bar(COMPUTE[kind], f, f["start_ms"], f["duration_ms"], custom)


def _column(f: pd.DataFrame, name: str) -> list[Any]:
    return list(f[name]) if name in f else [None] * len(f)


def _bubble_trace(f: pd.DataFrame) -> BarTrace:
    labels = [
        safe_text(label) if isinstance(label, str) and label else safe_text(kind)
        for label, kind in zip(_column(f, "label"), f["kind"], strict=True)
    ]
    predicted_col = next((c for c in ("predicted_duration_ms", "predicted_ms") if c in f), None)
    predicted = _ms(f[predicted_col]) if predicted_col else ["-"] * len(f)
    between = [
        f"{safe_text(a) or 'start'} → {safe_text(b) or 'end'}"
        for a, b in zip(_column(f, "after"), _column(f, "before"), strict=True)
    ]
    kinds = [safe_text(k) for k in f["kind"]]
    custom = _rows(
        labels,
        kinds,
        f["step"].astype(int),
        _ms(f["duration_ms"]),
        predicted,
        between,
        f["rank"].astype(int),
        _split(f),
    )
    return _bar(BUBBLE, f, f["start_ms"], f["duration_ms"], custom)


def _split(f: pd.DataFrame) -> list[str]:
    """Hover line of each bubble's attribution (``core.attribution``); "" where unknown."""
    if not set(PART_COLUMNS) <= set(f.columns):
        return [""] * len(f)
    return [
        f"<br>schedule {s:.2f} · peer {p:.2f} · host {h:.2f} ms"
        if pd.notna(s) and pd.notna(p) and pd.notna(h)
        else ""
        for s, p, h in zip(f["schedule_ms"], f["peer_ms"], f["host_ms"], strict=True)
    ]


def _side_trace(category: Category, f: pd.DataFrame) -> BarTrace:
    progress = [
        f"{p:g} {safe_text(u)}".strip() if pd.notna(p) else "-"
        for p, u in zip(f["progress"], _column(f, "unit"), strict=True)
    ]
    captions = [
        safe_text(task_caption(str(n), str(i) if pd.notna(i) else None))
        for n, i in zip(f["name"], _column(f, "task_id"), strict=True)
    ]
    custom = _rows(
        captions,
        f["step"].astype(int),
        _ms(f["duration_ms"]),
        progress,
        _ms(f["overrun_ms"].fillna(0.0)),
        f["rank"].astype(int),
    )
    return _bar(category, f, f["start_ms"], f["duration_ms"], custom)


def _overrun_trace(f: pd.DataFrame) -> BarTrace:
    over = f[f["overrun_ms"].fillna(0.0) > 0]
    names = [safe_text(task_label(str(n))) for n in over["name"]]
    custom = _rows(
        names, over["step"].astype(int), _ms(over["overrun_ms"]), over["rank"].astype(int)
    )
    return _bar(OVERRUN, over, over["end_ms"] - over["overrun_ms"], over["overrun_ms"], custom)


SIDE_TASK_COLUMNS = ["task_id", "name", "stage", "rank", "step", "start_ms", "end_ms"]
SIDE_TASK_COLUMNS += ["duration_ms", "progress", "unit", "overrun_ms"]


def _side_frame(side_task_steps: pd.DataFrame | None) -> pd.DataFrame:
    """The side-task steps, or an empty frame with their columns; overrun_ms defaults to 0."""
    if side_task_steps is None:
        return pd.DataFrame(columns=SIDE_TASK_COLUMNS)
    if "overrun_ms" not in side_task_steps:
        return side_task_steps.assign(overrun_ms=0.0)
    return side_task_steps


def side_task_names(side_task_steps: pd.DataFrame | None) -> list[str]:
    """Side-task names in order of first appearance."""
    return [] if side_task_steps is None else [str(n) for n in pd.unique(side_task_steps["name"])]


def timeline_traces(
    actions: pd.DataFrame,
    bubbles: pd.DataFrame,
    side_task_steps: pd.DataFrame | None = None,
    *,
    side_task_order: Sequence[str] = (),
) -> list[BarTrace]:
    """Traces in drawing order: F, B, I, W, bubble, one per side task, overrun.

    ``side_task_order`` fixes the colours of tasks already shown; new names follow it.
    """
    side = _side_frame(side_task_steps)
    traces = [_action_trace(k, actions[actions["action"] == k]) for k in COMPUTE]
    traces.append(_bubble_trace(bubbles))
    names = list(dict.fromkeys([*side_task_order, *side_task_names(side)]))
    for i, name in enumerate(names):
        category = side_task_category(i, safe_text(task_label(name)))
        traces.append(_side_trace(category, side[side["name"] == name]))
    traces.append(_overrun_trace(side))
    return traces


def steps_in_window(steps: Sequence[int], last: int, selected: int | None = None) -> list[int]:
    """The steps to draw: ``[selected]`` if given, else the ``last`` highest steps."""
    if selected is not None:
        return [selected]
    return sorted(set(steps))[-last:] if last > 0 else []


def in_steps(frame: pd.DataFrame | None, steps: Sequence[int]) -> pd.DataFrame | None:
    return None if frame is None else frame[frame["step"].isin(steps)]


def lane_ranks(actions: pd.DataFrame, bubbles: pd.DataFrame) -> list[int]:
    found = np.concatenate([_f64(actions["rank"]), _f64(bubbles["rank"])])
    return [int(r) for r in np.unique(found[~np.isnan(found)])]


def table_steps(actions: pd.DataFrame, bubbles: pd.DataFrame) -> list[int]:
    found = np.concatenate([_f64(actions["step"]), _f64(bubbles["step"])])
    return [int(s) for s in np.unique(found[~np.isnan(found)])]
