"""95% confidence intervals for figures measured over a few blocks of a benchmark run.

A benchmark figure comes from 2-10 blocks per mode, so every interval here is a Student-t
interval (exact for normal block values, and block values are medians or sums over several
steps, close to normal); the only bootstrap is for percentiles, which have no t-interval.

    >>> iv = mean_interval([0.010, 0.012, 0.008, 0.011, 0.009])
    >>> round(iv.value, 4), round(iv.lo, 4), round(iv.hi, 4)
    (0.01, 0.008, 0.012)

[Note: why t and not the bootstrap]
With n = 5 blocks the percentile bootstrap of a mean is about 37% narrower than the t-interval
(its standard error is s·√((n-1)/n)/√n and it uses z = 1.96 instead of t₄ = 2.78), and an
interval built from the order statistics of a median cannot reach 95% below six values. The
t-interval is the one that keeps its coverage at this size. Percentiles of signal latency
(thousands of values in 10-40 blocks) are the exception: ``bootstrap_percentile_interval``
resamples whole blocks, so values of one block stay together.

[Note: paired design]
An overhead is a mean of per-block differences d_i = m_i / mean(neighbouring vanilla blocks)
- 1 (``bench.stats`` [Note: paired ratios]). Two neighbouring mode blocks share the
vanilla block between them, so their differences are positively correlated and the plain
s/√n is too small (by ≈ 14% at n = 5 when all blocks are equally noisy). ``mean_interval``
takes the design: W (one row per difference: +1 on its block, -1/k on each of its k vanilla
neighbours) gives Cov(d) = σ²·WWᵀ under independent block noise of one variance σ². Then
E[s²] = σ²·(tr C - 1ᵀC1/n)/(n-1) and Var(mean d) = σ²·1ᵀC1/n² with C = WWᵀ, which is what
``mean_interval`` uses (df n - 1). If the mode blocks are noisier than the vanilla ones the
interval is a little wider than it needs to be; it is never narrower for that reason.

[Note: sums of intervals]
Independent figures (one stage at a time, each from its own blocks) add their variances; the
degrees of freedom of the sum come from Welch-Satterthwaite, (Σ se²)² / Σ (se⁴ / df).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

__all__ = [
    "CONFIDENCE",
    "Interval",
    "bootstrap_percentile_interval",
    "bootstrap_percentile_ratio_interval",
    "mean_interval",
    "quotient_interval",
    "ratio_interval",
    "sum_interval",
    "t_quantile",
]

#: The confidence level of every interval the benchmark reports.
CONFIDENCE = 0.95
_NAN = math.nan


@dataclass(frozen=True, slots=True)
class Interval:
    """A figure with its two-sided confidence interval.

    ``se`` and ``df`` are the standard error and degrees of freedom behind ``lo``..``hi``
    (NaN when fewer than two blocks gave a value: the figure stands without an interval);
    ``n`` counts the blocks the figure came from.
    """

    value: float
    lo: float
    hi: float
    se: float
    df: float
    n: int

    @classmethod
    def point(cls, value: float, n: int = 1) -> Interval:
        """A figure without an interval (too few blocks)."""
        return cls(value, _NAN, _NAN, _NAN, _NAN, n)

    @classmethod
    def of(
        cls, value: float, se: float, df: float, n: int, *, confidence: float = CONFIDENCE
    ) -> Interval:
        """``value`` ± t(df)·``se``; a point figure when ``se`` or ``df`` is not usable."""
        if not (math.isfinite(value) and math.isfinite(se) and df > 0):  # df may be inf
            return cls.point(value, n)
        half = t_quantile(0.5 + confidence / 2, df) * se
        return cls(value, value - half, value + half, se, df, n)

    def scaled(self, k: float) -> Interval:
        """The interval of ``k`` times the figure (``k`` a known constant)."""
        lo, hi = self.lo * k, self.hi * k
        return Interval(self.value * k, min(lo, hi), max(lo, hi), abs(self.se * k), self.df, self.n)

    def shifted(self, c: float) -> Interval:
        """The interval of the figure + ``c`` (a known constant)."""
        return Interval(self.value + c, self.lo + c, self.hi + c, self.se, self.df, self.n)

    @property
    def has_bounds(self) -> bool:
        return math.isfinite(self.lo) and math.isfinite(self.hi)

    def record(self, digits: int = 5) -> dict[str, float]:
        """The figure and its bounds as a result file keeps them, rounded to ``digits``.

        >>> Interval.of(0.123456789, 0.01, 4, 5).record(3)
        {'value': 0.123, 'lo': 0.096, 'hi': 0.151}
        """
        return {k: round(getattr(self, k), digits) for k in ("value", "lo", "hi")}


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (df may be fractional).

    Hand-written (the package does not depend on scipy): the CDF through the regularized
    incomplete beta function, inverted by bisection to 1e-12.

    >>> round(t_quantile(0.975, 4), 4), round(t_quantile(0.975, 1e9), 4)
    (2.7764, 1.96)
    """
    if not 0 < p < 1:
        raise ValueError(f"p={p} must be in (0, 1)")
    if not df > 0:
        raise ValueError(f"df={df} must be > 0")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    if p == 0.5:
        return 0.0
    if df > 1e7:
        return NormalDist().inv_cdf(p)
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if _t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2


