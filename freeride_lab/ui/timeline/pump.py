"""The timeline's pump: a daemon thread that polls a source of tables and redraws a target.

    pump = TimelinePump(lambda: session_tables(session), timeline).start()

Whatever changed between two polls is drawn once; an unchanged source costs one fingerprint.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from freeride_lab.io.background import BackgroundThread

if TYPE_CHECKING:  # pandas is loaded where tables are read (the package stays light to import)
    import pandas as pd

log = logging.getLogger(__name__)

__all__ = [
    "MIN_INTERVAL_S",
    "TimelinePump",
    "TimelineTables",
    "fingerprint",
    "session_tables",
]


@dataclass(frozen=True)
class TimelineTables:
    """What a timeline draws. ``version`` is a source's own change token (None: fingerprinted)."""

    actions: pd.DataFrame
    bubbles: pd.DataFrame
    side_task_steps: pd.DataFrame | None = None
    summary: pd.DataFrame | None = None
    version: Hashable | None = None


class TimelineTarget(Protocol):
    def update(
        self,
        actions: pd.DataFrame,
        bubbles: pd.DataFrame,
        side_task_steps: pd.DataFrame | None = None,
        *,
        summary: pd.DataFrame | None = None,
    ) -> None: ...


class SessionLike(Protocol):
    """The part of ``Session`` a timeline reads."""

    @property
    def actions(self) -> pd.DataFrame: ...
    @property
    def bubbles(self) -> pd.DataFrame: ...
    def summary(self) -> Any: ...


def session_tables(session: SessionLike) -> TimelineTables:
    """The current tables of a session (``side_task_steps`` if it has them)."""
    import pandas as pd

    summary = session.summary()
    attributed = getattr(session, "attribution", None)  # bubbles with their split, if any
    return TimelineTables(
        actions=session.actions,
        bubbles=attributed if isinstance(attributed, pd.DataFrame) else session.bubbles,
        side_task_steps=getattr(session, "side_task_steps", None),
        summary=summary if isinstance(summary, pd.DataFrame) else None,
    )


def _frame_key(frame: pd.DataFrame | None) -> Hashable:
    if frame is None:
        return None
    import pandas as pd

    end = frame["end_ms"].iloc[-1] if len(frame) and "end_ms" in frame else None
    return (len(frame), tuple(frame.columns), None if end is None or pd.isna(end) else float(end))


def fingerprint(tables: TimelineTables) -> Hashable:
    """A cheap change token: the source's ``version``, else sizes and last end times."""
    if tables.version is not None:
        return ("version", tables.version)
    summary = None
    if tables.summary is not None:
        import pandas as pd

        summary = pd.util.hash_pandas_object(tables.summary, index=False).to_numpy().tobytes()
    return (
        _frame_key(tables.actions),
        _frame_key(tables.bubbles),
        _frame_key(tables.side_task_steps),
        summary,
    )


MIN_INTERVAL_S = 0.1  # at most 10 redraws per second


class TimelinePump(BackgroundThread):
    """Daemon thread that polls ``source`` every ``interval_s`` and redraws ``target`` on new data.

    Whatever changed between two polls is drawn once (coalesced); an unchanged source costs one
    fingerprint. ``start``/``stop`` (``BackgroundThread``'s) are idempotent; a failing source
    is logged and retried.
    """

    def __init__(
        self,
        source: Callable[[], TimelineTables | None],
        target: TimelineTarget,
        *,
        interval_s: float = 0.25,
    ) -> None:
        if not interval_s >= MIN_INTERVAL_S:
            raise ValueError(
                f"interval_s={interval_s!r} is below {MIN_INTERVAL_S} s; the pump redraws at most "
                f"{1 / MIN_INTERVAL_S:.0f} times a second"
            )
        self.source = source
        self.target = target
        self.interval_s = float(interval_s)
        self.redraws = 0
        self.polls = 0
        self.errors = 0
        self._last: Hashable = object()
        super().__init__(self._run, name="freeride-timeline-pump")

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<TimelinePump {state} interval_s={self.interval_s} redraws={self.redraws}>"

    def tick(self) -> bool:
        """Poll once; redraw and return True if the source has new data."""
        self.polls += 1
        tables = self.source()
        if tables is None:
            return False
        key = fingerprint(tables)
        if key == self._last:
            return False
        self.target.update(
            tables.actions, tables.bubbles, tables.side_task_steps, summary=tables.summary
        )
        self._last = key
        self.redraws += 1
        return True

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.tick()
            except Exception:  # the live view must survive a bad table
                self.errors += 1
                if self.errors == 1 or self.errors % 100 == 0:
                    log.exception("timeline pump: redraw failed (%d failures so far)", self.errors)
            stop.wait(self.interval_s)
