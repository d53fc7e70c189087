"""95% intervals of benchmark figures: t quantiles, means, ratios, sums, block bootstrap."""

from __future__ import annotations

import math

import numpy as np
import pytest

from freeride_lab.core.intervals import (
    Interval,
    bootstrap_percentile_interval,
    bootstrap_percentile_ratio_interval,
    mean_interval,
    quotient_interval,
    ratio_interval,
    sum_interval,
    t_quantile,
)


@pytest.mark.parametrize(
    ("df", "expected"),
    [(1, 12.7062047), (2, 4.3026527), (4, 2.7764451), (9, 2.2621572), (30, 2.0422725)],
)
def test_t_quantile_matches_the_printed_tables(df: float, expected: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(expected, rel=1e-7)


def test_t_quantile_tends_to_the_normal_and_is_symmetric() -> None:
    assert t_quantile(0.975, 1e9) == pytest.approx(1.959964, rel=1e-6)
    assert t_quantile(0.025, 4) == pytest.approx(-t_quantile(0.975, 4))


def test_t_quantile_takes_fractional_degrees_of_freedom() -> None:
    assert t_quantile(0.975, 2) > t_quantile(0.975, 2.5) > t_quantile(0.975, 3)


def test_t_quantile_rejects_a_probability_outside_zero_and_one() -> None:
    with pytest.raises(ValueError, match=r"p=1\.5"):
        t_quantile(1.5, 3)


def test_mean_interval_is_mean_plus_minus_t_times_standard_error() -> None:
    values = [0.010, 0.012, 0.008, 0.011, 0.009]
    iv = mean_interval(values)
    se = float(np.std(values, ddof=1)) / math.sqrt(5)
    assert iv.value == pytest.approx(0.01)
    assert iv.hi - iv.value == pytest.approx(2.7764451 * se, rel=1e-6)
    assert (iv.n, iv.df) == (5, 4)


def test_mean_of_one_block_has_no_interval() -> None:
    iv = mean_interval([0.02])
    assert iv.value == 0.02 and not iv.has_bounds


def test_mean_interval_with_an_identity_design_is_the_plain_one() -> None:
    values = [1.0, 2.0, 4.0]
    assert mean_interval(values, design=np.eye(3) * 1.5) == mean_interval(values)


def test_ratio_interval_is_a_ratio_of_sums() -> None:
    iv = ratio_interval([10.0, 30.0], [1.0, 2.0])
    assert iv.value == pytest.approx(40.0 / 3.0)
    assert iv.lo < iv.value < iv.hi


def test_ratio_interval_of_exactly_proportional_blocks_has_no_width() -> None:
    iv = ratio_interval([10.0, 20.0, 30.0], [1.0, 2.0, 3.0])
    assert (iv.value, iv.lo, iv.hi) == pytest.approx((10.0, 10.0, 10.0))


def test_sum_interval_adds_variances_and_takes_welch_degrees_of_freedom() -> None:
    a = Interval.of(0.01, 0.003, 2, 3)
    b = Interval.of(0.02, 0.004, 4, 5)
    s = sum_interval([a, b])
    assert s.value == pytest.approx(0.03)
    assert s.se == pytest.approx(0.005)
    assert s.df == pytest.approx(0.005**4 / (0.003**4 / 2 + 0.004**4 / 4))
    assert s.hi - s.value == pytest.approx(t_quantile(0.975, s.df) * 0.005)


def test_a_sum_of_parts_with_infinite_degrees_of_freedom_is_a_normal_interval() -> None:
    # exact-variance parts (df inf, e.g. a sum of sums) add to a z-interval, not an error
    s = sum_interval([Interval.of(0.1, 0.03, math.inf, 5), Interval.of(-0.06, 0.04, math.inf, 5)])
    assert s.df == math.inf and s.se == pytest.approx(0.05)
    assert (s.lo, s.hi) == pytest.approx((0.04 - 1.959964 * 0.05, 0.04 + 1.959964 * 0.05))


def test_sum_with_a_part_without_interval_has_none() -> None:
    s = sum_interval([Interval.of(0.01, 0.003, 2, 3), Interval.point(0.02)])
    assert s.value == pytest.approx(0.03) and not s.has_bounds


def test_quotient_by_an_exact_denominator_scales_the_interval() -> None:
    num = Interval.of(0.3, 0.02, 4, 5)
    q = quotient_interval(num, Interval(0.5, 0.5, 0.5, 0.0, math.inf, 5))
    assert (q.value, q.lo, q.hi) == pytest.approx((0.6, num.lo / 0.5, num.hi / 0.5))


def test_block_bootstrap_is_seeded_and_brackets_the_pooled_percentile() -> None:
    rng = np.random.default_rng(3)
    groups = [list(rng.exponential(1.0, 40)) for _ in range(12)]
    a = bootstrap_percentile_interval(groups, 50)
    assert a == bootstrap_percentile_interval(groups, 50)
    assert a.lo < a.value < a.hi
    assert a.value == pytest.approx(float(np.percentile(np.concatenate(groups), 50)))


def _resampled(groups: list[np.ndarray], picks: np.ndarray, q: float) -> float:
    return float(np.percentile(np.concatenate([groups[j] for j in picks]), q))


@pytest.mark.parametrize("q", [0, 1, 50, 99, 100])
def test_block_bootstrap_is_numpy_on_each_concatenated_resample(q: float) -> None:
    # blocks of unequal sizes with ties (rounded values), one of a single value, a NaN dropped
    rng = np.random.default_rng(7)
    groups = [np.round(rng.exponential(1.0, int(rng.integers(1, 50))), 2) for _ in range(9)]
    groups[4] = np.array([0.5])
    with_nan = [list(g) for g in groups]
    with_nan[0].append(math.nan)
    draws = np.random.default_rng(0)
    stats = np.array([_resampled(groups, draws.integers(0, 9, size=9), q) for _ in range(300)])
    iv = bootstrap_percentile_interval(with_nan, q, resamples=300)
    lo, hi = np.percentile(stats, [(1 - 0.95) / 2 * 100, 100 - (1 - 0.95) / 2 * 100])
    assert (iv.lo, iv.hi, iv.se) == (float(lo), float(hi), float(stats.std(ddof=1)))


def test_percentile_ratio_bootstrap_is_numpy_on_each_pair_of_resamples() -> None:
    rng = np.random.default_rng(11)
    a = [rng.normal(10.0, 1.0, int(rng.integers(3, 30))) for _ in range(6)]
    b = [rng.normal(9.0, 1.0, int(rng.integers(3, 30))) for _ in range(7)]
    draws = np.random.default_rng(0)
    stats = []
    for _ in range(200):  # a's picks, then b's, resample by resample
        pa, pb = draws.integers(0, 6, size=6), draws.integers(0, 7, size=7)
        stats.append(_resampled(a, pa, 99) / _resampled(b, pb, 99) - 1)
    iv = bootstrap_percentile_ratio_interval(a, b, 99, resamples=200)
    lo, hi = np.percentile(stats, [(1 - 0.95) / 2 * 100, 100 - (1 - 0.95) / 2 * 100])
    assert (iv.lo, iv.hi, iv.se) == (float(lo), float(hi), float(np.std(stats, ddof=1)))


def test_block_bootstrap_gives_no_interval_for_fewer_than_five_blocks() -> None:
    iv = bootstrap_percentile_interval([[1.0, 2.0], [3.0], [4.0]], 50)
    assert iv.value == 2.5 and not iv.has_bounds
