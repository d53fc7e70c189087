"""The planner: exact idle fractions, torch's order, dependencies, deadlocks, costs, comparison."""

from __future__ import annotations

from typing import Literal

import numpy as np
import pandas as pd
import pytest

from freeride_lab.core.bubbles import extract_bubbles
from freeride_lab.core.config import RunConfig
from freeride_lab.core.plan import (
    ACTION_COLUMNS,
    SUMMARY_COLUMNS,
    Costs,
    PlanArrays,
    compare_with_run,
    plan_arrays,
    simulate,
    simulate_summary,
)
from freeride_lab.core.schedule import SCHEDULES, Action, Schedule, torch_plan

EQUAL = Costs(forward_ms=1.0, backward_ms=2.0)


def _equal_costs(schedule: str) -> Costs:
    """F = I = W = 1 ms per rank, split over the rank's chunks (so B = 2 ms per rank)."""
    v = Schedule.from_name(schedule).resolve_chunks(None)
    return Costs(forward_ms=1 / v, backward_input_ms=1 / v, backward_weight_ms=1 / v)


def _random_costs(rng: np.random.Generator, stages: int) -> Costs:
    return Costs(
        forward_ms=tuple(rng.uniform(0.5, 2.0, stages)),
        backward_ms=tuple(rng.uniform(1.0, 4.0, stages)),
        backward_input_ms=tuple(rng.uniform(0.5, 2.0, stages)),
        backward_weight_ms=tuple(rng.uniform(0.5, 2.0, stages)),
        comm_ms=float(rng.uniform(0.0, 0.5)),
        dispatch_ms=float(rng.uniform(0.0, 0.3)),
        optimizer_ms=1.5,
    )


def _compact(plan: dict[int, list[Action | None]]) -> dict[int, list[Action]]:
    return {r: [a for a in acts if a is not None] for r, acts in plan.items()}


# -- exact fractions at equal costs ---------------------------------------------------------


@pytest.mark.parametrize("schedule", ["1F1B", "GPipe"])
@pytest.mark.parametrize("path", ["levels", "generic"])
def test_single_stage_idle_fraction_is_theory_at_s4_m4(schedule: str, path: str) -> None:
    plan = None if path == "levels" else plan_arrays(schedule, 4, 4)
    summary = simulate_summary(schedule, 4, 4, costs=EQUAL, plan=plan)
    np.testing.assert_allclose(summary["idle_frac"], 3 / 7, rtol=0, atol=1e-12)
    np.testing.assert_allclose(summary["window_ms"], 7 * 3.0, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("stages", "microbatches"), [(4, 4), (4, 8), (2, 6), (8, 16)])
def test_interleaved_idle_fraction_is_theory_at_equal_costs(stages: int, microbatches: int) -> None:
    summary = simulate_summary(
        "Interleaved1F1B", stages, microbatches, 2, costs=Costs(forward_ms=0.5, backward_ms=1.0)
    )
    expected = (stages - 1) / (2 * microbatches + stages - 1)
    np.testing.assert_allclose(summary["idle_frac"], expected, rtol=0, atol=1e-12)


def test_simulated_1f1b_bubbles_get_freeride_labels() -> None:
    bubbles = extract_bubbles(
        simulate("1F1B", 4, 4, costs=EQUAL), schedule="1F1B", stages=4, microbatches=4
    )
    labels = bubbles.groupby("rank")["label"].apply(lambda s: "".join(s.fillna("-")))
    assert labels.to_dict() == {0: "BDDD", 1: "ABDDC", 2: "ABDC", 3: "AA"}


# -- plans ----------------------------------------------------------------------------------

_SIZES = [(1, 3), (2, 4), (3, 6), (4, 4), (4, 8), (4, 12), (5, 10)]


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize(("ranks", "microbatches"), _SIZES)
def test_plan_arrays_equal_torch_plan(schedule: str, ranks: int, microbatches: int) -> None:
    try:
        expected = _compact(torch_plan(schedule, ranks, microbatches))
    except ValueError:
        pytest.skip(f"torch cannot run {schedule} at S={ranks}, M={microbatches}")
    assert plan_arrays(schedule, ranks, microbatches).to_plan() == expected


def test_1f1b_last_rank_follows_the_executed_order() -> None:
    last = plan_arrays("1F1B", 4, 8).to_plan()[3]
    assert [str(a) for a in last[:4]] == ["3F0", "3B0", "3F1", "3B1"]
    assert [str(a) for a in last[-2:]] == ["3F7", "3B7"]