def _t_cdf(t: float, df: float) -> float:
    """P(T <= t) for t >= 0."""
    x = df / (df + t * t)
    return 1.0 - 0.5 * _betainc(df / 2, 0.5, x)


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) (continued fraction, Lentz)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast on the other side
        return 1.0 - _betainc(b, a, 1.0 - x)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 500):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return math.exp(log_front) * f / a


def _finite(values: Iterable[float]) -> np.ndarray:
    a = np.asarray([float(v) for v in values], dtype=float)
    kept: np.ndarray = a[np.isfinite(a)]
    return kept


def mean_interval(
    values: Sequence[float],
    *,
    design: np.ndarray | None = None,
    confidence: float = CONFIDENCE,
) -> Interval:
    """The mean of per-block ``values`` with its t-interval (df n - 1).

    Args:
        design: C = WWᵀ of the values' construction from independent, equally noisy blocks
            (see [Note: paired design]); None for independent values (C = identity). Values
            that are NaN must already be left out of both.
    """
    x = np.asarray(values, dtype=float)
    if not np.isfinite(x).all():
        raise ValueError(f"values {x.tolist()} hold NaN or infinity; leave those blocks out")
    n = int(x.size)
    if n == 0:
        return Interval.point(_NAN, 0)
    mean = float(x.mean())
    if n < 2:
        return Interval.point(mean, n)
    s2 = float(x.var(ddof=1))
    if design is None:
        se2 = s2 / n
    else:
        c = np.asarray(design, dtype=float)
        if c.shape != (n, n):
            raise ValueError(f"design is {c.shape}; it must be ({n}, {n}) for {n} values")
        total = float(c.sum())
        spread = (float(np.trace(c)) - total / n) / (n - 1)
        se2 = s2 / spread * total / n**2 if spread > 0 else _NAN
    return Interval.of(mean, math.sqrt(se2), n - 1, n, confidence=confidence)


def ratio_interval(
    numerators: Sequence[float],
    denominators: Sequence[float],
    *,
    confidence: float = CONFIDENCE,
) -> Interval:
    """Σ numerators ÷ Σ denominators over blocks, with the ratio estimator's t-interval.

    For rates measured per block (units ÷ wall seconds): the estimate weighs blocks by their
    length, and its standard error is √(Σ (x_i - R·y_i)² / (n - 1) / n) / ȳ (first-order,
    df n - 1). Blocks where either value is NaN are left out.
    """
    x = np.asarray(numerators, dtype=float)
    y = np.asarray(denominators, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"{x.size} numerators but {y.size} denominators; give one of each")
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    n = int(x.size)
    if n == 0 or float(y.sum()) <= 0:
        return Interval.point(_NAN, n)
    r = float(x.sum() / y.sum())
    if n < 2:
        return Interval.point(r, n)
    resid = x - r * y
    se = math.sqrt(float((resid**2).sum()) / (n - 1) / n) / float(y.mean())
    return Interval.of(r, se, n - 1, n, confidence=confidence)


