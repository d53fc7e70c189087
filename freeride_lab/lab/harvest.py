"""What side tasks harvested: the ledger and FreeRide's cost saving.

Pure functions over a run's tables; the Session's ``ledger()`` and ``cost_saving()`` call them
(where tasks could go is ``lab.stages``).

    run_ledger(session.side_task_steps, session.steps)      # one row per side task
    run_cost_saving(session.steps, session.side_task_steps) # FreeRide's saving, both ways
"""

from __future__ import annotations

import math

import pandas as pd

from freeride_lab.core.accounting import CostModel, CostSaving, cost_saving, ledger

__all__ = ["run_cost_saving", "run_ledger", "training_wall_s"]


def training_wall_s(steps: pd.DataFrame) -> float | None:
    """First step start to last step end over all ranks, in seconds (None without steps)."""
    if steps.empty:
        return None
    span_ms = float(steps["end_ms"].max()) - float(steps["start_ms"].min())
    return span_ms / 1e3 if span_ms > 0 else None


def run_ledger(side_task_steps: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """``core.accounting.ledger`` with throughput over the training's wall time."""
    return ledger(side_task_steps, wall_s=training_wall_s(steps))


def run_cost_saving(
    steps: pd.DataFrame,
    side_task_steps: pd.DataFrame,
    *,
    vanilla_step_s: float | None = None,
    model: CostModel | None = None,
) -> CostSaving:
    """FreeRide's cost saving for a run, published and overhead-corrected.

    T_f is the time from the start of step 1 to the start of the last step (step 0 is warm-up;
    the last has no successor to close it); T_v is ``vanilla_step_s`` times the steps in T_f,
    or, when None, the median period of the steps in which no side task stepped (training's own
    pace in this run). P_k counts the side-task work done in those steps, per task name
    (built-ins by their FreeRide reference key).

    Raises:
        ValueError: fewer than three steps, or no step without side tasks and no
            ``vanilla_step_s``.
        KeyError: a task without a reference throughput in ``model``.
    """
    from freeride_lab.tasks import REFERENCE_KEYS

    if steps.empty or steps["step"].nunique() < 3:
        n = 0 if steps.empty else steps["step"].nunique()
        raise ValueError(f"cost saving needs >= 3 training steps; this run has {n} so far")
    starts = steps.groupby("step")["start_ms"].min().sort_index()
    periods_s = (starts.shift(-1) - starts).dropna() / 1e3
    periods_s = periods_s[periods_s.index >= 1]
    freeride_s = float(periods_s.sum())
    window = set(int(s) for s in periods_s.index)
    work = side_task_steps[side_task_steps["step"].isin(window)]
    if vanilla_step_s is None:
        quiet = periods_s[~periods_s.index.isin(set(side_task_steps["step"].astype(int)))]
        if quiet.empty:
            raise ValueError(
                "every step ran side-task work, so this run has no vanilla pace; pass "
                "vanilla_step_s= (seconds per step of the same run with side_tasks=False)"
            )
        vanilla_step_s = float(quiet.median())
    if not math.isfinite(vanilla_step_s) or vanilla_step_s <= 0:
        raise ValueError(f"vanilla_step_s={vanilla_step_s!r} must be > 0 seconds")
    progress: dict[str, float] = {}
    for name, value in work.groupby("name")["progress"].sum().items():
        key = REFERENCE_KEYS.get(str(name), str(name))
        progress[key] = progress.get(key, 0.0) + float(value)
    return cost_saving(
        progress, vanilla_s=vanilla_step_s * len(periods_s), freeride_s=freeride_s, model=model
    )
