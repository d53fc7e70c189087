"""The overhead governor against a simulated plant: deterministic, no clocks."""

from __future__ import annotations

import itertools
import random

import pytest

from freeride_lab.core.governor import GovernorDecision, OverheadGovernor, StepObservation

BASE_S = 2.0


def _plant_overhead(gov: OverheadGovernor, tasks: tuple[str, ...], k: float) -> float:
    """Overhead grows with each task's SM share and shrinks as its step budget grows."""
    total = 0.0
    for t in tasks:
        sm_pct, budget_scale = gov.limits(t)
        total += k * (sm_pct / 100) / budget_scale
    return total


def _run(
    gov: OverheadGovernor, tasks: tuple[str, ...], k: float, steps: int
) -> list[tuple[int, GovernorDecision]]:
    log: list[tuple[int, GovernorDecision]] = []
    for i in range(steps):
        overhead = _plant_overhead(gov, tasks, k)
        obs = StepObservation(
            step_s=BASE_S * (1 + overhead), baseline_step_s=BASE_S, active_task_ids=tasks
        )
        log.extend((i, d) for d in gov.observe(obs))
    return log


def _governor(**kw: object) -> tuple[OverheadGovernor, tuple[str, ...]]:
    gov = OverheadGovernor(target_frac=0.01, **kw)  # type: ignore[arg-type]
    tasks = ("a", "b")
    for t in tasks:
        gov.add_task(t)
    return gov, tasks


def test_converges_to_a_share_that_keeps_overhead_under_target() -> None:
    gov, tasks = _governor()
    log = _run(gov, tasks, k=0.015, steps=400)  # 3 % at full share, two tasks
    last_change = max(i for i, _ in log)
    assert last_change < 200  # settled well before the end
    assert _plant_overhead(gov, tasks, k=0.015) <= 0.01
    assert gov.limits("a")[0] < 100 and gov.limits("a")[1] == 1.0


def test_cuts_multiplicatively_and_snaps_to_the_share_step() -> None:
    gov, tasks = _governor()
    log = _run(gov, tasks, k=0.015, steps=400)
    shares = [d.sm_pct for _, d in log if d.task_id == "a"]
    assert shares[:2] == [50, 20]  # 100 x 0.5 = 50; 50 x 0.5 = 25 -> 20 (step 10)


def test_raises_share_additively_while_far_below_target() -> None:
    gov = OverheadGovernor(target_frac=0.01)
    gov.add_task("a", sm_pct=10)
    log = _run(gov, ("a",), k=0.001, steps=200)
    assert [d.sm_pct for _, d in log] == [20, 30, 40, 50, 60, 70, 80, 90, 100]
    assert gov.limits("a") == (100, 1.0)


def test_holds_inside_the_hysteresis_band() -> None:
    gov, tasks = _governor()
    # 0.75 % at full share: above low water (0.5 %), below target (1 %)
    assert _run(gov, tasks, k=0.00375, steps=200) == []


def test_scales_the_step_budget_once_the_share_is_at_its_minimum() -> None:
    gov, tasks = _governor()
    _run(gov, tasks, k=0.2, steps=600)  # 4 % even at 10 % share
    sm_pct, budget_scale = gov.limits("a")
    assert sm_pct == 10 and budget_scale > 1.0
    assert budget_scale <= gov.budget_scale_max


def test_undoes_budget_scaling_before_raising_the_share() -> None:
    gov = OverheadGovernor(target_frac=0.01)
    gov.add_task("a", sm_pct=10, budget_scale=1.5625)  # as if scaled up twice
    log = _run(gov, ("a",), k=0.0001, steps=40)
    assert [(d.sm_pct, d.budget_scale) for _, d in log[:3]] == [(10, 1.25), (10, 1.0), (20, 1.0)]


def test_makes_no_decision_during_the_settle_period_and_the_next_window() -> None:
    gov, tasks = _governor(window=4, settle_steps=3)
    log = _run(gov, tasks, k=0.05, steps=40)
    steps = sorted({i for i, _ in log})
    gaps = [b - a for a, b in itertools.pairwise(steps)]
    assert all(g == 3 + 4 for g in gaps)  # settle, then a full fresh window