def test_plan_arrays_round_trip_through_from_plan() -> None:
    plan = plan_arrays("Interleaved1F1B", 4, 8, 2)
    again = PlanArrays.from_plan(plan.to_plan(), 8)
    assert again.to_plan() == plan.to_plan()
    assert (again.stages, again.microbatches) == (8, 8)


def test_1f1b_rejects_fewer_microbatches_than_stages() -> None:
    with pytest.raises(ValueError, match="microbatches=3 < stages=4"):
        plan_arrays("1F1B", 4, 3)
    with pytest.raises(ValueError, match="microbatches=3 < stages=4"):
        simulate_summary("1F1B", 4, 3)


# -- the simulated table --------------------------------------------------------------------


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_all_schedules_simulate_at_s4_m8(schedule: str) -> None:
    summary = simulate_summary(schedule, 4, 8, costs=_equal_costs(schedule))
    assert list(summary.columns) == SUMMARY_COLUMNS
    assert ((summary["idle_frac"] >= 0) & (summary["idle_frac"] < 0.5)).all()
    np.testing.assert_allclose(summary["busy_ms"], 8 * 3.0)


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_every_action_appears_once_per_step(schedule: str) -> None:
    actions = simulate(schedule, 4, 8, costs=_equal_costs(schedule), steps=3)
    n_stages = 4 * Schedule.from_name(schedule).resolve_chunks(None)
    for _, step in actions.groupby("step"):
        assert not step.duplicated(["stage", "action", "microbatch"]).any()
        kinds = step.groupby(["stage", "microbatch"])["action"].agg(lambda s: "".join(sorted(s)))
        assert len(kinds) == n_stages * 8
        assert kinds.isin(["BF", "FIW"]).all(), kinds[~kinds.isin(["BF", "FIW"])]


def test_table_has_real_run_schema() -> None:
    actions = simulate("ZBVZeroBubble", 4, 8, steps=2)
    assert list(actions.columns) == ACTION_COLUMNS
    assert (
        actions[["step", "rank", "stage", "microbatch", "start_ns", "end_ns"]]
        .dtypes.eq("int64")
        .all()
    )
    assert actions[["start_ms", "end_ms", "duration_ms"]].dtypes.eq("float64").all()
    assert set(actions["action"]) == {"F", "I", "W"}
    np.testing.assert_allclose(actions["start_ms"], actions["start_ns"] / 1e6)


def _dependency_slack(actions: pd.DataFrame, comm_ms: float) -> pd.Series:
    """start - (dependency end + comm if on another rank), for every action with a dependency."""
    a = actions.assign(slot=actions["action"].map({"F": "F", "B": "back", "I": "back", "W": "W"}))
    deps = []
    last = int(a["stage"].max())
    for slot, dep_slot, offset in (("F", "F", -1), ("back", "back", +1), ("back", "F", 0)):
        c = a[a["slot"] == slot].assign(dep_stage=lambda d, o=offset: d["stage"] + o)
        deps.append(c[(c["dep_stage"] >= 0) & (c["dep_stage"] <= last)].assign(dep_slot=dep_slot))
    deps.append(a[a["slot"] == "W"].assign(dep_stage=lambda d: d["stage"], dep_slot="back"))
    need = pd.concat(deps)
    prod = a.rename(
        columns={
            "stage": "dep_stage",
            "slot": "dep_slot",
            "rank": "dep_rank",
            "end_ms": "dep_end_ms",
        }
    )
    prod = prod[["step", "dep_stage", "dep_slot", "microbatch", "dep_rank", "dep_end_ms"]]
    m = need.merge(prod, on=["step", "dep_stage", "dep_slot", "microbatch"], how="left")
    assert m["dep_end_ms"].notna().all()
    return m["start_ms"] - m["dep_end_ms"] - np.where(m["dep_rank"] != m["rank"], comm_ms, 0.0)


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_dependencies_and_rank_order_hold(schedule: str) -> None:
    rng = np.random.default_rng(7)
    v = Schedule.from_name(schedule).resolve_chunks(None)
    costs = _random_costs(rng, 4 * v)
    actions = simulate(schedule, 4, 8, costs=costs, steps=2)
    slack = _dependency_slack(actions, costs.comm_ms)
    assert (slack >= -1e-6).all()
    assert (slack.abs() < 1e-6).any()  # some action starts the moment its dependency allows
    a = actions.sort_values(["step", "rank", "start_ns"])
    gap = a["start_ms"] - a.groupby(["step", "rank"])["end_ms"].shift(1)
    assert (gap.dropna() >= costs.dispatch_ms - 1e-6).all()  # one action at a time per rank


