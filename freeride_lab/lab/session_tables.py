"""``SessionTables``: the tables half of ``lab.session.Session`` — events merged from the bus
and the files into ``actions``, ``steps``, ``bubbles``, ``summary()`` and the rest, plus the
one-line ``progress`` a dashboard shows.

``Session`` inherits it. pandas and the bubble rules (``core.bubbles``, ``core.attribution``)
load on the first table read, not at launch: a launch cell never waits for them.

    s.progress                # 'starting 4 ranks…' | 'calibrating…' | 'step 3/20' | 'stopped …'
    s.actions; s.steps; s.memory; s.side_task_steps; s.events
    s.bubbles; s.attribution; s.summary()
"""

from __future__ import annotations

import collections
import threading
from typing import TYPE_CHECKING, Any

from freeride_lab.io.bus import BusBatch
from freeride_lab.io.rundir import RunDir
from freeride_lab.lab.launch import parse_state
from freeride_lab.lab.tables import EventTables
from freeride_lab.lab.tailer import EventTailer
from freeride_lab.pipeline.launcher import RunState

if TYPE_CHECKING:
    import pandas as pd

    from freeride_lab.core.config import RunConfig

__all__ = ["SessionTables"]


class SessionTables:
    """Tables of a run (mixed into ``Session``, which provides the run and its state)."""

    run_dir: RunDir
    config: RunConfig
    bubble_min_ms: float = 0.0  # gaps shorter than this are left out of ``bubbles``
    _inbox: collections.deque[BusBatch]
    _tailer: EventTailer
    _tables: EventTables
    _lock: threading.RLock
    _writers_done: bool
    _live_events: int
    _ranks: range

    if TYPE_CHECKING:  # provided by Session and its other parts

        def _read_status(self) -> dict[str, Any]: ...
        def _state(self, *, poll_files: bool) -> RunState: ...

    @property
    def progress(self) -> str:
        """Where the run is, in a few words for a dashboard's status line, from its files and
        events: "starting 4 ranks…" until every rank of this node has its process group up,
        "calibrating…" until the first step is recorded (models built, emulation calibrated,
        the first step under way), then "step N/STEPS"; once over, "finished: N/STEPS steps",
        "stopped at step N/STEPS" or "failed: REASON"."""
        state = self._state(poll_files=True)
        total = self.config.steps
        with self._lock:
            done = min((self._tables.steps_by_rank.get(r, 0) for r in self._ranks), default=0)
            up = sum(1 for r in self._ranks if r in self._tables.started)
        if state == RunState.FAILED:
            reason = self._read_status().get("reason")
            failures = self._tables.failures
            if not reason and failures:
                first = failures[0]
                reason = f"rank {first.get('rank', '?')} failed: {first.get('error', '?')}"
            return f"failed: {reason or 'see the launcher log'}"
        if state == RunState.FINISHED:
            return f"finished: {done}/{total} steps"
        if state == RunState.STOPPED:
            return f"stopped at step {done}/{total}"
        n = len(self._ranks)
        if up < n:
            return f"starting {n} rank{'s' if n != 1 else ''}…" + (f" ({up}/{n} up)" if up else "")
        if not done and not any(self._tables.steps_by_rank.values()):
            return "calibrating…"
        return f"step {done}/{total}"

    def _on_batch(self, batch: BusBatch) -> None:
        self._inbox.append(batch)  # bus thread: just hand over; merged on the next read

    def _refresh(self, *, poll_files: bool = True) -> None:
        with self._lock:
            while self._inbox:
                self._live_events += self._tables.add(self._tailer.feed(self._inbox.popleft()))
            if poll_files:
                if not self._writers_done:  # once the run is over, a cut last line is read too
                    self._writers_done = parse_state(self._read_status().get("state")).done
                self._tables.add(self._tailer.poll(final=self._writers_done))

    @property
    def bad_lines(self) -> dict[str, int]:
        """Lines skipped per event file because they are not valid events (damaged files; see
        [Note: damaged run directories]); {} when every line was read."""
        self._refresh()
        return dict(self._tailer.bad_lines_by_file)

    @property
    def actions(self) -> pd.DataFrame:
        """One row per timed action (see ``freeride_lab.lab.tables.actions_frame``)."""
        self._refresh()
        return self._tables.actions()

    @property
    def steps(self) -> pd.DataFrame:
        """One row per (step, rank) (see ``freeride_lab.lab.tables.steps_frame``)."""
        self._refresh()
        return self._tables.steps()

    @property
    def memory(self) -> pd.DataFrame:
        """One row per (step, rank) memory report (see ``tables.memory_frame``)."""
        self._refresh()
        return self._tables.memory()

    @property
    def side_task_steps(self) -> pd.DataFrame:
        """One row per side-task step (see ``tables.side_task_steps_frame``)."""
        self._refresh()
        return self._tables.side_task_steps()

    @property
    def events(self) -> pd.DataFrame:
        """Every event recorded so far, one row each (see ``tables.events_frame``)."""
        self._refresh()
        return self._tables.frame()

    @property
    def bubbles(self) -> pd.DataFrame:
        """Idle gaps per (step, rank), from ``freeride_lab.core.bubbles.extract_bubbles``: the
        windows' gaps and, between steps, "boundary" gaps (the optimizer counts as busy)."""
        return self._bubbles_of(self.actions, self.steps)

    @property
    def attribution(self) -> pd.DataFrame:
        """``bubbles`` with each bubble split into why it is there: ``schedule_ms`` (the
        schedule leaves it idle with this run's own action costs), ``peer_ms`` (waiting on
        another rank beyond that, and transfers), ``host_ms`` (the rank's own overhead); the
        parts sum to ``duration_ms`` (``freeride_lab.core.attribution.attribute_bubbles``)."""
        from freeride_lab.lab.run_bubbles import attributed_bubbles

        actions, steps = self.actions, self.steps
        return attributed_bubbles(self.config, actions, self._bubbles_of(actions, steps), steps)

    def _recent_bubbles(self, steps: int = 6) -> pd.DataFrame:
        """The bubbles of the last ``steps`` recorded steps (enough for predictions: k=5)."""
        actions, table = self.actions, self.steps
        if not actions.empty:
            first = int(actions["step"].max()) - steps + 1
            actions = actions[actions["step"] >= first]
            table = table[table["step"] >= first]
        return self._bubbles_of(actions, table)

    def _bubbles_of(self, actions: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
        from freeride_lab.lab.run_bubbles import run_bubbles

        return run_bubbles(self.config, actions, steps, min_ms=self.bubble_min_ms)

    def summary(
        self, *, skip_steps: int | None = None, min_ms: float | None = None
    ) -> pd.DataFrame:
        """Measured vs theory bubble fraction per rank, and why the measured is above it.

        ``freeride_lab.core.bubbles.summary``'s columns, then the mean bubble ms per step
        (window and boundary bubbles, ``bubble_ms_per_step``) split into
        ``schedule_ms_per_step`` (what the schedule leaves idle with this run's own action
        costs), ``peer_ms_per_step`` (waiting on another rank beyond that, and transfers) and
        ``host_ms_per_step`` (the rank's own overhead); see ``core.attribution``.

        Args:
            skip_steps: leading steps left out as warm-up; None leaves out step 0 once a
                second step is recorded (so a live run has a summary from its first step on).
            min_ms: shortest gap counted in ``n_bubbles``; None uses ``bubble_min_ms``.
        """
        from freeride_lab.core import attribution as core_attribution
        from freeride_lab.lab.run_bubbles import bubble_summary, run_shape

        cfg = self.config
        actions = self.actions
        if skip_steps is None:
            skip_steps = 1 if actions["step"].nunique() > 1 else 0
        summary = bubble_summary(
            cfg,
            actions,
            skip_steps=skip_steps,
            min_ms=self.bubble_min_ms if min_ms is None else min_ms,
        )
        by_rank = core_attribution.attribution_by_rank(
            actions, steps=self.steps, skip_steps=skip_steps, **run_shape(cfg)
        )
        return core_attribution.with_attribution(summary, by_rank)