def test_only_tasks_active_in_the_window_are_cut() -> None:
    gov, _ = _governor(window=2, settle_steps=0)
    obs = StepObservation(step_s=BASE_S * 1.05, baseline_step_s=BASE_S, active_task_ids=("b",))
    gov.observe(obs)
    decisions = gov.observe(obs)
    assert [d.task_id for d in decisions] == ["b"]
    assert gov.limits("a") == (100, 1.0)


def test_slow_steps_with_no_side_task_active_cut_nothing() -> None:
    gov, _ = _governor(window=2, settle_steps=0)
    obs = StepObservation(step_s=BASE_S * 1.05, baseline_step_s=BASE_S, active_task_ids=())
    assert gov.observe(obs) == [] and gov.observe(obs) == []


def test_learns_its_baseline_from_steps_without_side_task_activity() -> None:
    gov, tasks = _governor(window=2, settle_steps=0, evidence=0.5)
    for _ in range(5):
        gov.observe(StepObservation(step_s=BASE_S, active_task_ids=()))
    assert gov.baseline_step_s == pytest.approx(BASE_S)
    loaded = StepObservation(step_s=BASE_S * 1.04, active_task_ids=tasks)
    decisions = [d for _ in range(4) for d in gov.observe(loaded)]
    # the mean over every step since the start, side tasks active or not: 3 x 4% / 8 > 1%
    assert [d.sm_pct for d in decisions] == [50, 50]
    assert decisions[0].reason.startswith("overhead 1.50% > target")


def test_waits_without_a_baseline() -> None:
    gov, tasks = _governor(window=1, settle_steps=0)
    assert gov.observe(StepObservation(step_s=9.0, active_task_ids=tasks)) == []
    assert gov.overhead_frac is None


def test_sm_clock_drop_counts_as_overload_even_without_a_slower_step() -> None:
    gov, tasks = _governor(window=2, settle_steps=0)
    fast = dict(step_s=BASE_S, baseline_step_s=BASE_S, active_task_ids=tasks)
    assert gov.observe(StepObservation(sm_clock_mhz=1980, **fast)) == []  # type: ignore[arg-type]
    decisions = gov.observe(StepObservation(sm_clock_mhz=1500, **fast))  # type: ignore[arg-type]
    assert [d.sm_pct for d in decisions] == [50, 50]
    assert "SM clock 1500 MHz" in decisions[0].reason


def test_power_over_the_limit_counts_as_overload() -> None:
    gov, tasks = _governor(window=1, settle_steps=0, power_limit_w=600.0)
    obs = StepObservation(step_s=BASE_S, baseline_step_s=BASE_S, active_task_ids=tasks, power_w=650)
    assert "power 650 W > 600 W" in gov.observe(obs)[0].reason


def test_a_board_near_its_power_cap_counts_as_overload_before_training_slows() -> None:
    gov, tasks = _governor(window=1, settle_steps=0)  # default: 95% of the cap
    even = dict(step_s=BASE_S, baseline_step_s=BASE_S, active_task_ids=tasks, power_cap_w=700.0)
    assert gov.observe(StepObservation(power_w=600.0, **even)) == []  # type: ignore[arg-type]
    decisions = gov.observe(StepObservation(power_w=680.0, **even))  # type: ignore[arg-type]
    assert [d.sm_pct for d in decisions] == [50, 50]
    assert "power 680 W > 665 W (95% of the 700 W cap)" in decisions[0].reason


def test_without_device_signals_only_step_time_decides() -> None:
    gov, tasks = _governor(window=1, settle_steps=0, device_signals=False)
    even = dict(step_s=BASE_S, baseline_step_s=BASE_S, active_task_ids=tasks)
    assert gov.observe(StepObservation(sm_clock_mhz=1980, **even)) == []  # type: ignore[arg-type]
    hot = StepObservation(power_w=699.0, power_cap_w=700.0, sm_clock_mhz=1000, **even)  # type: ignore[arg-type]
    assert gov.observe(hot) == []


def test_a_power_cap_without_side_tasks_running_cuts_nobody() -> None:
    gov, _ = _governor(window=1, settle_steps=0)
    obs = StepObservation(step_s=BASE_S, baseline_step_s=BASE_S, active_task_ids=(),
                          power_w=690.0, power_cap_w=700.0)  # fmt: skip
    assert gov.observe(obs) == []  # training alone at the cap is not the side tasks' doing