def sum_interval(parts: Sequence[Interval], *, confidence: float = CONFIDENCE) -> Interval:
    """The sum of independent figures: variances add, df by Welch-Satterthwaite.

    A part without an interval leaves the sum without one (its value still adds).
    """
    if not parts:
        return Interval.point(0.0, 0)
    value = sum(p.value for p in parts)
    n = sum(p.n for p in parts)
    if not all(math.isfinite(p.se) and p.df > 0 for p in parts):  # df may be inf, not NaN
        return Interval.point(value, n)
    var = sum(p.se**2 for p in parts)
    if var == 0:
        return Interval(value, value, value, 0.0, math.inf, n)
    welch = sum(p.se**4 / p.df for p in parts if p.se > 0)  # 0: every part's df is infinite
    df = var**2 / welch if welch > 0 else math.inf
    return Interval.of(value, math.sqrt(var), df, n, confidence=confidence)


def quotient_interval(num: Interval, den: Interval, *, confidence: float = CONFIDENCE) -> Interval:
    """num ÷ den for two independent figures (measured on different blocks, e.g. harvest in
    managed blocks over idle time in vanilla ones), by the delta method: relative variances
    add, df by Welch-Satterthwaite. No interval if either figure has none."""
    if not (math.isfinite(den.value) and den.value > 0):
        return Interval.point(_NAN, num.n)
    q = num.value / den.value
    if not (math.isfinite(num.se) and math.isfinite(den.se)):
        return Interval.point(q, num.n)
    den_se = den.se
    rel2 = (num.se / den.value) ** 2 + (q * den_se / den.value) ** 2
    parts = [p for p in ((num.se / den.value, num.df), (q * den_se / den.value, den.df)) if p[0]]
    if not parts:
        return Interval(q, q, q, 0.0, math.inf, num.n)
    if any(not df > 0 for _, df in parts):  # NaN: a part without an interval
        return Interval.point(q, num.n)
    welch = sum(se**4 / df for se, df in parts)
    df = rel2**2 / welch if welch > 0 else math.inf
    return Interval.of(q, math.sqrt(rel2), df, num.n, confidence=confidence)


class _Pooled:
    """Groups of values, and the percentile of any resample of whole groups, pooled, without
    building the pooled array (see [Note: pooled percentiles]).

    [Note: pooled percentiles]
    A resample of whole groups is how often it picked each group, so its pooled values are
    the groups' values sorted once, each counted that often: below sorted position k lie
    Σ_g count_g · below_g(k) of them (``below_g``: group g's values up to k), and the value of
    rank r is the first sorted value whose running count exceeds r, found by a bisection run
    for every resample at once. ``np.percentile`` (linear, the default) of N values is then
    followed step by step: h = (N - 1)·p, the values of rank ⌊h⌋ and ⌊h⌋ + 1 (both the last
    one where h ≥ N - 1), interpolated by h - ⌊h⌋ as numpy's ``_lerp`` does (a + d·t, or
    b - d·(1 - t) from t = 0.5 on). So each resample's figure equals numpy's on the
    concatenated resample, bit for bit, at the cost of groups × log₂(values) array operations
    for all resamples together instead of one sort each.
    """

    def __init__(self, groups: Sequence[np.ndarray]) -> None:
        values = np.concatenate(groups)
        labels = np.repeat(np.arange(len(groups)), [g.size for g in groups])
        order = np.argsort(values, kind="stable")
        self._values = values[order]
        # row k: how many of each group's values lie at sorted positions 0..k
        below = np.eye(len(groups), dtype=np.int32)[labels[order]]
        self._below = np.cumsum(below, axis=0, dtype=np.int32)

    def percentiles(self, picks: np.ndarray, q: float) -> np.ndarray:
        """The ``q``-th percentile of each row's groups pooled (``picks``: resamples x
        picks, group indices)."""
        groups = self._below.shape[1]
        cells = np.arange(len(picks))[:, None] * groups + picks
        counts = np.bincount(cells.ravel(), minlength=len(picks) * groups)
        counts = counts.reshape(len(picks), groups)
        total = (counts * self._below[-1]).sum(axis=1)  # values pooled
        h = (total - 1) * (q / 100)
        below = np.floor(h)
        last = h >= total - 1
        a = self._values[self._rank(counts, np.where(last, total - 1, below).astype(np.int64))]
        b = self._values[self._rank(counts, np.where(last, total - 1, below + 1).astype(np.int64))]
        t = np.where(last, h + 1, h - below)  # numpy's gamma where both ranks are the last
        d = b - a
        out: np.ndarray = np.where(t >= 0.5, b - d * (1 - t), a + d * t)
        return out

    def _rank(self, counts: np.ndarray, rank: np.ndarray) -> np.ndarray:
        """Per resample, the sorted position of its value of ``rank``: the first position
        whose running count exceeds it."""
        lo = np.zeros(len(counts), dtype=np.int64)
        hi = np.full(len(counts), len(self._values) - 1, dtype=np.int64)
        while np.any(open_ := lo < hi):
            mid = (lo + hi) // 2
            past = (counts * self._below[mid]).sum(axis=1) > rank
            hi = np.where(open_ & past, mid, hi)
            lo = np.where(open_ & ~past, mid + 1, lo)
        return lo


