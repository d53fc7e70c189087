"""Acceptance: measured bubble fractions of real runs against theory.

Each run is a real pipeline (``Session.launch``: torchrun, gloo, one process per rank) of
sleep-timed synthetic stages. The measured fraction is the mean over ranks and over the steps
after the warm-up of each rank's idle share of the step's **global** window (the only window
that compares with ``theory_bubble_fraction``; see ``core/bubbles.py``). Real runs add
dispatch and communication gaps on top of the ideal schedule, so they may sit a little above
theory but never clearly below it: the band is [theory - 1, theory + 5] percentage points.
"""

from __future__ import annotations

import pytest
from acceptance_runs import FinishedRun, Shape, finished

from freeride_lab.core.bubbles import bubble_fraction
from freeride_lab.core.theory import theory_bubble_fraction

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]  # runs start in the first setup

SIZES = [(2, 4), (4, 4), (4, 8)]
CLASSIC = ["GPipe", "1F1B", "Interleaved1F1B"]
ZERO_BUBBLE = ["InterleavedZeroBubble", "ZBVZeroBubble"]
SHAPES = [Shape(name, s, m) for name in CLASSIC for s, m in SIZES]
ZB_SIZE = (4, 8)
ZB_SHAPES = [Shape(name, *ZB_SIZE) for name in ZERO_BUBBLE]
RUNS = [*SHAPES, *ZB_SHAPES]


def measured_fraction(run: FinishedRun) -> float:
    """Mean over ranks and measured steps of the idle share of each step's global window."""
    return float(bubble_fraction(run.measured)["idle_frac"].mean())


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_measured_bubble_fraction_is_within_minus_1_plus_5_points_of_theory(
    runs: dict[Shape, FinishedRun], shape: Shape
) -> None:
    run = finished(runs, shape)
    config = run.session.config
    theory = theory_bubble_fraction(shape.schedule, shape.stages, shape.microbatches, config.chunks)
    measured = measured_fraction(run)
    assert theory - 0.01 <= measured <= theory + 0.05, (
        f"{shape} (chunks={config.chunks}): measured {measured:.2%}, theory {theory:.2%}"
    )


def test_run_summary_shows_the_same_measured_fraction_next_to_theory(
    runs: dict[Shape, FinishedRun],
) -> None:
    run = runs[Shape("1F1B", 4, 8)]
    summary = run.session.summary()  # what the CLI prints: skips step 0 by itself
    assert summary["theory_frac"].tolist() == pytest.approx([3 / 11] * 4)
    assert summary["measured_frac"].mean() == pytest.approx(measured_fraction(run))


@pytest.mark.parametrize("name", ZERO_BUBBLE)
def test_zero_bubble_schedule_measures_below_1f1b_at_the_same_size(
    runs: dict[Shape, FinishedRun], name: str
) -> None:
    zb = finished(runs, Shape(name, *ZB_SIZE))
    one_f_one_b = finished(runs, Shape("1F1B", *ZB_SIZE))
    zb_frac, ref_frac = measured_fraction(zb), measured_fraction(one_f_one_b)
    assert zb_frac < ref_frac, f"{name} {zb_frac:.2%} vs 1F1B {ref_frac:.2%} at S, M = {ZB_SIZE}"
