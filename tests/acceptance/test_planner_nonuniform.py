"""Acceptance: stages with their own costs, in real runs and in the planner.

Synthetic runs whose stage chunks each sleep their own F and backward costs (``RunConfig``
per-stage ``t_*_ms``): a hand-picked mix (one stage twice as slow as the others) and mixes
drawn at random (seeded) from 5-25 ms. Every stage chunk must take its own costs, and the
planner, fed the run's measured costs (``Costs.from_actions``: means per stage and kind plus
the dispatch and communication time it estimates from the same table), must give each rank's
idle share within 5% of the measured one (the steps after the warm-up, global windows), and
the typical (median) step within 7.5%.

The costs model the run as gloo runs it (``Costs.from_actions(statistic="mean",
rendezvous=True)``, [Note: rendezvous] in ``core/plan/simulate.py``): a message passes only once
its receive is posted, so an action fed by another rank starts ``comm_ms`` after the later of
its rank being free and its input leaving, and a sender that waits on its send blocks until the
receiver has posted. Means, not medians, of the durations and waits: a step is a sum along its
critical path, and on a loaded two-core box the sleeps and waits are right-skewed (medians made
the slow and neighbouring ranks of these runs 3-16% idler than planned). With nothing else on
the two cores (as in CI, which runs these one at a time) two batches put every rank's idle share
within 2.1% of the measured one. On a box shared with other work it was within 6% over three
batches, and on an overloaded one (the stage sleeps themselves overshot by 3-4 ms) the GPipe
mix's first ranks came out 11% less idle than measured: the 5% holds where the sleeps are
honest. The median step came out within 5%, and 5.5% short on the overloaded box, hence 7.5%.
"""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest
from acceptance_runs import finished
from gated_runs import GatedResult, GatedRun

from freeride_lab.core.bubbles import bubble_fraction
from freeride_lab.core.plan import Costs, compare_with_run, simulate, simulate_summary

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS, SKIP_STEPS = 10, 2
REL_TOL = 0.05  # each rank's idle share
STEP_TOL = 0.075  # the median step (within 5% unless the box is overloaded; see above)


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
    costs = Costs.from_actions(
        result.measured, stages=run.stages * run.chunks, statistic="mean", rendezvous=True
    )
    simulated = simulate(
        run.schedule, run.stages, run.microbatches, run.chunks, costs=costs, steps=1
    )
    sim = bubble_fraction(simulated).groupby("rank")["idle_frac"].mean().to_numpy()
    real = measured_idle(result)
    rel = np.abs(sim - real) / real
    assert (rel < REL_TOL).all(), pd.DataFrame({"measured": real, "simulated": sim, "rel": rel})


@pytest.mark.parametrize("run", DRAWN, ids=str)
def test_planner_predicts_each_ranks_idle_share_within_5pct_for_drawn_costs(
    runs: dict[GatedRun, GatedResult], run: GatedRun
) -> None:
    result = finished(runs, run)
    table = compare_with_run(
        result.actions, run.schedule, run.stages, run.microbatches, run.chunks,
        skip_steps=SKIP_STEPS,
    )  # fmt: skip
    assert (table["rel_diff"].abs() < REL_TOL).all(), f"{run.t_forward_ms}\n{table.to_string()}"


@pytest.mark.parametrize("run", GATED_RUNS, ids=str)
def test_planner_predicts_the_median_step(runs: dict[GatedRun, GatedResult], run: GatedRun) -> None:
    result = finished(runs, run)
    measured = result.measured
    windows = measured.groupby("step").agg(lo=("start_ms", "min"), hi=("end_ms", "max"))
    real = float((windows["hi"] - windows["lo"]).median())
    costs = Costs.from_actions(
        measured, stages=run.stages * run.chunks, statistic="mean", rendezvous=True
    )
    summary = simulate_summary(run.schedule, run.stages, run.microbatches, run.chunks, costs=costs)
    predicted = float(summary["window_ms"].iloc[0])
    assert abs(predicted - real) / real < STEP_TOL, f"{run}: {predicted:.1f} ms vs {real:.1f} ms"