@pytest.mark.parametrize("frac", [0.0, -0.1, 1.5])
def test_a_power_cap_share_outside_0_1_is_refused(frac: float) -> None:
    with pytest.raises(ValueError, match="power_cap_frac"):
        OverheadGovernor(power_cap_frac=frac)


def test_decision_reason_states_the_measured_overhead_its_bound_and_the_change() -> None:
    gov, tasks = _governor(window=2, settle_steps=0)
    for step_s in (1.02, 1.04):
        decisions = gov.observe(
            StepObservation(step_s=BASE_S * step_s, baseline_step_s=BASE_S, active_task_ids=tasks)
        )
    assert decisions == []  # 3% +- 6.3%: not yet
    decisions = gov.observe(
        StepObservation(step_s=BASE_S * 1.03, baseline_step_s=BASE_S, active_task_ids=tasks)
    )
    assert decisions == []  # between windows
    (first, _) = gov.observe(
        StepObservation(step_s=BASE_S * 1.03, baseline_step_s=BASE_S, active_task_ids=tasks)
    )
    reason = "overhead 3.00% (>= 2.04% at 95%, 4 steps) > target 1.00%: SM share 100 -> 50%"
    assert first == GovernorDecision("a", 50, 1.0, reason)
    gov, tasks = _governor(window=1, settle_steps=0, evidence=0.5)
    obs = StepObservation(step_s=BASE_S * 1.03, baseline_step_s=BASE_S, active_task_ids=tasks)
    (first, _) = gov.observe(obs)
    assert first.reason == "overhead 3.00% > target 1.00%: SM share 100 -> 50%"


def test_rejects_a_target_given_in_percent() -> None:
    with pytest.raises(ValueError, match="target_frac=1 must be in"):
        OverheadGovernor(target_frac=1)


def test_rejects_a_start_share_outside_its_range() -> None:
    gov = OverheadGovernor()
    with pytest.raises(ValueError, match="sm_pct=5 outside"):
        gov.add_task("a", sm_pct=5)


def _trickle_plant(gov: OverheadGovernor, k_duty: float) -> float:
    """Work between bubbles costs ``k_duty`` per unit of duty; work in bubbles costs nothing."""
    return k_duty * (gov.trickle_duty("t") or 0.0)


def _run_trickle(gov: OverheadGovernor, k_duty: float, steps: int) -> list[GovernorDecision]:
    log: list[GovernorDecision] = []
    for _ in range(steps):
        obs = StepObservation(
            step_s=BASE_S * (1 + _trickle_plant(gov, k_duty)),
            baseline_step_s=BASE_S,
            active_task_ids=("t",),
        )
        log.extend(gov.observe(obs))
    return log


def test_trickle_duty_settles_where_the_overhead_ceiling_holds() -> None:
    gov = OverheadGovernor(target_frac=0.01, window=2, settle_steps=0)
    gov.add_task("t", trickle_duty=0.0)
    log = _run_trickle(gov, k_duty=0.04, steps=600)  # full duty would cost 4%
    duty = gov.trickle_duty("t")
    # it climbs until the overhead is above the low water (0.5%), and stays under the ceiling
    assert duty is not None and 0.125 <= duty <= 0.25  # 0.25 x 4% = the 1% ceiling
    assert [d.trickle_duty for d in log[:3]] == [0.05, 0.1, 0.15]
    assert gov.limits("t") == (100, 1.0)  # SM share and budget untouched while duty covers it


