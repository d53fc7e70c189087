"""The tables one dashboard redraw draws: the newest steps' actions, bubbles and side steps,
and the bubble fractions — the run's own ``Session.summary()`` where the session has one, so
the chart and the table agree for the same run."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from freeride_lab.lab.run_bubbles import attributed_bubbles, bubble_summary, run_bubbles
from freeride_lab.ui.dashboard.controller import DashboardSession

__all__ = ["DrawnTables", "recent_tables"]


@dataclass(frozen=True)
class DrawnTables:
    """What one redraw draws; ``summary`` None keeps the fraction chart as it is."""

    actions: pd.DataFrame
    bubbles: pd.DataFrame
    side_task_steps: pd.DataFrame
    summary: pd.DataFrame | None


def recent_tables(
    session: DashboardSession,
    actions: pd.DataFrame,
    side: pd.DataFrame,
    *,
    history_steps: int,
    with_summary: bool = True,
) -> DrawnTables:
    """The newest ``history_steps`` steps: actions, their bubbles, side steps; and the
    bubble fractions of the whole run (``session.summary()``, else of those steps)."""
    cfg = session.config
    steps = sorted(actions["step"].unique())
    kept = steps[-history_steps:]
    table = session.steps  # the optimizer spans: the table's boundary bubbles need them
    if kept:
        actions = actions[actions["step"] >= kept[0]]
        side = side[side["step"] >= kept[0]]
        table = table[table["step"] >= kept[0]]
    bubbles = run_bubbles(cfg, actions, table, min_ms=session.bubble_min_ms)
    bubbles = attributed_bubbles(cfg, actions, bubbles, table)  # why each is there, for hover
    summary = None
    whole_run = getattr(session, "summary", None)
    if kept and with_summary and callable(whole_run):
        summary = whole_run()  # the numbers Session.summary() gives, for the same run
    elif kept and with_summary:
        # step 0 is warm-up: leave it out once a later step is there
        skip = 1 if len(kept) > 1 and kept[0] == steps[0] else 0
        summary = bubble_summary(cfg, actions, skip_steps=skip, min_ms=session.bubble_min_ms)
    return DrawnTables(actions, bubbles, side, summary)