def test_steps_are_separated_by_optimizer_ms() -> None:
    actions = simulate("1F1B", 4, 8, costs=Costs(optimizer_ms=5.0), steps=3)
    win = actions.groupby("step").agg(lo=("start_ms", "min"), hi=("end_ms", "max"))
    np.testing.assert_allclose(win["lo"].to_numpy()[1:] - win["hi"].to_numpy()[:-1], 5.0)


@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
@pytest.mark.parametrize(("stages", "microbatches"), [(1, 3), (2, 2), (3, 4), (5, 5), (6, 17)])
def test_level_path_matches_generic_engine(schedule: str, stages: int, microbatches: int) -> None:
    costs = _random_costs(np.random.default_rng(stages * 100 + microbatches), stages)
    fast = simulate_summary(schedule, stages, microbatches, costs=costs)
    slow = simulate_summary(
        schedule,
        stages,
        microbatches,
        costs=costs,
        plan=plan_arrays(schedule, stages, microbatches),
    )
    pd.testing.assert_frame_equal(fast, slow, rtol=1e-12, atol=1e-9)


def test_summary_matches_table_for_a_multi_chunk_schedule() -> None:
    costs = _random_costs(np.random.default_rng(3), 8)
    summary = simulate_summary("InterleavedZeroBubble", 4, 8, costs=costs)
    table = simulate("InterleavedZeroBubble", 4, 8, costs=costs)
    busy = table.groupby("rank")["duration_ms"].sum().to_numpy()
    window = table["end_ms"].max() - table["start_ms"].min()
    np.testing.assert_allclose(summary["busy_ms"], busy, atol=1e-5)
    np.testing.assert_allclose(summary["idle_frac"], 1 - busy / window, atol=1e-6)


# -- bad plans ------------------------------------------------------------------------------


def _parse(rows: dict[int, str]) -> dict[int, list[Action | None]]:
    return {r: [Action.parse(x) for x in text.split()] for r, text in rows.items()}


def test_cross_rank_deadlock_names_each_wait_in_short_form() -> None:
    plan = _parse({0: "0F0 0B0 0F1 0B1", 1: "1F0 1F1 1B0 1B1"})
    with pytest.raises(ValueError, match="deadlock") as err:
        simulate("GPipe", 2, 2, plan=plan)
    assert "rank 0 waits on 1B0 before 0B0" in str(err.value)
    assert "rank 1 waits on 0F1 before 1F1" in str(err.value)


def test_local_order_deadlock_names_the_missing_forward() -> None:
    plan = _parse({0: "0B0 0F0"})
    with pytest.raises(ValueError, match="rank 0 waits on 0F0 before 0B0"):
        simulate_summary("GPipe", 1, 1, plan=plan)


def test_incomplete_plan_is_rejected_before_running() -> None:
    plan = _parse({0: "0F0 0F1 0B0", 1: "1F0 1F1 1B0 1B1"})
    with pytest.raises(ValueError, match=r"\(stage 0, micro-batch 1\) has 1xF 0xB"):
        simulate("GPipe", 2, 2, plan=plan)


def test_plan_with_wrong_rank_count_is_rejected() -> None:
    with pytest.raises(ValueError, match="plan has 4 ranks but stages=2"):
        simulate("1F1B", 2, 4, plan=torch_plan("1F1B", 4, 4))


# -- costs ----------------------------------------------------------------------------------


def test_costs_reject_negative_values_with_the_value() -> None:
    with pytest.raises(ValueError, match=r"comm_ms=-1\.0"):
        Costs(comm_ms=-1.0)


def test_costs_reject_per_stage_lengths_that_do_not_match_the_plan() -> None:
    with pytest.raises(ValueError, match="forward_ms has 3 per-stage values but the plan has 4"):
        simulate_summary("GPipe", 4, 4, costs=Costs(forward_ms=(1.0, 1.0, 1.0)))


def test_full_backward_defaults_to_input_plus_weight() -> None:
    table = Costs(backward_input_ms=1.5, backward_weight_ms=0.5).table(2)
    np.testing.assert_allclose(table[:, 1], 2.0)


