"""Claims about the analytic bubble fractions (pipelining-and-gpu.md §5)."""

from __future__ import annotations

import pytest

from freeride_lab.core.plan import Costs, simulate_summary
from freeride_lab.core.schedule import SCHEDULES
from freeride_lab.core.theory import theory_bubble_fraction, theory_table

# Worked fractions of step from the reference (§5): p, m, GPipe/1F1B, Interleaved v=2, ZB-H1.
WORKED = [
    (4, 4, 42.9, 27.3, 20.0),
    (4, 8, 27.3, 15.8, 11.1),
    (4, 16, 15.8, 8.6, 5.9),
    (8, 8, 46.7, 30.4, 22.6),
    (8, 32, 17.9, 9.9, 6.8),
    (16, 8, 65.2, 48.4, 38.5),
]


@pytest.mark.parametrize(("p", "m", "one_f_one_b", "_i", "_z"), WORKED)
@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
def test_gpipe_and_1f1b_match_worked_table(
    schedule: str, p: int, m: int, one_f_one_b: float, _i: float, _z: float
) -> None:
    assert theory_bubble_fraction(schedule, p, m) * 100 == pytest.approx(one_f_one_b, abs=0.05)


@pytest.mark.parametrize(("p", "m", "_g", "interleaved", "_z"), WORKED)
def test_interleaved_with_two_chunks_matches_worked_table(
    p: int, m: int, _g: float, interleaved: float, _z: float
) -> None:
    frac = theory_bubble_fraction("Interleaved1F1B", p, m, chunks=2)
    assert frac * 100 == pytest.approx(interleaved, abs=0.05)


@pytest.mark.parametrize(("p", "m", "_g", "_i", "zb_h1"), WORKED)
def test_interleaved_zero_bubble_with_one_chunk_matches_zb_h1_worked_table(
    p: int, m: int, _g: float, _i: float, zb_h1: float
) -> None:
    assert theory_bubble_fraction("InterleavedZeroBubble", p, m, 1) * 100 == pytest.approx(
        zb_h1, abs=0.05
    )


SHAPES = [(p, m, v) for p in (2, 3, 4, 6) for m in (p, p + 1, 2 * p, 3 * p) for v in (1, 2, 3)]


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_every_formula_is_the_idle_share_of_torchs_plan_at_uniform_costs(schedule: str) -> None:
    """The planner runs the installed torch's plan with F = I = W and no overheads; each
    formula must give its idle share on every rank (a schedule's own ideal, not a paper's)."""
    spec = SCHEDULES[schedule]
    checked = 0
    for p, m, v in SHAPES:
        if (not spec.multi and v != 1) or (spec.fixed_chunks and v != spec.fixed_chunks):
            continue
        try:
            summary = simulate_summary(schedule, p, m, v, costs=Costs())
        except ValueError:  # torch cannot run this shape
            continue
        want = theory_bubble_fraction(schedule, p, m, v)
        assert summary["idle_frac"].to_numpy() == pytest.approx(want, abs=1e-9), (p, m, v)
        checked += 1
    assert checked >= 6, f"{schedule}: only {checked} shapes ran"


def test_1f1b_fraction_does_not_depend_on_measured_costs() -> None:
    costs = {"t_forward": 20.0, "t_backward_input": 35.0, "t_backward_weight": 0.0}
    assert theory_bubble_fraction("1F1B", 4, 8, **costs) == theory_bubble_fraction("1F1B", 4, 8)


def test_zb_h1_uses_measured_costs() -> None:
    frac = theory_bubble_fraction(
        "InterleavedZeroBubble", 4, 8, 2, t_forward=1.0, t_backward_input=2.0, t_backward_weight=1.0
    )
    assert frac == pytest.approx(3 * 2 / (2 * 8 * 4 + 3 * 2))  # v = 2 chunks
    costs = Costs(forward_ms=1.0, backward_input_ms=2.0, backward_weight_ms=1.0)
    planned = simulate_summary("InterleavedZeroBubble", 4, 8, 2, costs=costs)["idle_frac"]
    assert planned.to_numpy() == pytest.approx(frac)


def test_zb_h1_is_clamped_at_zero_when_weight_half_dominates() -> None:
    frac = theory_bubble_fraction(
        "InterleavedZeroBubble", 4, 8, 2, t_forward=1.0, t_backward_input=1.0, t_backward_weight=5.0
    )
    assert frac == 0.0


def test_looped_bfs_uses_the_interleaved_formula() -> None:
    assert theory_bubble_fraction("LoopedBFS", 4, 8, 2) == theory_bubble_fraction(
        "Interleaved1F1B", 4, 8, 2
    )


def test_interleaved_chunks_default_to_the_schedule_default_of_two() -> None:
    assert theory_bubble_fraction("Interleaved1F1B", 4, 8) == pytest.approx(3 / 19)


def test_zbv_keeps_one_action_of_bubble_per_stage_in_torchs_plan() -> None:
    assert theory_bubble_fraction("ZBVZeroBubble", 4, 8) == pytest.approx(3 / 51)
    assert theory_bubble_fraction("ZBVZeroBubble", 4, 4) == pytest.approx(6 / 30)


def test_dualpipev_is_torchs_sequential_plan_with_held_sends() -> None:
    assert theory_bubble_fraction("DualPipeV", 4, 8) == pytest.approx(6 / 54)


def test_schedule_names_match_without_regard_to_case() -> None:
    assert theory_bubble_fraction("interleaved1f1b", 4, 8, 2) == theory_bubble_fraction(
        "Interleaved1F1B", 4, 8, 2
    )


def test_unknown_schedule_error_names_the_value_and_valid_options() -> None:
    with pytest.raises(ValueError, match=r"'1f2b'.*1F1B"):
        theory_bubble_fraction("1f2b", 4, 8)


def test_one_stage_has_no_bubble() -> None:
    assert theory_bubble_fraction("1F1B", 1, 8) == 0.0


def test_rejects_stages_below_one() -> None:
    with pytest.raises(ValueError, match="stages=0"):
        theory_bubble_fraction("1F1B", 0, 8)


def test_rejects_negative_costs() -> None:
    with pytest.raises(ValueError, match="t_forward=-1"):
        theory_bubble_fraction("1F1B", 4, 8, t_forward=-1.0)


def test_single_stage_schedule_rejects_several_chunks() -> None:
    with pytest.raises(ValueError, match="chunks=2"):
        theory_bubble_fraction("1F1B", 4, 8, chunks=2)


def test_theory_table_has_one_row_per_registered_schedule() -> None:
    table = theory_table(4, 8)
    assert list(table["schedule"]) == list(SCHEDULES)


def test_theory_table_notes_what_dualpipev_s_value_describes() -> None:
    row = theory_table(4, 8).set_index("schedule").loc["DualPipeV"]
    assert row["theory_frac"] == pytest.approx(6 / 54) and "OVERLAP_F_B" in row["note"]


def test_theory_table_gives_single_stage_schedules_one_chunk() -> None:
    chunks = theory_table(4, 8, chunks=3).set_index("schedule")["chunks"]
    assert (chunks["1F1B"], chunks["Interleaved1F1B"], chunks["ZBVZeroBubble"]) == (1, 3, 2)
