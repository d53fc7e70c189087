"""Acceptance: every schedule's measured bubble fraction matches its theory on every rank.

Each run is a real pipeline of sleep-timed synthetic stages whose every action (F, I, W of one
stage chunk) costs ``ACTION_MS``. The measured fraction of a rank is the median,
over the steps after the warm-up, of its idle share of the step's global window; theory is
``theory_bubble_fraction``, the idle share of the plan torch runs with no overheads. A real run
adds host and peer time between actions (torch's schedule runtime and gloo's send and receive:
0.6-2.4 ms per action on a two-core box, whatever the action's length, as
``benchmarks/bench_fidelity.py`` measures it), so it may sit a little above theory: the band is
[theory - 1, theory + 3] percentage points. Below theory by more than a point would mean the
instrument misses idle time. ``ACTION_MS`` keeps that host time a small share of each action
(see ``test_planner_nonuniform.py`` for the planner, which models it).

Every shape (S in {2, 4}, M in {S, 2S}, V in {1, 2} where the schedule takes it; 40 runs, 120
ranks) is in the second tier (``slow``), which CI runs. They go through one ``GatedFarm`` group:
batches of up to ``MAX_RANKS`` ranks start up together (the torch imports are most of the time),
then at most ``TRAIN_RANKS`` of a batch's ranks train at once while the others wait at the start
gate, so neither start-ups nor a crowd of pipelines on the two cores skew a measured step. The
whole set takes about eight minutes on a two-core box.
"""

from __future__ import annotations

import pytest
from acceptance_runs import finished
from gated_runs import GatedFarm, GatedResult, GatedRun

from freeride_lab.core.bubbles import bubble_fraction
from freeride_lab.core.schedule import SCHEDULES
from freeride_lab.core.theory import theory_bubble_fraction

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # the first test waits for them all

# One stage chunk's F, I or W per micro-batch. Host time between actions (0.6-2.4 ms on a
# two-core box) is a share of each action, so shorter actions sit higher above theory: at 20 ms
# GPipe, 1F1B, Interleaved1F1B, LoopedBFS and InterleavedZeroBubble came out up to 3.4-4.9
# points above it, DualPipeV up to 2.0 (at 30 ms: 2.3) and ZBVZeroBubble up to 2.1 (at 40 ms:
# 2.3). At 50 ms InterleavedZeroBubble S4-M8-V1, whose split backward makes three actions of
# each micro-batch, came out at +3.1 on a loaded box (its worst rank in one CI run, and once
# beside other scripts); alone it sits at +2.7 (bench_fidelity). At 80 ms the same fixed host
# time is 5/8 of that share: every shape came out at +1.4 or less (one full set, beside other
# tests), InterleavedZeroBubble S4-M8-V1 at +1.0.
ACTION_MS = 80.0
STEPS = 4
SKIP_STEPS = 1
TRAIN_RANKS = 8  # ranks training at once (the batch's others wait at the start gate)
BELOW_PTS, ABOVE_PTS = 1.0, 3.0


def fidelity_run(schedule: str, stages: int, microbatches: int, chunks: int) -> GatedRun:
    per_rank = ACTION_MS * chunks  # a scalar cost is one rank's, split over its chunks
    return GatedRun(
        schedule, stages, microbatches, chunks, per_rank, per_rank, per_rank,
        steps=STEPS, group="fidelity", skip_steps=SKIP_STEPS, train_ranks=TRAIN_RANKS,
    )  # fmt: skip


def shapes(schedule: str) -> list[tuple[int, int, int]]:
    """(S, M, V): S in {2, 4}, M in {S, 2S} (DualPipeV, which needs M >= 2S: {2S, 4S}), V in
    {1, 2} where the schedule takes it."""
    spec = SCHEDULES[schedule]
    vs = [spec.fixed_chunks] if spec.fixed_chunks else ([1, 2] if spec.multi else [1])
    out = []
    for s in (2, 4):
        ms = (2 * s, 4 * s) if schedule == "DualPipeV" else (s, 2 * s)
        out += [(s, m, v) for m in ms for v in vs]
    return out


PARAMS = [
    pytest.param(fidelity_run(name, *shape), id=str(fidelity_run(name, *shape)))
    for name in SCHEDULES
    for shape in shapes(name)
]


def per_rank_fraction(result: GatedResult) -> dict[int, float]:
    """Median over measured steps of each rank's idle share of the step's global window."""
    frac = bubble_fraction(result.measured).groupby("rank")["idle_frac"].median()
    return {int(rank): float(value) for rank, value in frac.items()}


@pytest.mark.parametrize("run", PARAMS)
def test_measured_bubble_fraction_is_within_minus_1_plus_3_points_of_theory_on_every_rank(
    gated_farm: GatedFarm, run: GatedRun
) -> None:
    result = finished(gated_farm.get([run]), run)
    theory = theory_bubble_fraction(run.schedule, run.stages, run.microbatches, run.chunks)
    measured = per_rank_fraction(result)
    assert sorted(measured) == list(range(run.stages))
    off = {r: round((f - theory) * 100, 1) for r, f in measured.items()}
    worst = max(off.values(), key=abs)
    print(f"{run} at {ACTION_MS:g} ms: worst {worst:+.1f} points, per rank {off}")
    assert all(-BELOW_PTS <= d <= ABOVE_PTS for d in off.values()), (
        f"{run}: theory {theory:.1%}, measured minus theory per rank (points) {off}"
    )