def test_trickle_duty_is_cut_first_and_raised_last() -> None:
    gov = OverheadGovernor(target_frac=0.01, window=1, settle_steps=0, evidence=0.5)
    gov.add_task("t", sm_pct=50, budget_scale=1.25, trickle_duty=0.4)
    over = StepObservation(step_s=BASE_S * 1.05, baseline_step_s=BASE_S, active_task_ids=("t",))
    cuts = [gov.observe(over)[0] for _ in range(3)]
    assert [d.trickle_duty for d in cuts] == [0.2, 0.1, 0.05]  # duty halves, share untouched
    assert all((d.sm_pct, d.budget_scale) == (50, 1.25) for d in cuts)
    assert gov.observe(over)[0].trickle_duty == 0.025
    assert gov.observe(over)[0].trickle_duty == 0.0  # under trickle_min: bubbles only
    assert gov.observe(over)[0].sm_pct == 20  # only then the share

    gov = OverheadGovernor(target_frac=0.01, window=1, settle_steps=0, evidence=0.5, sm_max_pct=60)
    gov.add_task("t", sm_pct=50, budget_scale=1.25, trickle_duty=0.0)
    idle = StepObservation(step_s=BASE_S, baseline_step_s=BASE_S, active_task_ids=("t",))
    raises = [gov.observe(idle)[0] for _ in range(3)]
    assert [(d.budget_scale, d.sm_pct, d.trickle_duty) for d in raises] == [
        (1.0, 50, 0.0),  # the budget back first
        (1.0, 60, 0.0),  # then the share
        (1.0, 60, 0.05),  # duty last
    ]


def test_a_bubbles_only_task_has_no_duty_and_refuses_a_bad_one() -> None:
    gov = OverheadGovernor(target_frac=0.01, window=1, settle_steps=0, evidence=0.5)
    gov.add_task("a")
    over = StepObservation(step_s=BASE_S * 1.05, baseline_step_s=BASE_S, active_task_ids=("a",))
    assert gov.observe(over)[0].trickle_duty is None
    assert gov.trickle_duty("a") is None
    with pytest.raises(ValueError, match=r"trickle_duty=1\.5 outside"):
        gov.add_task("b", trickle_duty=1.5)
    with pytest.raises(ValueError, match="trickle_min"):
        OverheadGovernor(trickle_min=0.5, trickle_max=0.2)


def _noisy_run(seed: int, overhead: float, evidence: float, steps: int = 400) -> list[int]:
    """The bench's governor (target 0.5%, windows of 3) over steps that vary by 2% (with one
    in twenty 2.5 times as far off, as an emulated-peer pipeline's steps do); the side task
    costs ``overhead`` at budget scale 1 and less as its guard grows. The steps where the
    governor changed something."""
    rng = random.Random(seed)
    gov = OverheadGovernor(
        target_frac=0.005, sm_min_pct=100, sm_max_pct=100, window=3, settle_steps=1,
        evidence=evidence,
    )  # fmt: skip
    gov.add_task("a")
    changed = []
    for i in range(steps):
        noise = rng.gauss(0, 0.02) * (2.5 if rng.random() < 0.05 else 1.0)
        cost = overhead / gov.limits("a")[1]
        obs = StepObservation(
            step_s=BASE_S * (1 + cost + noise), baseline_step_s=BASE_S, active_task_ids=("a",)
        )
        if gov.observe(obs):
            changed.append(i)
    return changed


def test_noise_alone_changes_nothing_where_the_mean_alone_chases_it() -> None:
    with_evidence = [_noisy_run(seed, 0.0, 0.95) for seed in range(10)]
    assert with_evidence == [[]] * 10
    mean_alone = [_noisy_run(seed, 0.0, 0.5) for seed in range(10)]
    assert sum(bool(c) for c in mean_alone) >= 5  # what the evidence is for


def test_a_real_overhead_above_the_noise_is_still_cut_within_a_few_windows() -> None:
    for seed in range(10):
        changed = _noisy_run(seed, 0.03, 0.95, steps=60)
        assert changed and changed[0] < 30, seed


def test_evidence_outside_its_range_is_refused() -> None:
    with pytest.raises(ValueError, match=r"evidence=0\.4 must be in"):
        OverheadGovernor(evidence=0.4)
    with pytest.raises(ValueError, match="evidence_max=1"):
        OverheadGovernor(evidence_max=1)


def test_old_samples_drop_out_so_a_late_overhead_is_seen_promptly() -> None:
    gov = OverheadGovernor(target_frac=0.01, window=2, settle_steps=0, evidence_max=8)
    gov.add_task("a")
    quiet = StepObservation(step_s=BASE_S, baseline_step_s=BASE_S, active_task_ids=("a",))
    for _ in range(100):
        assert gov.observe(quiet) == []
    loaded = StepObservation(step_s=BASE_S * 1.03, baseline_step_s=BASE_S, active_task_ids=("a",))
    first = next(i for i in range(100) if gov.observe(loaded))
    assert first < 8  # not after the 100 quiet steps are outweighed
