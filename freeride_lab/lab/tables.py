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

import contextlib
import ctypes
import json
import logging
import math
import sys
import zlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from freeride_lab.core.events import check_dict
from freeride_lab.io.bus import BusBatch
from freeride_lab.io.rundir import RunDir

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
}
ACTION_COLUMNS: tuple[str, ...] = tuple(_ACTION_SCHEMA)
STEP_COLUMNS: tuple[str, ...] = tuple(_STEP_SCHEMA)
MEMORY_COLUMNS: tuple[str, ...] = tuple(_MEMORY_SCHEMA)
SIDE_TASK_STEP_COLUMNS: tuple[str, ...] = tuple(_SIDE_TASK_STEP_SCHEMA)

Event = dict[str, Any]  # one decoded JSON line; ``kind`` names its type (core.events)

# What ``EventTables`` keeps of each event a table is built from, column by column: "i" an
# integer, "z" an integer that is 0 when missing, "f" a float (NaN when missing or not a
# number), "s" a string (or None). The pure ``*_frame`` functions pick the same columns.
_ACTION_RAW: dict[str, str] = {
    "step": "i",
    "rank": "i",
    "stage": "i",
    "action": "s",
    "microbatch": "i",
    "start_ns": "i",
    "end_ns": "i",
}
_STEP_RAW: dict[str, str] = {
    "step": "i",
    "rank": "i",
    "start_ns": "i",
    "end_ns": "i",
    "optimizer_start_ns": "i",
    "optimizer_end_ns": "i",
    "loss": "f",
    "tokens": "z",
}
_MEMORY_RAW: dict[str, str] = {
    "step": "i",
    "rank": "i",
    "device": "s",
    "peak_reserved_bytes": "i",
    "capacity_bytes": "z",
}
_SIDE_TASK_STEP_RAW: dict[str, str] = {
    "task_id": "s",
    "name": "s",
    "stage": "i",
    "rank": "i",
    "step": "i",
    "start_ns": "i",
    "end_ns": "i",
    "progress": "f",
    "unit": "s",
    "overrun_ns": "z",
}


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
    return _actions_of(pd.DataFrame.from_records(rows, columns=list(_ACTION_RAW)), t0_ns)


def _actions_of(f: pd.DataFrame, t0_ns: int | None) -> pd.DataFrame:
    t0 = _t0(t0_ns, f["start_ns"])
    f["start_ms"] = (f["start_ns"] - t0) / _NS
    f["end_ms"] = (f["end_ns"] - t0) / _NS
    f["duration_ms"] = (f["end_ns"] - f["start_ns"]) / _NS
    return _typed(f.sort_values(["step", "rank", "start_ns"], kind="stable"), _ACTION_SCHEMA)


def steps_frame(events: Iterable[Event], t0_ns: int | None = None) -> pd.DataFrame:
    """One row per (step, rank) ``step`` event.

    Columns, in order: step, rank (int64); start_ms, end_ms, duration_ms (the rank's schedule
    window), optimizer_ms, loss (NaN except on the last stage) (float64); tokens (int64);
    optimizer_start_ms, optimizer_end_ms (float64; what ``core.bubbles.extract_bubbles`` needs
    to count the optimizer as busy). Sorted by step, rank.
    """
    rows = [e for e in events if e.get("kind") == "step"]
    if not rows:
        return _empty(_STEP_SCHEMA)
    return _steps_of(pd.DataFrame.from_records(rows, columns=list(_STEP_RAW)), t0_ns)


def _steps_of(f: pd.DataFrame, t0_ns: int | None) -> pd.DataFrame:
    t0 = _t0(t0_ns, f["start_ns"])
    f["start_ms"] = (f["start_ns"] - t0) / _NS
    f["end_ms"] = (f["end_ns"] - t0) / _NS
    f["duration_ms"] = (f["end_ns"] - f["start_ns"]) / _NS
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
    rows = [e for e in events if e.get("kind") == "memory"]
    if not rows:
        return _empty(_MEMORY_SCHEMA)
    return _memory_of(pd.DataFrame.from_records(rows, columns=list(_MEMORY_RAW)))


