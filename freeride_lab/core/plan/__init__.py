"""The planner: a discrete-event simulator of pipeline schedules from per-action costs.

It runs a plan (torch's order for each rank) against per-(stage, kind) costs and returns an
actions table with exactly the schema of a real run, so the bubble analyses work on it unchanged.

    costs   ``Costs``: what each action costs, measured from a run or given
    arrays  ``PlanArrays``, ``plan_arrays``: a plan as per-rank arrays, checked runnable
    simulate the engines ([Note: planner semantics], [Note: vectorised rounds])
    api     ``simulate``, ``simulate_summary``, ``compare_with_run``
    critical ``action_floats``: how much later each action of a step could end before the
            step ends later (the critical-path method over the same dependencies)
"""

from __future__ import annotations

from freeride_lab.core.plan.api import compare_with_run, simulate, simulate_summary
from freeride_lab.core.plan.arrays import PlanArrays, plan_arrays
from freeride_lab.core.plan.costs import ACTION_COLUMNS, KIND_CODES, SUMMARY_COLUMNS, Costs
from freeride_lab.core.plan.critical import action_floats

__all__ = [
    "ACTION_COLUMNS",
    "KIND_CODES",
    "SUMMARY_COLUMNS",
    "Costs",
    "PlanArrays",
    "action_floats",
    "compare_with_run",
    "plan_arrays",
    "simulate",
    "simulate_summary",
]
