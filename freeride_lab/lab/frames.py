"""Events → DataFrames: the run's tables as pure functions of its events.

    actions_frame(events)        # one row per timed action
    steps_frame(events); memory_frame(events); side_task_steps_frame(events); events_frame(events)

``lab.tables.EventTables`` builds the same frames from its packed columns (``frame_of``).

Times: ``*_ns`` columns are the run clock in integer ns; ``*_ms`` columns are float ms from the
run start t0 = the earliest ``RankStarted.t_ns`` (or, without one, the earliest action start).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd

from freeride_lab.lab.event_columns import RAW_BY_KIND, Event

__all__ = [
    "ACTION_COLUMNS",
    "MEMORY_COLUMNS",
    "SIDE_TASK_STEP_COLUMNS",
    "STEP_COLUMNS",
    "actions_frame",
    "events_frame",
    "frame_of",
    "memory_frame",
    "run_start_ns",
    "side_task_steps_frame",
    "steps_frame",
]

# pandas' string dtype (NaN for missing) on pandas >= 3; object before.
_STR = "str" if int(pd.__version__.split(".")[0]) >= 3 else "object"
_NS = 1e6  # ns per ms

_ACTION_SCHEMA: dict[str, str] = {
    "step": "int64",
    "rank": "int64",
    "stage": "int64",
    "action": _STR,
    "microbatch": "int64",
    "start_ns": "int64",
    "end_ns": "int64",
    "start_ms": "float64",
    "end_ms": "float64",
    "duration_ms": "float64",
}
_STEP_SCHEMA: dict[str, str] = {
    "step": "int64",
    "rank": "int64",
    "start_ms": "float64",
    "end_ms": "float64",
    "duration_ms": "float64",
    "optimizer_ms": "float64",
    "loss": "float64",
    "tokens": "int64",
    "optimizer_start_ms": "float64",
    "optimizer_end_ms": "float64",
}
_MEMORY_SCHEMA: dict[str, str] = {
    "step": "int64",
    "rank": "int64",
    "device": _STR,
    "peak_reserved_bytes": "int64",
    "capacity_bytes": "int64",
    "peak_reserved_frac": "float64",
}
_SIDE_TASK_STEP_SCHEMA: dict[str, str] = {
    "task_id": _STR,
    "name": _STR,
    "stage": "int64",
    "rank": "int64",
    "step": "int64",
    "start_ms": "float64",
    "end_ms": "float64",
    "duration_ms": "float64",
    "progress": "float64",
    "unit": _STR,
    "overrun_ms": "float64",
    "seen_ms": "float64",
    "expected_ms": "float64",
    "spin_from_ms": "float64",
    "spin_until_ms": "float64",
    "guard_ms": "float64",
}
ACTION_COLUMNS: tuple[str, ...] = tuple(_ACTION_SCHEMA)
STEP_COLUMNS: tuple[str, ...] = tuple(_STEP_SCHEMA)
MEMORY_COLUMNS: tuple[str, ...] = tuple(_MEMORY_SCHEMA)
SIDE_TASK_STEP_COLUMNS: tuple[str, ...] = tuple(_SIDE_TASK_STEP_SCHEMA)


def run_start_ns(events: Iterable[Event]) -> int | None:
    """t0: the earliest ``rank_started`` time, else the earliest action start, else None."""
    started = [e["t_ns"] for e in events if e.get("kind") == "rank_started" and "t_ns" in e]
    if started:
        return int(min(started))
    starts = [e["start_ns"] for e in events if e.get("kind") == "action" and "start_ns" in e]
    return int(min(starts)) if starts else None


def actions_frame(events: Iterable[Event], t0_ns: int | None = None) -> pd.DataFrame:
    """One row per ``action`` event.

    Columns, in order: step, rank, stage (int64), action ("F"|"B"|"I"|"W"), microbatch,
    start_ns, end_ns (int64, run clock), start_ms, end_ms, duration_ms (float64, from t0).
    Sorted by step, rank, start_ns.
    """
    return _frame_of_events(events, "action", t0_ns)


def _actions_of(f: pd.DataFrame, t0_ns: int | None) -> pd.DataFrame:
    _span_ms(f, t0_ns)
    return _typed(f.sort_values(["step", "rank", "start_ns"], kind="stable"), _ACTION_SCHEMA)


def steps_frame(events: Iterable[Event], t0_ns: int | None = None) -> pd.DataFrame:
    """One row per (step, rank) ``step`` event.

    Columns, in order: step, rank (int64); start_ms, end_ms, duration_ms (the rank's schedule
    window), optimizer_ms, loss (NaN except on the last stage) (float64); tokens (int64);
    optimizer_start_ms, optimizer_end_ms (float64; what ``core.bubbles.extract_bubbles`` needs
    to count the optimizer as busy). Sorted by step, rank.
    """
    return _frame_of_events(events, "step", t0_ns)


def _steps_of(f: pd.DataFrame, t0_ns: int | None) -> pd.DataFrame:
    t0 = _span_ms(f, t0_ns)
    f["optimizer_ms"] = (f["optimizer_end_ns"] - f["optimizer_start_ns"]) / _NS
    f["optimizer_start_ms"] = (f["optimizer_start_ns"] - t0) / _NS
    f["optimizer_end_ms"] = (f["optimizer_end_ns"] - t0) / _NS
    f["loss"] = pd.to_numeric(f["loss"], errors="coerce")
    f["tokens"] = f["tokens"].fillna(0)
    return _typed(f.sort_values(["step", "rank"], kind="stable"), _STEP_SCHEMA)


def memory_frame(events: Iterable[Event]) -> pd.DataFrame:
    """One row per ``memory`` report.

    Columns, in order: step, rank (int64), device, peak_reserved_bytes, capacity_bytes
    (int64), peak_reserved_frac (float64, 0 to 1; NaN without a capacity). Sorted by step, rank.
    """
    return _frame_of_events(events, "memory", None)


def _memory_of(f: pd.DataFrame) -> pd.DataFrame:
    f["peak_reserved_frac"] = f["peak_reserved_bytes"] / f["capacity_bytes"].where(
        f["capacity_bytes"] > 0
    )
    return _typed(f.sort_values(["step", "rank"], kind="stable"), _MEMORY_SCHEMA)


def side_task_steps_frame(events: Iterable[Event], t0_ns: int | None = None) -> pd.DataFrame:
    """One row per ``side_task_step`` event.

    Columns, in order: task_id, name (str); stage, rank, step (int64); start_ms, end_ms,
    duration_ms, progress (in ``unit``, this step only) (float64); unit (str); overrun_ms
    (float64, how far the step ran past its bubble); seen_ms (float64: when its host saw the
    bubble edge the step answered, on the first step after an edge; NaN on the others);
    expected_ms, spin_from_ms, spin_until_ms (float64, on that first step too: when the host
    expected the bubble to start, and the spin window it waited with; NaN where it had no
    prediction or did not spin); guard_ms (float64, a duration: the guard the bubble's
    predicted remainder had to exceed for any step when this one was taken; NaN outside
    bubbles). Sorted by start_ms.
    """
    return _frame_of_events(events, "side_task_step", t0_ns)


def _side_task_steps_of(f: pd.DataFrame, t0_ns: int | None) -> pd.DataFrame:
    t0 = _span_ms(f, t0_ns)
    f["overrun_ms"] = f["overrun_ns"].fillna(0) / _NS
    for name in ("seen", "expected", "spin_from", "spin_until"):  # 0 or absent: not on this step
        t = f[f"{name}_ns"].fillna(0)
        f[f"{name}_ms"] = ((t - t0) / _NS).where(t > 0)
    guard = f["guard_ns"].fillna(0)
    f["guard_ms"] = (guard / _NS).where(guard > 0)
    return _typed(f.sort_values("start_ms", kind="stable"), _SIDE_TASK_STEP_SCHEMA)


def events_frame(events: Iterable[Event], t0_ns: int | None = None) -> pd.DataFrame:
    """Every event as one row, in arrival order: ``kind`` first, ``t_ms`` second, then the rest.

    ``t_ms`` is the event's own time from t0: ``t_ns``, else ``start_ns`` (NaN if it has
    neither). Columns an event type lacks are NaN.
    """
    rows = list(events)
    if not rows:
        return pd.DataFrame({"kind": pd.Series(dtype=_STR), "t_ms": pd.Series(dtype="float64")})
    f = pd.DataFrame.from_records(rows)
    t = pd.Series(np.nan, index=f.index, dtype="float64")
    for col in ("start_ns", "t_ns"):  # t_ns wins where an event has both
        if col in f.columns:
            own = pd.to_numeric(f[col], errors="coerce").astype("float64")
            t = own.where(own.notna(), t)
    t0 = t0_ns if t0_ns is not None else (t.min() if t.notna().any() else 0.0)
    f.insert(0, "t_ms", (t - t0) / _NS)
    kind = f.pop("kind")
    f.insert(0, "kind", kind)
    return f


def _frame_of_events(events: Iterable[Event], kind: str, t0_ns: int | None) -> pd.DataFrame:
    """The table of ``kind`` built from the events of that kind among ``events``."""
    raw_columns = RAW_BY_KIND[kind]
    zeros = {c: 0 for c, code in raw_columns.items() if code == "z"}  # 0 when missing, exactly
    rows = [{**zeros, **e} for e in events if e.get("kind") == kind]
    raw = pd.DataFrame.from_records(rows, columns=list(raw_columns)) if rows else None
    return frame_of(kind, raw, t0_ns)


def frame_of(kind: str, raw: pd.DataFrame | None, t0_ns: int | None) -> pd.DataFrame:
    """The table of ``kind`` ("action", "step", "memory", "side_task_step") from its raw
    columns (``event_columns.RAW_BY_KIND``; consumed), typed; empty with its columns if None."""
    schema, derive = _TABLES[kind]
    if raw is None:
        return _empty(schema)
    return derive(raw, t0_ns)


_TABLES = {
    "action": (_ACTION_SCHEMA, _actions_of),
    "step": (_STEP_SCHEMA, _steps_of),
    "memory": (_MEMORY_SCHEMA, lambda f, _t0_ns: _memory_of(f)),
    "side_task_step": (_SIDE_TASK_STEP_SCHEMA, _side_task_steps_of),
}


def _span_ms(f: pd.DataFrame, t0_ns: int | None) -> int:
    """Adds start_ms, end_ms (from t0) and duration_ms from the ``*_ns`` columns; returns t0
    (``t0_ns``, else the earliest start)."""
    t0 = int(t0_ns) if t0_ns is not None else int(f["start_ns"].min())
    f["start_ms"] = (f["start_ns"] - t0) / _NS
    f["end_ms"] = (f["end_ns"] - t0) / _NS
    f["duration_ms"] = (f["end_ns"] - f["start_ns"]) / _NS
    return t0


def _empty(schema: Mapping[str, str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in schema.items()})


def _typed(frame: pd.DataFrame, schema: Mapping[str, str]) -> pd.DataFrame:
    return frame[list(schema)].astype(dict(schema)).reset_index(drop=True)