def _memory_of(f: pd.DataFrame) -> pd.DataFrame:
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
    raw = pd.DataFrame.from_records(rows, columns=list(_SIDE_TASK_STEP_RAW))
    return _side_task_steps_of(raw, t0_ns)


def _side_task_steps_of(f: pd.DataFrame, t0_ns: int | None) -> pd.DataFrame:
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

    Every line is checked (``core.events.check_dict``) before it is handed out: a line that is
    not JSON, not an object, or not a usable event (a field missing or of the wrong type) is
    skipped and counted in ``bad_lines``, and each read that skipped some logs one warning per
    file with the count and the first bad line's number (see [Note: damaged event files]).
    """

    def __init__(self, run_dir: RunDir) -> None:
        self.run_dir = run_dir
        self.offsets: dict[str, int] = {}  # file name -> bytes consumed
        self.lines: dict[str, int] = {}  # file name -> lines consumed (numbers bad lines)
        self.bad_lines = 0  # lines skipped: not JSON objects, or not usable events
        self.bad_lines_by_file: dict[str, int] = {}
        self.missing_bytes = 0  # gaps the bus left that the local file could not fill
        self._unreadable: set[str] = set()  # files whose read failed, "/" for events/ (logged once)

    def poll(self, *, final: bool = False) -> list[Event]:
        """New complete lines of every event file, ranks first, then workers.

        Args:
            final: the writers have ended (the run is over): a last line without its newline
                is read too (an event if it is whole, else a bad line), not left for later.
        """
        if not self.run_dir.events_dir.is_dir():  # made at launch: gone means damaged
            if "/" not in self._unreadable:
                self._unreadable.add("/")
                log.warning(
                    "%s is missing: this run has no events to read", self.run_dir.events_dir
                )
            return []
        out: list[Event] = []
        for path in self.run_dir.event_files():
            out.extend(self._read(path.name, self.offsets.get(path.name, 0), None, final=final))
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

    def _read(self, name: str, start: int, stop: int | None, *, final: bool = False) -> list[Event]:
        path = self.run_dir.events_dir / name
        try:
            with open(path, "rb") as f:
                f.seek(start)
                data = f.read() if stop is None else f.read(stop - start)
        except FileNotFoundError:
            return []
        except OSError as e:  # a directory, no permission, an I/O error: the others still read
            if name not in self._unreadable:
                self._unreadable.add(name)
                log.warning("%s: cannot read it (%s); the run's other files are read", path, e)
            return []
        complete = data if final else data[: data.rfind(b"\n") + 1]
        if not complete:
            return []  # a partial last line waits for the next read
        self.offsets[name] = start + len(complete)
        return self._parse(complete, name)

    def _parse(self, payload: bytes, source: str) -> list[Event]:
        out: list[Event] = []
        first_line = self.lines.get(source, 0) + 1
        rows = payload.split(b"\n")
        if payload.endswith(b"\n"):
            rows.pop()
        bad, first_bad, why = 0, 0, ""
        for number, line in enumerate(rows, start=first_line):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                check_dict(obj)
            except (ValueError, RecursionError) as e:  # RecursionError: "[[[[…" nested deeply
                if not bad:
                    first_bad, why = number, _reason(e, line)
                bad += 1
                continue
            out.append(obj)
        self.lines[source] = first_line - 1 + len(rows)
        if bad:
            self.bad_lines += bad
            self.bad_lines_by_file[source] = self.bad_lines_by_file.get(source, 0) + bad
            log.warning(
                "%s: skipped %d line(s) that are not valid events, the first at line %d (%s); "
                "the file's other lines are read",
                self.run_dir.events_dir / source,
                bad,
                first_bad,
                why,
            )
        return out


def _reason(error: Exception, line: bytes) -> str:
    """Why a line is bad, in a few words (see ``EventTailer._parse``)."""
    if isinstance(error, RecursionError):
        return "nested too deeply to decode"
    if isinstance(error, json.JSONDecodeError | UnicodeDecodeError):
        return f"not JSON: {line[:40]!r}"
    return str(error)


# [Note: damaged event files]
# An event file can be damaged after it was written: a copy cut short, a disk error, a hand
# edit. Readers (``Session.open``, ``freeride-lab status|report``, the dashboard) then work on
# what is left: the tailer skips each line that is not a usable event and counts it
# (``bad_lines``, ``bad_lines_by_file``), logging one warning per file and read, with the count
# and the first bad line's number, so that a damaged file of a million lines logs one line,
# not a million. Line numbers count from 1 over the lines this tailer has read of the file
# (for a file on another node, from the first batch the bus carried). A last line without its
# newline is a line still being written while the run is live; once the run is over
# (``poll(final=True)``) it is read as it is, so a line cut short shows up as bad.


class _Columns:
    """The rows of one table as compact column chunks (see [Note: bounded memory]).

    ``append`` takes one event; every ``PACK_ROWS`` rows the pending ones are packed into one
    numpy array per column (integers in the smallest dtype that holds them, strings as codes
    into a small vocabulary). ``frame`` concatenates the packs once and keeps them as one.
    """

    PACK_ROWS = 4096

    def __init__(self, columns: Mapping[str, str]) -> None:
        self.kinds = dict(columns)
        self.rows = 0
        self.bad_rows = 0  # events that lacked a column or held a value of the wrong type
        self._pending: list[tuple[Any, ...]] = []
        self._packs: list[list[np.ndarray]] = []
        self._codes: dict[str | None, int] = {}  # string -> code, shared by the str columns
        self._strings: list[str | None] = []

    def append(self, e: Event) -> bool:
        """Add ``e`` as a row; False (and counted) if it lacks a column or has a bad value."""
        try:
            row = tuple(self._cell(kind, e.get(col)) for col, kind in self.kinds.items())
        except (TypeError, ValueError, OverflowError):
            self.bad_rows += 1
            return False
        self._pending.append(row)
        self.rows += 1
        if len(self._pending) >= self.PACK_ROWS:
            self._pack()
        return True

    def _cell(self, kind: str, v: Any) -> int | float:
        if kind == "i":
            if v is None:
                raise ValueError("missing")
            return int(v)
        if kind == "z":
            return 0 if v is None else int(v)
        if kind == "f":
            try:
                return float(v)
            except (TypeError, ValueError):
                return math.nan
        s = None if v is None else str(v)
        code = self._codes.get(s)
        if code is None:
            code = self._codes[s] = len(self._strings)
            self._strings.append(s)
        return code

    def _pack(self) -> None:
        if not self._pending:
            return
        cols = zip(*self._pending, strict=True)
        pack = [
            np.array(col, dtype=np.float64) if kind == "f" else _small_ints(np.array(col))
            for kind, col in zip(self.kinds.values(), cols, strict=True)
        ]
        self._packs.append(pack)
        self._pending = []

    def frame(self) -> pd.DataFrame:
        """Every row so far, in arrival order: int64, float64 and object (str) columns."""
        self._pack()
        if len(self._packs) > 1:
            self._packs = [[np.concatenate(parts) for parts in zip(*self._packs, strict=True)]]
        pack = self._packs[0] if self._packs else [np.empty(0, np.int64) for _ in self.kinds]
        strings = np.array(self._strings, dtype=object)
        data: dict[str, np.ndarray] = {}
        for (col, kind), values in zip(self.kinds.items(), pack, strict=True):
            if kind == "s":
                data[col] = strings[values]
            elif kind == "f":
                data[col] = values
            else:
                data[col] = values.astype(np.int64)
        return pd.DataFrame(data)

    def nbytes(self) -> int:
        """Bytes the packed columns take (pending rows not counted)."""
        return sum(a.nbytes for pack in self._packs for a in pack)


def _small_ints(a: np.ndarray) -> np.ndarray:
    """``a`` (integers) in the smallest signed dtype that holds every value."""
    a = a.astype(np.int64)
    if a.size == 0:
        return a
    lo, hi = int(a.min()), int(a.max())
    for dtype in (np.int8, np.int16, np.int32):
        info = np.iinfo(dtype)
        if info.min <= lo and hi <= info.max:
            return a.astype(dtype)
    return a


class _EventLog:
    """Every event in arrival order: the latest ``PACK_EVENTS`` as dicts, older ones as
    zlib-compressed JSON, one blob per ``PACK_EVENTS`` (see [Note: bounded memory])."""

    PACK_EVENTS = 2048

    def __init__(self) -> None:
        self.count = 0
        self._recent: list[Event] = []
        self._packs: list[tuple[int, int, bytes]] = []  # (first index, events, blob)

    def append(self, e: Event) -> None:
        self._recent.append(e)
        self.count += 1
        if len(self._recent) >= self.PACK_EVENTS:
            first = self.count - len(self._recent)
            blob = json.dumps(self._recent, separators=(",", ":"), default=str).encode()
            self._packs.append((first, len(self._recent), zlib.compress(blob, 1)))
            self._recent = []

    def since(self, start: int) -> list[Event]:
        """Events from index ``start`` on (decompressing only the packs that hold them)."""
        start = max(0, start)
        out: list[Event] = []
        for first, n, blob in self._packs:
            if first + n > start:
                out.extend(json.loads(zlib.decompress(blob))[max(0, start - first) :])
        recent_first = self.count - len(self._recent)
        out.extend(self._recent[max(0, start - recent_first) :])
        return out

    def nbytes(self) -> int:
        """Bytes the compressed packs take (recent events not counted)."""
        return sum(len(blob) for _, _, blob in self._packs)


# [Note: bounded memory]
# A long run sends hundreds of events a second. Kept as dicts they take about 1 KiB each, so
# the launching process would grow by ~1 GB an hour. ``EventTables`` instead keeps (1) the rows
# of each table as packed numpy columns (``_Columns``: about 35 bytes an action) and (2) every
# event as zlib-compressed JSON (``_EventLog``: about 20 bytes an event), for the all-events
# frame and for ``events_since`` (the side-task book folds the new ones). Building a table
# concatenates packed columns and derives the ms columns; it never re-parses events.
#
# Built tables are not kept: a live run adds rows between two reads, so a kept frame would be
# stale at the next one anyway, and it held about 115 bytes a row (side-task steps) besides.
# What a 20-minute soak showed instead: a dashboard that rebuilds a growing table every few
# seconds leaves freed memory with the allocators (glibc's heap; pyarrow's mimalloc pool behind
# pandas' str columns), and RSS grew ~150-400 bytes per event though nothing was held. So after
# building a table of ``RELEASE_ROWS`` rows or more, and before building the next one,
# ``_release_memory`` hands freed memory back (pyarrow's ``release_unused``, glibc's
# ``malloc_trim``). Rereading a growing side-task table every 1000 rows then grows RSS by about
# 120 bytes a row instead of about 440: the packed row (about 45) plus the last frame a caller
# dropped, which stays with the allocators until the next read
# (``tests/lab/test_tables.py::test_rereading_a_growing_table_keeps_memory_near_the_packed_rows``).


class EventTables:
    """Decoded events of one run, kept compactly in arrival order, with frames built on demand
    (see [Note: bounded memory])."""

    def __init__(self) -> None:
        self.t0_ns: int | None = None
        self.steps_by_rank: dict[int, int] = {}  # rank -> steps completed (max step + 1)
        self.failures: list[Event] = []  # rank_failed events
        self.finished: dict[int, Event] = {}  # rank -> rank_finished event
        self.world_size: int | None = None
        self._log = _EventLog()
        self._tables: dict[str, _Columns] = {
            "action": _Columns(_ACTION_RAW),
            "step": _Columns(_STEP_RAW),
            "memory": _Columns(_MEMORY_RAW),
            "side_task_step": _Columns(_SIDE_TASK_STEP_RAW),
        }
        self._first_action_ns: int | None = None
        self._cache: dict[str, tuple[tuple[int, int | None], pd.DataFrame]] = {}

    def __len__(self) -> int:
        """Events added so far."""
        return self._log.count

    @property
    def events(self) -> list[Event]:
        """Every event as a dict, decoded again from the compact log (slow for a long run;
        ``events_since`` reads only the new ones)."""
        return self._log.since(0)

    @property
    def bad_rows(self) -> int:
        """Events left out of their table: a column missing or a value of the wrong type."""
        return sum(c.bad_rows for c in self._tables.values())

    def add(self, events: Iterable[Event]) -> int:
        """Append events; returns how many were added."""
        n = 0
        for e in events:
            self._log.append(e)
            n += 1
            kind = e.get("kind")
            table = self._tables.get(kind) if isinstance(kind, str) else None
            if table is not None and not table.append(e):
                log.warning(
                    "%s event left out of its table (bad or missing field): %.200r", kind, e
                )
            if kind == "action":
                start = e.get("start_ns")
                if isinstance(start, int) and (
                    self._first_action_ns is None or start < self._first_action_ns
                ):
                    self._first_action_ns = start
            elif kind == "step":
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
        if n:
            self._cache.pop("events", None)  # the one frame as large as the log: not kept stale
        return n

    def events_since(self, start: int) -> list[Event]:
        """The events from index ``start`` (arrival order) on, as dicts."""
        return self._log.since(start)

    def steps_done(self, world_size: int) -> int:
        """Steps every one of the ``world_size`` ranks has completed."""
        return min((self.steps_by_rank.get(r, 0) for r in range(world_size)), default=0)

    def t0(self) -> int | None:
        return self.t0_ns if self.t0_ns is not None else self._first_action_ns

    def nbytes(self) -> int:
        """Bytes the packed tables and the compressed log take (recent, unpacked rows not
        counted): what the session keeps per event in the long run."""
        return self._log.nbytes() + sum(c.nbytes() for c in self._tables.values())

    def actions(self) -> pd.DataFrame:
        return self._table("action", _ACTION_SCHEMA, lambda f: _actions_of(f, self.t0()))

    def steps(self) -> pd.DataFrame:
        return self._table("step", _STEP_SCHEMA, lambda f: _steps_of(f, self.t0()))

    def memory(self) -> pd.DataFrame:
        return self._table("memory", _MEMORY_SCHEMA, _memory_of)

    def side_task_steps(self) -> pd.DataFrame:
        return self._table(
            "side_task_step", _SIDE_TASK_STEP_SCHEMA, lambda f: _side_task_steps_of(f, self.t0())
        )

    def frame(self) -> pd.DataFrame:
        """Every event as one row (``events_frame``); decodes the whole log."""
        key = (self._log.count, self.t0())
        hit = self._cache.get("events")
        if hit is None or hit[0] != key:
            hit = (key, events_frame(self._log.since(0), self.t0()))
            self._cache["events"] = hit
        return hit[1].copy()

    def _table(
        self,
        kind: str,
        schema: Mapping[str, str],
        derive: Callable[[pd.DataFrame], pd.DataFrame],
    ) -> pd.DataFrame:
        columns = self._tables[kind]
        if not columns.rows:
            return _empty(schema)
        large = columns.rows >= RELEASE_ROWS
        if large:  # what earlier reads built and their callers dropped since
            _release_memory()
        frame = derive(columns.frame())
        if large:  # what this build freed
            _release_memory()
        return frame


#: Tables of at least this many rows give freed memory back once built ([Note: bounded memory]).
RELEASE_ROWS = 16_384


def _release_memory() -> None:
    """Hand memory freed while building a frame back to the OS (see [Note: bounded memory])."""
    pa = sys.modules.get("pyarrow")  # only if pandas (or the user) loaded it
    if pa is not None:
        with contextlib.suppress(Exception):
            pa.default_memory_pool().release_unused()
    if _malloc_trim is not None:
        _malloc_trim(0)


def _load_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None elsewhere (musl, macOS, Windows)."""
    try:
        return ctypes.CDLL(None).malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


_malloc_trim = _load_malloc_trim() if sys.platform.startswith("linux") else None


def _t0(t0_ns: int | None, starts: pd.Series) -> int:
    return int(t0_ns) if t0_ns is not None else int(starts.min())


def _empty(schema: Mapping[str, str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in schema.items()})


def _typed(frame: pd.DataFrame, schema: Mapping[str, str]) -> pd.DataFrame:
    return frame[list(schema)].astype(dict(schema)).reset_index(drop=True)


def read_events(run_dir: RunDir | Path, *, final: bool = False) -> list[Event]:
    """Every usable event of a run directory, read once from its files (damaged lines are
    skipped and logged: see [Note: damaged event files]); ``final`` as in ``EventTailer.poll``."""
    rd = run_dir if isinstance(run_dir, RunDir) else RunDir(Path(run_dir))
    return EventTailer(rd).poll(final=final)
