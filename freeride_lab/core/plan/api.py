"""The planner's public verbs: simulate a schedule, summarise its idle time, compare a run.

    >>> costs = Costs(forward_ms=1.0, backward_ms=2.0)
    >>> summary = simulate_summary("1F1B", stages=4, microbatches=4, costs=costs)
    >>> float(summary.idle_frac[0])  # (S-1)/(M+S-1) = 3/7
    0.42857142857142855

``simulate`` returns an actions table with exactly the schema of a real run, so the bubble
analyses work on it unchanged; the semantics are in ``core.plan.simulate`` ([Note: planner
semantics]).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from freeride_lab.core.plan.arrays import PlanArrays, resolve_plan, sizes
from freeride_lab.core.plan.costs import _LETTERS, ACTION_COLUMNS, Costs, PlanLike
from freeride_lab.core.plan.simulate import levels_summary, run_plan, summary_frame
from freeride_lab.core.schedule import Schedule

__all__ = ["compare_with_run", "simulate", "simulate_summary"]


def simulate(
    schedule: Schedule | str,
    stages: int,
    microbatches: int,
    chunks: int | None = None,
    *,
    costs: Costs | None = None,
    steps: int = 1,
    plan: PlanLike | PlanArrays | None = None,
) -> pd.DataFrame:
    """Simulated actions table of ``steps`` steps, in a real run's schema (``ACTION_COLUMNS``).

    Rows are ordered by step, rank and plan order; times are from the start of step 0. See
    [Note: planner semantics].

    Args:
        stages: pipeline ranks S (as in ``RunConfig``).
        costs: None means F = I = W = 1 ms, B = 2 ms, no overheads.
        plan: run this plan (``torch_plan`` output or ``PlanArrays``) instead of the schedule's.

    Raises:
        ValueError: the plan is incomplete or deadlocks (the message names each rank's wait).
    """
    costs = Costs() if costs is None else costs
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r} must be an integer >= 1")
    pa = resolve_plan(schedule, stages, microbatches, chunks, plan)
    start, end = run_plan(pa, costs)
    valid = np.arange(pa.kind.shape[1])[None, :] < pa.length[:, None]
    n = int(valid.sum())
    rank = np.broadcast_to(np.arange(pa.ranks)[:, None], valid.shape)[valid]
    start, end = start[valid], end[valid]
    period_ms = float(end.max()) + costs.optimizer_ms
    offset = np.repeat(np.arange(steps) * period_ms, n)
    start_ns = np.rint((np.tile(start, steps) + offset) * 1e6).astype(np.int64)
    end_ns = np.rint((np.tile(end, steps) + offset) * 1e6).astype(np.int64)
    frame = pd.DataFrame(
        {
            "step": np.repeat(np.arange(steps, dtype=np.int64), n),
            "rank": np.tile(rank.astype(np.int64), steps),
            "stage": np.tile(pa.stage[valid].astype(np.int64), steps),
            "action": np.tile(_LETTERS[pa.kind[valid]], steps),
            "microbatch": np.tile(pa.microbatch[valid].astype(np.int64), steps),
            "start_ns": start_ns,
            "end_ns": end_ns,
            "start_ms": start_ns / 1e6,
            "end_ms": end_ns / 1e6,
        }
    )
    frame["duration_ms"] = frame["end_ms"] - frame["start_ms"]
    return frame[ACTION_COLUMNS]


def simulate_summary(
    schedule: Schedule | str,
    stages: int,
    microbatches: int,
    chunks: int | None = None,
    *,
    costs: Costs | None = None,
    plan: PlanLike | PlanArrays | None = None,
) -> pd.DataFrame:
    """Per-rank busy and idle ms of one step in the global window (``SUMMARY_COLUMNS``).

    The window runs from the step's earliest action start to its latest action end on any rank;
    ``idle_ms = window_ms - busy_ms``. Every simulated step is identical. GPipe and 1F1B without
    a ``plan`` and without ``costs.rendezvous`` take the closed-form level path; the rest run
    the generic engine.
    """
    costs = Costs() if costs is None else costs
    spec = Schedule.from_name(schedule) if isinstance(schedule, str) else schedule
    if plan is None and spec.name in ("GPipe", "1F1B") and not costs.rendezvous:
        S, M, _ = sizes(spec, stages, microbatches, chunks)
        return levels_summary(spec.name, S, M, costs)
    pa = resolve_plan(spec, stages, microbatches, chunks, plan)
    start, end = run_plan(pa, costs)
    dur = np.nan_to_num(end - start)
    last = end[np.arange(pa.ranks), np.maximum(pa.length - 1, 0)]
    return summary_frame(dur.sum(axis=1), start[:, 0], last)


def compare_with_run(
    actions_measured: pd.DataFrame,
    schedule: Schedule | str,
    stages: int,
    microbatches: int,
    chunks: int | None = None,
    *,
    skip_steps: int = 0,
) -> pd.DataFrame:
    """Measured vs simulated idle fraction per rank: ``rank, measured_idle_frac,
    simulated_idle_frac, rel_diff``.

    The simulation uses ``Costs.from_actions(statistic="mean", rendezvous=True)`` of the same
    table (mean durations per stage and kind, comm and dispatch estimated for gloo's rendezvous,
    [Note: rendezvous] in ``core.plan.simulate``). Measured fractions are
    ``bubbles.bubble_fraction`` (each step's global window), averaged over the steps kept.
    ``rel_diff = (simulated - measured) / measured`` (0 when both are 0, NaN when only measured
    is).

    Args:
        skip_steps: leading steps to leave out of both (warm-up); real runs want at least 1.
    """
    from freeride_lab.core.bubbles import bubble_fraction

    df = actions_measured[actions_measured["step"] >= actions_measured["step"].min() + skip_steps]
    spec = Schedule.from_name(schedule) if isinstance(schedule, str) else schedule
    costs = Costs.from_actions(
        df, stages=stages * spec.resolve_chunks(chunks), statistic="mean", rendezvous=True
    )
    sim = simulate_summary(spec, stages, microbatches, chunks, costs=costs)
    frac = bubble_fraction(df).groupby("rank")["idle_frac"].mean()
    measured = frac.reindex(range(stages)).to_numpy(dtype=float)
    simulated = sim["idle_frac"].to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(
            measured > 0, (simulated - measured) / measured, np.where(simulated == 0, 0.0, np.nan)
        )
    return pd.DataFrame(
        {
            "rank": np.arange(stages, dtype=np.int64),
            "measured_idle_frac": measured,
            "simulated_idle_frac": simulated,
            "rel_diff": rel,
        }
    )