@pytest.mark.parametrize(
    ("rendezvous", "statistic"), [(False, "median"), (True, "mean")], ids=["free", "rendezvous"]
)
def test_from_actions_recovers_costs_of_a_simulated_run(
    rendezvous: bool, statistic: Literal["median", "mean"]
) -> None:
    truth = Costs(
        forward_ms=(1.0, 1.2, 0.8, 1.1),
        backward_ms=(2.0, 2.5, 1.5, 2.2),
        comm_ms=0.3,
        dispatch_ms=0.1,
        rendezvous=rendezvous,
    )
    table = simulate("1F1B", 4, 8, costs=truth, steps=2)
    got = Costs.from_actions(table, statistic=statistic, rendezvous=rendezvous)
    assert got.rendezvous is rendezvous
    np.testing.assert_allclose(got.forward_ms, truth.forward_ms, atol=1e-6)
    np.testing.assert_allclose(got.backward_ms, truth.backward_ms, atol=1e-6)
    assert got.comm_ms == pytest.approx(0.3, abs=1e-6)
    assert got.dispatch_ms == pytest.approx(0.1, abs=1e-6)


def test_from_actions_fills_full_backward_from_input_and_weight() -> None:
    got = Costs.from_actions(simulate("ZBVZeroBubble", 2, 4, costs=Costs(backward_input_ms=2.0)))
    np.testing.assert_allclose(got.table(4)[:, 1], 3.0)


def test_from_config_splits_rank_costs_over_chunks() -> None:
    cfg = RunConfig(
        schedule="InterleavedZeroBubble",
        stages=2,
        microbatches=4,
        workload="synthetic",
        t_forward_ms=20.0,
        t_backward_input_ms=10.0,
        t_backward_weight_ms=6.0,
    )
    table = Costs.from_config(cfg).table(4)
    np.testing.assert_allclose(table[:, 0], 10.0)
    np.testing.assert_allclose(table[1:, 2:], [[5.0, 3.0]] * 3)
    np.testing.assert_allclose(table[0, 2:], [0.0, 8.0])  # torch's stage-0 W does all


# -- comparison with a run ------------------------------------------------------------------


def _noisy_run(schedule: str, stages: int, microbatches: int, costs: Costs) -> pd.DataFrame:
    """A simulated run whose actions each end up to 2% early (dependencies still hold)."""
    actions = simulate(schedule, stages, microbatches, costs=costs, steps=4)
    rng = np.random.default_rng(11)
    shrink = 1 - rng.uniform(0, 0.02, len(actions))
    end_ns = actions["start_ns"] + np.rint((actions["end_ns"] - actions["start_ns"]) * shrink)
    actions = actions.assign(end_ns=end_ns.astype("int64"))
    actions["end_ms"] = actions["end_ns"] / 1e6
    actions["duration_ms"] = actions["end_ms"] - actions["start_ms"]
    return actions


@pytest.mark.parametrize("schedule", ["1F1B", "Interleaved1F1B", "ZBVZeroBubble"])
def test_compare_with_run_agrees_within_5pct_on_a_noisy_run(schedule: str) -> None:
    v = Schedule.from_name(schedule).resolve_chunks(None)
    costs = Costs(
        forward_ms=10 / v,
        backward_input_ms=10 / v,
        backward_weight_ms=10 / v,
        comm_ms=0.4,
        dispatch_ms=0.2,
    )
    result = compare_with_run(_noisy_run(schedule, 4, 8, costs), schedule, 4, 8, skip_steps=1)
    assert list(result.columns) == ["rank", "measured_idle_frac", "simulated_idle_frac", "rel_diff"]
    assert (result["rel_diff"].abs() < 0.05).all(), result


def test_compare_with_run_flags_a_run_of_other_sizes() -> None:
    measured = _noisy_run("1F1B", 4, 8, EQUAL)
    result = compare_with_run(measured, "1F1B", 4, 4)
    assert (result["rel_diff"] > 0.3).all()


def test_dualpipev_results_leave_the_rank_only_after_the_whole_overlapped_action() -> None:
    """torch sends an OVERLAP_F_B action's results after both sub-actions ([Note: held sends]):
    rank 0's 3F2 needs rank 1's 2F2, which rank 1 runs overlapped with 1B0, so 3F2 waits for
    1B0 to end as well (measured on gloo: 3F2 started 0.4 ms after 1B0 ended, 100 ms after
    2F2)."""
    sim = simulate("DualPipeV", 2, 4, costs=Costs())
    at = sim.set_index(sim["stage"].astype(str) + sim["action"] + sim["microbatch"].astype(str))
    assert at.loc["2F2", "rank"] == at.loc["1B0", "rank"] == 1
    assert at.loc["1B0", "start_ms"] == at.loc["2F2", "end_ms"]  # one overlapped action
    assert at.loc["3F2", "start_ms"] == at.loc["1B0", "end_ms"]
