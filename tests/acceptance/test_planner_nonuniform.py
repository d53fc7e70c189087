"""Acceptance: stages with their own costs, in real runs and in the planner.

Synthetic runs whose stage chunks each sleep their own F and backward costs (``RunConfig``
per-stage ``t_*_ms``): a hand-picked mix (one stage twice as slow as the others) and mixes
drawn at random (seeded) from 5-25 ms. Every stage chunk must take its own costs, and the
planner, fed the run's measured costs (``Costs.from_actions``: medians per stage and kind plus
the dispatch and communication time it estimates from the same table), must give each rank's
idle share within 10% of the measured one (the steps after the warm-up, global windows).

Why 10% and not the 5% that uniform 100 ms stages meet (``test_planner_vs_run.py``): torch's
1F1B waits for each forward send before the next one (and fuses the steady-state sends with
the next receive), and gloo completes a send only once the receiver has posted its receive.
So a fast stage cannot run more than about one micro-batch ahead of a slower neighbour, and
the slow stage then waits for inputs the planner has ready in advance: the planner's idle
share came out 3-9% (relative) below the measured one on the slow and neighbouring ranks of
these runs, on a loaded two-core box. The planner models data dependencies, dispatch and
communication delay, not send completion.
"""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest
from gated_runs import GatedFarm, GatedResult, GatedRun

from freeride_lab.core.bubbles import bubble_fraction
from freeride_lab.core.plan import Costs, compare_with_run, simulate
from freeride_lab.pipeline.launcher import RunState

pytestmark = pytest.mark.timeout(900)

STEPS, SKIP_STEPS = 10, 2
REL_TOL = 0.10


def nonuniform(
    schedule: str, stages: int, microbatches: int, chunks: int,
    forward: list[float], backward: list[float], label: str,
) -> GatedRun:  # fmt: skip
    """A run whose stage chunk k costs forward[k] in F and backward[k] in B (half I, half W)."""
    halves = tuple(b / 2 for b in backward)
    return GatedRun(
        schedule, stages, microbatches, chunks, tuple(forward), halves, halves,
        steps=STEPS, group="nonuniform", skip_steps=SKIP_STEPS, label=label,
    )  # fmt: skip


def drawn(schedule: str, stages: int, microbatches: int, chunks: int, seed: int) -> GatedRun:
    rng = random.Random(seed)
    n = stages * chunks
    forward = [round(rng.uniform(5, 25), 1) for _ in range(n)]
    backward = [round(rng.uniform(5, 25), 1) for _ in range(n)]
    return nonuniform(schedule, stages, microbatches, chunks, forward, backward, f"seed{seed}")


SLOW_STAGE = nonuniform("1F1B", 4, 8, 1, [10, 10, 20, 10], [20, 20, 40, 20], "slow-stage")
DRAWN = [
    drawn("1F1B", 4, 8, 1, seed=1),
    drawn("GPipe", 4, 8, 1, seed=2),
    drawn("Interleaved1F1B", 2, 4, 2, seed=3),
]
GATED_RUNS = [SLOW_STAGE, *DRAWN]


@pytest.fixture(scope="module")
def runs(gated_farm: GatedFarm) -> dict[GatedRun, GatedResult]:
    return gated_farm.get(GATED_RUNS)


def finished(runs: dict[GatedRun, GatedResult], run: GatedRun) -> GatedResult:
    result = runs[run]
    assert result.state == RunState.FINISHED, result.explain()
    return result


@pytest.mark.parametrize("run", GATED_RUNS, ids=str)
def test_every_stage_chunk_sleeps_its_own_costs(
    runs: dict[GatedRun, GatedResult], run: GatedRun
) -> None:
    result = finished(runs, run)
    config = result.session.config
    table = Costs.from_actions(result.measured, stages=config.stage_count).table(
        config.stage_count
    )  # columns F, B, I, W: medians per stage chunk
    want = np.array(config.stage_costs_ms())  # F, I, W per stage chunk
    want_b = want[:, 1] + want[:, 2]
    for got, cost, kind in ((table[:, 0], want[:, 0], "F"), (table[:, 1], want_b, "B")):
        ok = (got >= 0.97 * cost) & (got <= cost + 3.0)
        assert ok.all(), f"{run} {kind}: measured {got.round(1)} ms for {cost} ms"


def measured_idle(result: GatedResult) -> np.ndarray:
    frac = bubble_fraction(result.measured).groupby("rank")["idle_frac"].mean()
    return frac.reindex(range(result.run.stages)).to_numpy(dtype=float)


def test_costs_from_actions_fed_back_into_simulate_reproduce_each_ranks_idle_share(
    runs: dict[GatedRun, GatedResult],
) -> None:
    result = finished(runs, SLOW_STAGE)
    run = result.run
    costs = Costs.from_actions(result.measured, stages=run.stages * run.chunks)
    simulated = simulate(
        run.schedule, run.stages, run.microbatches, run.chunks, costs=costs, steps=1
    )
    sim = bubble_fraction(simulated).groupby("rank")["idle_frac"].mean().to_numpy()
    real = measured_idle(result)
    rel = np.abs(sim - real) / real
    assert (rel < REL_TOL).all(), pd.DataFrame({"measured": real, "simulated": sim, "rel": rel})


@pytest.mark.parametrize("run", DRAWN, ids=str)
def test_planner_predicts_each_ranks_idle_share_within_10pct_for_drawn_costs(
    runs: dict[GatedRun, GatedResult], run: GatedRun
) -> None:
    result = finished(runs, run)
    table = compare_with_run(
        result.actions, run.schedule, run.stages, run.microbatches, run.chunks,
        skip_steps=SKIP_STEPS,
    )  # fmt: skip
    assert (table["rel_diff"].abs() < REL_TOL).all(), f"{run.t_forward_ms}\n{table.to_string()}"