def bootstrap_percentile_interval(
    groups: Sequence[Sequence[float]],
    q: float,
    *,
    resamples: int = 2000,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> Interval:
    """The ``q``-th percentile (0-100) of all values pooled, with a percentile-bootstrap
    interval that resamples whole groups (blocks) with replacement.

    Seeded, so the same data give the same interval (tables are regenerated and compared).
    No interval with fewer than five non-empty groups: a bootstrap of fewer says nothing.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"q={q} must be in [0, 100]")
    kept = [_finite(g) for g in groups]
    kept = [g for g in kept if g.size]
    if not kept:
        return Interval.point(_NAN, 0)
    value = float(np.percentile(np.concatenate(kept), q))
    n = len(kept)
    if n < 5:
        return Interval.point(value, n)
    rng = np.random.default_rng(seed)
    picks = np.stack([rng.integers(0, n, size=n) for _ in range(resamples)])
    stats = _Pooled(kept).percentiles(picks, q)
    tail = (1 - confidence) / 2 * 100
    lo, hi = np.percentile(stats, [tail, 100 - tail])
    return Interval(value, float(lo), float(hi), float(stats.std(ddof=1)), _NAN, n)


def bootstrap_percentile_ratio_interval(
    groups: Sequence[Sequence[float]],
    reference: Sequence[Sequence[float]],
    q: float,
    *,
    resamples: int = 2000,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> Interval:
    """``percentile(groups, q) / percentile(reference, q) - 1`` over the values pooled, with
    a percentile-bootstrap interval that resamples whole groups (blocks) of each side.

    The tail of one mode's step times against another's: p99 step time inflation is
    ``bootstrap_percentile_ratio_interval(managed_blocks, vanilla_blocks, 99)``. Seeded; no
    interval with fewer than five non-empty groups on either side.

        >>> iv = bootstrap_percentile_ratio_interval([[11.0, 12.0]] * 5, [[10.0, 10.0]] * 5, 50)
        >>> round(iv.value, 3), round(iv.lo, 3), round(iv.hi, 3)
        (0.15, 0.15, 0.15)
    """
    if not 0 <= q <= 100:
        raise ValueError(f"q={q} must be in [0, 100]")
    a = [g for g in (_finite(g) for g in groups) if g.size]
    b = [g for g in (_finite(g) for g in reference) if g.size]
    if not a or not b:
        return Interval.point(_NAN, min(len(a), len(b)))
    value = float(np.percentile(np.concatenate(a), q) / np.percentile(np.concatenate(b), q) - 1)
    n = min(len(a), len(b))
    if n < 5:
        return Interval.point(value, n)
    rng = np.random.default_rng(seed)
    picks_a = np.empty((resamples, len(a)), dtype=np.int64)
    picks_b = np.empty((resamples, len(b)), dtype=np.int64)
    for i in range(resamples):  # the draws interleave, a's then b's, resample by resample
        picks_a[i] = rng.integers(0, len(a), size=len(a))
        picks_b[i] = rng.integers(0, len(b), size=len(b))
    stats = _Pooled(a).percentiles(picks_a, q) / _Pooled(b).percentiles(picks_b, q) - 1
    tail = (1 - confidence) / 2 * 100
    lo, hi = np.percentile(stats, [tail, 100 - tail])
    return Interval(value, float(lo), float(hi), float(stats.std(ddof=1)), _NAN, n)
