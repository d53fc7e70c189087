"""``EventTables``: a run's decoded events, kept compactly, with its tables built on demand.

``Session`` adds what ``lab.tailer.EventTailer`` hands out; the tables (``actions``, ``steps``,
``memory``, ``side_task_steps``, ``frame``) are the pure frames of ``lab.frames`` built from
packed columns (see [Note: bounded memory]). pandas loads on the first table built, so making
the store (at launch) costs nothing.

    tables = EventTables()
    tables.add(tailer.poll())          # whatever was appended since the last poll
    tables.actions()                   # one row per timed action

The frames and the tailer used to live here; their names are still importable from this module.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import logging
import math
import sys
import zlib
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from freeride_lab.lab.event_columns import RAW_BY_KIND, Event
from freeride_lab.lab.tailer import EventTailer, read_events

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

log = logging.getLogger(__name__)

__all__ = ["RELEASE_ROWS", "EventTables", "EventTailer", "read_events"]


def __getattr__(name: str) -> Any:
    """The public names of ``lab.frames``, which this module still answers to, loaded on first
    use (pandas); a private name is never looked up there."""
    if not name.startswith("_"):
        frames = importlib.import_module("freeride_lab.lab.frames")
        if name in frames.__all__:
            return getattr(frames, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
        import numpy as np

        cols = zip(*self._pending, strict=True)
        pack = [
            np.array(col, dtype=np.float64) if kind == "f" else _small_ints(np.array(col))
            for kind, col in zip(self.kinds.values(), cols, strict=True)
        ]
        self._packs.append(pack)
        self._pending = []

    def frame(self) -> pd.DataFrame:
        """Every row so far, in arrival order: int64, float64 and object (str) columns."""
        import numpy as np
        import pandas as pd

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
    import numpy as np

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
        self.started: set[int] = set()  # ranks that said rank_started
        self._log = _EventLog()
        self._tables = {kind: _Columns(raw) for kind, raw in RAW_BY_KIND.items()}
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
                self.started.add(int(e.get("rank", -1)))
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
        """``lab.frames.actions_frame`` of the events so far."""
        return self._table("action")

    def steps(self) -> pd.DataFrame:
        """``lab.frames.steps_frame`` of the events so far."""
        return self._table("step")

    def memory(self) -> pd.DataFrame:
        """``lab.frames.memory_frame`` of the events so far."""
        return self._table("memory")

    def side_task_steps(self) -> pd.DataFrame:
        """``lab.frames.side_task_steps_frame`` of the events so far."""
        return self._table("side_task_step")

    def frame(self) -> pd.DataFrame:
        """Every event as one row (``events_frame``); decodes the whole log."""
        key = (self._log.count, self.t0())
        hit = self._cache.get("events")
        if hit is None or hit[0] != key:
            from freeride_lab.lab.frames import events_frame

            hit = (key, events_frame(self._log.since(0), self.t0()))
            self._cache["events"] = hit
        return hit[1].copy()

    def _table(self, kind: str) -> pd.DataFrame:
        from freeride_lab.lab.frames import frame_of

        columns = self._tables[kind]
        if not columns.rows:
            return frame_of(kind, None, self.t0())
        large = columns.rows >= RELEASE_ROWS
        if large:  # what earlier reads built and their callers dropped since
            _release_memory()
        frame = frame_of(kind, columns.frame(), self.t0())
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
