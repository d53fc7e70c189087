"""Step budgets, memory requests, profiles, the step guard and overrun policies."""

from __future__ import annotations

import math

import pytest
from freeride_paper import SIDE_TASKS
from hypothesis import given
from hypothesis import strategies as st

from freeride_lab.core.budget import (
    GIB,
    OverrunActionKind,
    OverrunPolicy,
    OverrunStats,
    Profile,
    apply_overrun_policy,
    memory_request_gib,
    profile_from_steps,
    should_step,
    step_budget_s,
)


@pytest.mark.parametrize(("name", "median_s", "peak_gib", "request_gib", "budget_s"), SIDE_TASKS)
def test_budget_reproduces_the_paper_table_row(
    name: str, median_s: float, peak_gib: float, request_gib: int, budget_s: float
) -> None:
    assert step_budget_s(median_s) == budget_s


@pytest.mark.parametrize(("name", "median_s", "peak_gib", "request_gib", "budget_s"), SIDE_TASKS)
def test_memory_request_reproduces_the_paper_table_row(
    name: str, median_s: float, peak_gib: float, request_gib: int, budget_s: float
) -> None:
    assert memory_request_gib(int(peak_gib * GIB)) == request_gib


@pytest.mark.parametrize(("median_s", "expected"), [(0.03, 0.036), (0.07, 0.084), (0.01, 0.012)])
def test_budget_of_an_exact_multiple_of_10ms_is_not_rounded_up(
    median_s: float, expected: float
) -> None:
    assert math.ceil(0.07 / 0.01) == 8  # the float trap the tolerance avoids
    assert step_budget_s(median_s) == expected


def test_budget_of_zero_is_zero() -> None:
    assert step_budget_s(0.0) == 0.0


def test_budget_honours_custom_rounding_and_factor() -> None:
    assert step_budget_s(0.0306, round_to_s=0.005, factor=1.5) == pytest.approx(0.0525)


@pytest.mark.parametrize("bad", [-0.1, math.nan, math.inf])
def test_budget_rejects_negative_or_non_finite_step_time(bad: float) -> None:
    with pytest.raises(ValueError, match="median_step_s="):
        step_budget_s(bad)


def test_memory_request_of_exactly_4_gib_stays_4() -> None:
    assert memory_request_gib(4 * GIB) == 4
    assert memory_request_gib(4 * GIB + 1) == 5


def test_memory_request_rejects_negative_peak() -> None:
    with pytest.raises(ValueError, match="peak_bytes=-1"):
        memory_request_gib(-1)


@given(st.floats(min_value=0.0, max_value=100.0, allow_nan=False))
def test_budget_is_at_least_factor_times_median(median_s: float) -> None:
    assert step_budget_s(median_s) >= 1.2 * median_s * (1 - 1e-9)


def test_profile_from_steps_uses_the_median_and_skips_warmup() -> None:
    steps = [1.0, 0.031, 0.030, 0.032, 0.030, 0.031]
    profile = profile_from_steps(steps, int(3.63 * GIB), warmup_steps=1, sm_pct=50)
    assert profile.median_step_s == pytest.approx(0.031)
    assert profile.n_steps == 5
    assert profile.p95_step_s >= profile.median_step_s
    assert profile.budget_s() == 0.048
    assert profile.memory_request_gib == 4
    assert profile.sm_pct == 50 and profile.memory_cap_bytes is None


def test_profile_from_steps_says_how_many_steps_remained_when_empty() -> None:
    with pytest.raises(ValueError, match=r"warmup_steps=3 \(got 2\)"):
        profile_from_steps([0.1, 0.2], 0, warmup_steps=3)


def test_profile_rejects_p95_below_median() -> None:
    with pytest.raises(ValueError, match=r"p95_step_s=0\.1 < median_step_s=0\.2"):
        Profile(median_step_s=0.2, p95_step_s=0.1, peak_memory_bytes=0, n_steps=1)


def test_should_step_only_while_more_than_budget_is_left() -> None:
    assert should_step(now_ns=0, predicted_end_ns=100, budget_ns=99, observed_end=False)
    assert not should_step(now_ns=1, predicted_end_ns=100, budget_ns=99, observed_end=False)
    assert not should_step(now_ns=50, predicted_end_ns=100, budget_ns=99, observed_end=False)


def test_should_step_never_after_the_bubble_was_seen_to_end() -> None:
    assert not should_step(now_ns=0, predicted_end_ns=10**9, budget_ns=1, observed_end=True)


def _stats(overruns: int, steps: int = 100) -> OverrunStats:
    return OverrunStats(
        steps=steps, overruns=overruns, overrun_ns_total=overruns * 2_000_000, budget_ns=48_000_000
    )


