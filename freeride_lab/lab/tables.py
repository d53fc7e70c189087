"""Events → DataFrames, and the incremental reader that feeds them.

``EventTailer`` reads new complete lines from a run's event files (remembering byte offsets,
leaving a partial last line for later) and merges batches from the live bus with them exactly
once. ``EventTables`` accumulates the decoded events and builds the frames on demand. The
``*_frame`` functions are pure.

    tailer, tables = EventTailer(RunDir(path)), EventTables()
    tables.add(tailer.poll())          # whatever was appended since the last poll
    tables.actions()                   # one row per timed action

Times: ``*_ns`` columns are the run clock in integer ns; ``*_ms`` columns are float ms from the
run start t0 = the earliest ``RankStarted.t_ns`` (or, without one, the earliest action start).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from freeride_lab.runtime.bus import BusBatch
from freeride_lab.runtime.rundir import RunDir

log = logging.getLogger(__name__)

__all__ = [
    "ACTION_COLUMNS",
    "MEMORY_COLUMNS",
    "SIDE_TASK_STEP_COLUMNS",
    "STEP_COLUMNS",
    "EventTables",
    "EventTailer",
    "actions_frame",
    "events_frame",
    "memory_frame",
    "read_events",
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
}
ACTION_COLUMNS: tuple[str, ...] = tuple(_ACTION_SCHEMA)
STEP_COLUMNS: tuple[str, ...] = tuple(_STEP_SCHEMA)
MEMORY_COLUMNS: tuple[str, ...] = tuple(_MEMORY_SCHEMA)
SIDE_TASK_STEP_COLUMNS: tuple[str, ...] = tuple(_SIDE_TASK_STEP_SCHEMA)

Event = dict[str, Any]  # one decoded JSON line; ``kind`` names its type (core.events)


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
    rows = [e for e in events if e.get("kind") == "action"]
    if not rows:
        return _empty(_ACTION_SCHEMA)
    f = pd.DataFrame.from_records(
        rows, columns=["step", "rank", "stage", "action", "microbatch", "start_ns", "end_ns"]
    )
    t0 = _t0(t0_ns, f["start_ns"])
    f["start_ms"] = (f["start_ns"] - t0) / _NS
    f["end_ms"] = (f["end_ns"] - t0) / _NS
    f["duration_ms"] = (f["end_ns"] - f["start_ns"]) / _NS
    return _typed(f.sort_values(["step", "rank", "start_ns"], kind="stable"), _ACTION_SCHEMA)


def steps_frame(events: Iterable[Event], t0_ns: int | None = None) -> pd.DataFrame:
    """One row per (step, rank) ``step`` event.

    Columns, in order: step, rank (int64); start_ms, end_ms, duration_ms (the schedule window),
    optimizer_ms, loss (NaN except on the last stage) (float64); tokens (int64).
    Sorted by step, rank.
    """
    rows = [e for e in events if e.get("kind") == "step"]
    if not rows:
        return _empty(_STEP_SCHEMA)
    cols = [
        "step",
        "rank",
        "start_ns",
        "end_ns",
        "optimizer_start_ns",
        "optimizer_end_ns",
        "loss",
        "tokens",
    ]
    f = pd.DataFrame.from_records(rows, columns=cols)
    t0 = _t0(t0_ns, f["start_ns"])
    f["start_ms"] = (f["start_ns"] - t0) / _NS
    f["end_ms"] = (f["end_ns"] - t0) / _NS
    f["duration_ms"] = (f["end_ns"] - f["start_ns"]) / _NS
    f["optimizer_ms"] = (f["optimizer_end_ns"] - f["optimizer_start_ns"]) / _NS
    f["loss"] = pd.to_numeric(f["loss"], errors="coerce")
    f["tokens"] = f["tokens"].fillna(0)
    return _typed(f.sort_values(["step", "rank"], kind="stable"), _STEP_SCHEMA)


def memory_frame(events: Iterable[Event]) -> pd.DataFrame:
    """One row per ``memory`` report.

    Columns, in order: step, rank (int64), device, peak_reserved_bytes, capacity_bytes
    (int64), peak_reserved_frac (float64, 0 to 1; NaN without a capacity). Sorted by step, rank.
    """
    rows = [e for e in events if e.get("kind") == "memory"]
    if not rows:
        return _empty(_MEMORY_SCHEMA)
    f = pd.DataFrame.from_records(
        rows, columns=["step", "rank", "device", "peak_reserved_bytes", "capacity_bytes"]
    )
    f["peak_reserved_frac"] = f["peak_reserved_bytes"] / f["capacity_bytes"].where(
        f["capacity_bytes"] > 0
    )
    return _typed(f.sort_values(["step", "rank"], kind="stable"), _MEMORY_SCHEMA)


def side_task_steps_frame(events: Iterable[Event], t0_ns: int | None = None) -> pd.DataFrame:
    """One row per ``side_task_step`` event.

    Columns, in order: task_id, name (str); stage, rank, step (int64); start_ms, end_ms,
    duration_ms, progress (in ``unit``, this step only) (float64); unit (str); overrun_ms
    (float64, how far the step ran past its bubble). Sorted by start_ms.
    """
    rows = [e for e in events if e.get("kind") == "side_task_step"]
    if not rows:
        return _empty(_SIDE_TASK_STEP_SCHEMA)
    cols = [
        "task_id",
        "name",
        "stage",
        "rank",
        "step",
        "start_ns",
        "end_ns",
        "progress",
        "unit",
        "overrun_ns",
    ]
    f = pd.DataFrame.from_records(rows, columns=cols)
    t0 = _t0(t0_ns, f["start_ns"])
    f["start_ms"] = (f["start_ns"] - t0) / _NS
    f["end_ms"] = (f["end_ns"] - t0) / _NS
    f["duration_ms"] = (f["end_ns"] - f["start_ns"]) / _NS
    f["overrun_ms"] = f["overrun_ns"].fillna(0) / _NS
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


class EventTailer:
    """Reads each event file of a run incrementally and merges live bus batches exactly once.

    Per file it remembers the byte offset up to which lines were handed out. ``poll`` reads
    complete lines past it; ``feed`` takes a ``BusBatch`` (the same bytes, sent by the writer
    right after appending them) and hands out only the part not yet seen, first reading any gap
    left by dropped batches from the file.
    """

    def __init__(self, run_dir: RunDir) -> None:
        self.run_dir = run_dir
        self.offsets: dict[str, int] = {}  # file name -> bytes consumed
        self.bad_lines = 0  # lines that were not JSON objects
        self.missing_bytes = 0  # gaps the bus left that the local file could not fill

    def poll(self) -> list[Event]:
        """New complete lines of every event file, ranks first, then workers."""
        out: list[Event] = []
        for path in self.run_dir.event_files():
            out.extend(self._read(path.name, self.offsets.get(path.name, 0), None))
        return out

    def feed(self, batch: BusBatch) -> list[Event]:
        """The not-yet-seen events of a bus batch (plus any gap before it, read from the file)."""
        have = self.offsets.get(batch.source, 0)
        if batch.end <= have:
            return []
        out: list[Event] = []
        if batch.offset > have:
            out.extend(self._read(batch.source, have, batch.offset))
            have = self.offsets.get(batch.source, have)
            if have < batch.offset:  # the file is not here (another node) or shorter
                self.missing_bytes += batch.offset - have
                have = batch.offset
        out.extend(self._parse(batch.payload[have - batch.offset :], batch.source))
        self.offsets[batch.source] = batch.end
        return out

    def _read(self, name: str, start: int, stop: int | None) -> list[Event]:
        path = self.run_dir.events_dir / name
        try:
            with open(path, "rb") as f:
                f.seek(start)
                data = f.read() if stop is None else f.read(stop - start)
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]  # a partial last line waits for the next read
        if not complete:
            return []
        self.offsets[name] = start + len(complete)
        return self._parse(complete, name)

    def _parse(self, payload: bytes, source: str) -> list[Event]:
        out: list[Event] = []
        for line in payload.splitlines():
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                obj = None
            if not isinstance(obj, dict):
                self.bad_lines += 1
                log.warning("%s: skipping a line that is not a JSON object: %.80r", source, line)
                continue
            out.append(obj)
        return out


class EventTables:
    """Decoded events of one run, kept in arrival order, with frames built on demand."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.t0_ns: int | None = None
        self.steps_by_rank: dict[int, int] = {}  # rank -> steps completed (max step + 1)
        self.failures: list[Event] = []  # rank_failed events
        self.finished: dict[int, Event] = {}  # rank -> rank_finished event
        self.world_size: int | None = None
        self._cache: dict[str, tuple[int, pd.DataFrame]] = {}

    def add(self, events: Iterable[Event]) -> int:
        """Append events; returns how many were added."""
        n = 0
        for e in events:
            self.events.append(e)
            n += 1
            kind = e.get("kind")
            if kind == "step":
                r = int(e.get("rank", -1))
                self.steps_by_rank[r] = max(
                    self.steps_by_rank.get(r, 0), int(e.get("step", -1)) + 1
                )
            elif kind == "rank_started":
                self.world_size = int(e.get("world_size", 0)) or self.world_size
                t = int(e.get("t_ns", 0))
                self.t0_ns = t if self.t0_ns is None else min(self.t0_ns, t)
            elif kind == "rank_failed":
                self.failures.append(e)
            elif kind == "rank_finished":
                self.finished[int(e.get("rank", -1))] = e
        return n

    def steps_done(self, world_size: int) -> int:
        """Steps every one of the ``world_size`` ranks has completed."""
        return min((self.steps_by_rank.get(r, 0) for r in range(world_size)), default=0)

    def t0(self) -> int | None:
        return self.t0_ns if self.t0_ns is not None else run_start_ns(self.events)

    def actions(self) -> pd.DataFrame:
        return self._frame("actions", lambda: actions_frame(self.events, self.t0()))

    def steps(self) -> pd.DataFrame:
        return self._frame("steps", lambda: steps_frame(self.events, self.t0()))

    def memory(self) -> pd.DataFrame:
        return self._frame("memory", lambda: memory_frame(self.events))

    def side_task_steps(self) -> pd.DataFrame:
        return self._frame("side_task_steps", lambda: side_task_steps_frame(self.events, self.t0()))

    def frame(self) -> pd.DataFrame:
        return self._frame("events", lambda: events_frame(self.events, self.t0()))

    def _frame(self, name: str, build: Any) -> pd.DataFrame:
        n = len(self.events)
        hit = self._cache.get(name)
        if hit is None or hit[0] != n:
            hit = (n, build())
            self._cache[name] = hit
        return hit[1].copy()


def _t0(t0_ns: int | None, starts: pd.Series) -> int:
    return int(t0_ns) if t0_ns is not None else int(starts.min())


def _empty(schema: Mapping[str, str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in schema.items()})


def _typed(frame: pd.DataFrame, schema: Mapping[str, str]) -> pd.DataFrame:
    return frame[list(schema)].astype(dict(schema)).reset_index(drop=True)


def read_events(run_dir: RunDir | Path) -> list[Event]:
    """Every event of a run directory, read once from its files."""
    rd = run_dir if isinstance(run_dir, RunDir) else RunDir(Path(run_dir))
    return EventTailer(rd).poll()
