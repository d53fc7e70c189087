"""The first screen of a run's report: the answer in four lines.

Bubble fraction measured vs theory, what side tasks cost training (with its 95% interval where
the run has one), how much of the idle time they harvested, and FreeRide's cost saving. Each
line is a :class:`Headline`: a label, the figure, and a sentence that says what it is.

    >>> import pandas as pd
    >>> summary = pd.DataFrame({"rank": [0, 1], "measured_frac": [0.3, 0.32],
    ...                         "theory_frac": [0.3, 0.3]})
    >>> bubble_headline(summary).value
    '31% measured vs 30% theory'
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from freeride_lab.ui.report_format import number, percent

__all__ = [
    "Headline",
    "bubble_headline",
    "cost_headline",
    "harvest_headline",
    "headlines",
    "overhead_headline",
]


@dataclass(frozen=True)
class Headline:
    """One line of the first screen: ``label``, the figure (``value``) and what it means."""

    key: str
    label: str
    value: str
    detail: str


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def bubble_headline(summary: pd.DataFrame | None) -> Headline:
    """Mean measured vs theory bubble fraction over the ranks."""
    label = "Bubble fraction"
    if summary is None or not {"measured_frac", "theory_frac"} <= set(summary.columns):
        return Headline("bubbles", label, "not measured yet", "no step has been recorded")
    measured = float(summary["measured_frac"].mean())
    theory = float(summary["theory_frac"].mean())
    ranks = len(summary)
    value = f"{percent(measured)} measured vs {percent(theory)} theory"
    detail = (
        f"idle share of each rank's step time, mean over {ranks} rank{'s' * (ranks != 1)}; "
        "theory is the schedule's own bubble fraction"
    )
    return Headline("bubbles", label, value, detail)


def overhead_headline(overheads: Mapping[str, Any] | None) -> Headline:
    """Training's slowdown in steps that ran side-task work, with its 95% interval."""
    label = "Side-task overhead"
    o = dict(overheads or {})
    if not o.get("side_task_steps"):
        return Headline("overhead", label, "no side tasks ran", "training ran alone")
    mean = o.get("training_overhead_mean_frac", o.get("training_overhead_frac"))
    if not _finite(mean):
        return Headline(
            "overhead",
            label,
            "not measurable",
            "needs steps both with and without side-task work to compare",
        )
    value = percent(mean, sign=True)
    lo, hi = o.get("training_overhead_lo_frac"), o.get("training_overhead_hi_frac")
    with_n = number(o.get("steps_with_side_tasks"))
    without_n = number(o.get("steps_without_side_tasks"))
    if _finite(lo) and _finite(hi):
        value += f" [95% interval {percent(lo, sign=True)}, {percent(hi, sign=True)}]"
        detail = f"mean step time, {with_n} steps with side tasks vs {without_n} without"
    else:
        detail = (
            f"mean step time, {with_n} steps with side tasks vs {without_n} without; "
            "no interval (needs at least two steps of each kind)"
        )
    return Headline("overhead", label, value, detail)


def harvest_headline(
    bubbles: pd.DataFrame, side_task_steps: pd.DataFrame, ledger: pd.DataFrame | None
) -> Headline:
    """Share of the bubble time that side-task steps used, and the work they did."""
    label = "Harvest"
    if side_task_steps.empty:
        return Headline("harvest", label, "nothing harvested", "no side-task step ran")
    idle_ms = float(bubbles["duration_ms"].sum()) if len(bubbles) else 0.0
    busy_ms = float(side_task_steps["duration_ms"].sum())
    value = percent(busy_ms / idle_ms) + " of the bubble time" if idle_ms > 0 else "—"
    work = ledger if ledger is not None and len(ledger) else None
    if work is None:
        grouped = side_task_steps.groupby(["name", "unit"], sort=False)["progress"].sum()
        done = [f"{number(v)} {u} ({n})" for (n, u), v in grouped.items()]
    else:
        done = [
            f"{number(r['progress'])} {r['unit']} ({r['name']})" for r in work.to_dict("records")
        ]
    detail = f"{number(busy_ms / 1e3)} s of side-task steps; work done: " + ", ".join(done)
    return Headline("harvest", label, value, detail)


def cost_headline(costs: Any, note: str | None = None, *, side_tasks_ran: bool = True) -> Headline:
    """FreeRide's cost saving as published and overhead-corrected, or why it is missing."""
    label = "Cost saving"
    if costs is None and not note and not side_tasks_ran:
        return Headline("cost", label, "no side tasks ran", "nothing to count")
    if note:
        return Headline("cost", label, note.split(":")[0], note)
    if dataclasses.is_dataclass(costs) and not isinstance(costs, type):
        costs = dataclasses.asdict(costs)
    if isinstance(costs, pd.DataFrame) and len(costs) == 1:
        costs = costs.iloc[0].to_dict()
    if not isinstance(costs, Mapping):
        return Headline("cost", label, "not computed", "no cost figures were given")
    published = next((v for k, v in costs.items() if "published" in str(k)), None)
    corrected = next((v for k, v in costs.items() if "corrected" in str(k)), None)
    if not (_finite(published) and _finite(corrected)):
        return Headline("cost", label, "not computed", "no cost figures were given")
    value = f"{percent(corrected)} overhead-corrected ({percent(published)} as published)"
    detail = (
        "FreeRide's saving on the training server's price; the published figure leaves out "
        "what the slowdown costs"
    )
    return Headline("cost", label, value, detail)


def headlines(
    *,
    summary: pd.DataFrame | None,
    overheads: Mapping[str, Any] | None,
    bubbles: pd.DataFrame,
    side_task_steps: pd.DataFrame,
    ledger: pd.DataFrame | None,
    costs: Any,
    cost_note: str | None,
) -> list[Headline]:
    """The four lines of the first screen, in order."""
    return [
        bubble_headline(summary),
        overhead_headline(overheads),
        harvest_headline(bubbles, side_task_steps, ledger),
        cost_headline(costs, cost_note, side_tasks_ran=not side_task_steps.empty),
    ]