@pytest.mark.parametrize("policy", list(OverrunPolicy))
def test_overrun_policy_does_nothing_under_the_limit(policy: OverrunPolicy) -> None:
    action = apply_overrun_policy(policy, _stats(overruns=5))
    assert action.kind is OverrunActionKind.NONE


@pytest.mark.parametrize("policy", list(OverrunPolicy))
def test_overrun_policy_waits_for_min_steps(policy: OverrunPolicy) -> None:
    action = apply_overrun_policy(policy, _stats(overruns=10, steps=10), min_steps=20)
    assert action.kind is OverrunActionKind.NONE


@pytest.mark.parametrize(
    ("policy", "kind"),
    [
        (OverrunPolicy.WARN, OverrunActionKind.WARN),
        (OverrunPolicy.SHRINK_BUDGET, OverrunActionKind.SET_BUDGET),
        (OverrunPolicy.PAUSE, OverrunActionKind.PAUSE),
        (OverrunPolicy.KILL, OverrunActionKind.STOP),
    ],
)
def test_overrun_policy_maps_to_its_action_over_the_limit(
    policy: OverrunPolicy, kind: OverrunActionKind
) -> None:
    action = apply_overrun_policy(policy, _stats(overruns=10))
    assert action.kind is kind
    assert "10/100 steps overran" in action.reason


def test_shrink_budget_grows_the_guard_by_the_factor_or_the_mean_overrun() -> None:
    action = apply_overrun_policy(OverrunPolicy.SHRINK_BUDGET, _stats(overruns=10))
    assert action.budget_ns == 60_000_000  # 48 ms x 1.25 > 48 ms + 2 ms mean overrun
    big = OverrunStats(
        steps=100, overruns=10, overrun_ns_total=10 * 30_000_000, budget_ns=48_000_000
    )
    assert apply_overrun_policy(OverrunPolicy.SHRINK_BUDGET, big).budget_ns == 78_000_000


def test_shrink_budget_falls_back_to_pause_past_the_maximum_guard() -> None:
    action = apply_overrun_policy(
        OverrunPolicy.SHRINK_BUDGET, _stats(overruns=10), max_budget_ns=50_000_000
    )
    assert action.kind is OverrunActionKind.PAUSE
    assert "max_budget_ns=50000000" in action.reason


def test_overrun_stats_reject_more_overruns_than_steps() -> None:
    with pytest.raises(ValueError, match="overruns=3 > steps=2"):
        OverrunStats(steps=2, overruns=3, overrun_ns_total=0, budget_ns=0)


def test_the_tight_budget_uses_the_tail_that_freeride_rounding_leaves() -> None:
    from freeride_lab.core.budget import tight_step_budget_s

    # a 2 ms step: FreeRide guards 12 ms of every bubble's tail, the tight rule under 3 ms
    assert step_budget_s(0.002) == pytest.approx(0.012)
    assert tight_step_budget_s(0.002) == pytest.approx(0.0027)
    # still never below the slow steps it is guarding against
    assert tight_step_budget_s(0.030) > 0.030


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"p95_step_s": -1.0}, "p95_step_s"),
        ({"p95_step_s": math.nan}, "p95_step_s"),
        ({"p95_step_s": 0.01, "factor": 0.9}, "factor"),
        ({"p95_step_s": 0.01, "slack_s": -0.1}, "slack_s"),
    ],
)
def test_a_tight_budget_refuses_bad_numbers(kwargs: dict, match: str) -> None:
    from freeride_lab.core.budget import tight_step_budget_s

    with pytest.raises(ValueError, match=match):
        tight_step_budget_s(**kwargs)


def test_a_step_overran_when_its_overrun_is_positive_and_missing_means_it_did_not() -> None:
    from freeride_lab.core.budget import overran, overrun_mask

    assert overrun_mask([0, 1, None, math.nan, -5, 1e-6]).tolist() == [
        False, True, False, False, False, True,
    ]  # fmt: skip
    assert overran(2_000_000) and not overran(None)


@given(st.one_of(st.none(), st.integers(-(10**12), 10**12), st.floats(allow_nan=True)))
def test_one_steps_verdict_is_the_masks(value: float | int | None) -> None:
    """The host's per-step check (plain Python) and the tables' count (numpy) are one rule."""
    from freeride_lab.core.budget import overran, overrun_mask

    assert overran(value) == bool(overrun_mask([value])[0])


@given(st.lists(st.one_of(st.none(), st.integers(-10, 10**9)), max_size=50))
def test_overrun_stats_count_what_the_mask_counts(values: list[int | None]) -> None:
    from freeride_lab.core.budget import OverrunStats, overrun_mask

    stats = OverrunStats.of(values)
    assert (stats.steps, stats.overruns) == (len(values), int(overrun_mask(values).sum()))
    assert stats.overrun_ns_total == sum(v for v in values if v is not None and v > 0)
