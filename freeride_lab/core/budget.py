"""Side-task budgets: the step guard, the memory request, the profile they come from, overruns.

FreeRide profiles each side task alone (paper notes §9) and derives two numbers from it:

- **step budget** = the median step time rounded *up* to 10 ms, times 1.2 — a step only
  starts if the predicted bubble still has more than this left (§10);
- **memory request** = the peak device memory rounded up to whole GiB — placement needs a
  stage with strictly more free memory (§8).

    >>> step_budget_s(0.0306)
    0.048
    >>> memory_request_gib(int(3.63 * 2**30))
    4

# [Note: float ceilings]
``math.ceil(0.07 / 0.01)`` is 8, not 7, because ``0.07 / 0.01 == 7.000000000000001``; the
reference's ``math.ceil(x * 100) / 100`` has the same flaw. ``_ceil_multiple`` treats a
quotient within 1e-9 (relative) of a positive integer as that integer, so 0.03 s stays
0.03 s and 4.0 GiB given as a float stays 4 GiB (whole bytes use exact integer division);
results are rounded to 12 decimals so 0.04 x 1.2 prints as 0.048.

# [Note: overruns]
Overruns are counted in one place, ``overrun_mask``: the task host's running count and the
log line it writes when it exits, the ``side_task_steps`` ledger, the task board's cards and
the benchmark's blocks all go through it, so over the same steps they give the same number.
Where numbers still differ, the steps differ: the overrun policy looks at the last
``task_host._OVERRUN_WINDOW`` gated steps; a benchmark block counts the steps that started
inside it, and its segment counts every step of the task (solo phases and the steps left out
after a mode switch too).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

__all__ = [
    "GIB",
    "OverrunAction",
    "OverrunActionKind",
    "OverrunPolicy",
    "OverrunStats",
    "Profile",
    "apply_overrun_policy",
    "memory_request_gib",
    "overran",
    "overrun_mask",
    "profile_from_steps",
    "should_step",
    "sized_budget_ns",
    "step_budget_s",
    "tight_step_budget_s",
]

GIB = 2**30  # bytes in one GiB; the paper's "GB" for requests and free memory is GiB
_REL_TOL = 1e-9


def _ceil_multiple(value: float, unit: float) -> int:
    """Smallest n with n·unit >= value, forgiving float noise (see [Note: float ceilings])."""
    q = value / unit
    nearest = round(q)
    if nearest > 0 and math.isclose(q, nearest, rel_tol=_REL_TOL):
        return int(nearest)
    return math.ceil(q)


def step_budget_s(median_step_s: float, *, round_to_s: float = 0.010, factor: float = 1.2) -> float:
    """The step guard in seconds: ``median_step_s`` rounded up to ``round_to_s``, x ``factor``.

    Raises:
        ValueError: a negative or non-finite step time, or a non-positive rounding unit/factor.
    """
    if not math.isfinite(median_step_s) or median_step_s < 0:
        raise ValueError(
            f"median_step_s={median_step_s!r} must be a finite number >= 0 (seconds per step)"
        )
    if not math.isfinite(round_to_s) or round_to_s <= 0:
        raise ValueError(f"round_to_s={round_to_s!r} must be > 0; FreeRide uses 0.010")
    if not math.isfinite(factor) or factor <= 0:
        raise ValueError(f"factor={factor!r} must be > 0; FreeRide uses 1.2")
    return round(_ceil_multiple(median_step_s, round_to_s) * round_to_s * factor, 12)


def tight_step_budget_s(
    p95_step_s: float, *, factor: float = 1.1, slack_s: float = 0.0005
) -> float:
    """A step guard without FreeRide's 10 ms rounding: ``p95_step_s`` x ``factor`` + ``slack_s``.

    FreeRide's rule leaves up to 10 ms x 1.2 of every bubble's tail unused, which is most of a
    20 ms bubble for a 2 ms step. Guarding with the 95th percentile instead keeps overruns
    rare while using the tail; the overhead governor scales it up if training slows anyway.

        >>> tight_step_budget_s(0.0020)
        0.0027

    Raises:
        ValueError: a negative or non-finite step time, a factor below 1, or negative slack.
    """
    if not math.isfinite(p95_step_s) or p95_step_s < 0:
        raise ValueError(f"p95_step_s={p95_step_s!r} must be a finite number >= 0 (seconds)")
    if not math.isfinite(factor) or factor < 1:
        raise ValueError(f"factor={factor!r} must be >= 1: a guard below the step overruns")
    if not math.isfinite(slack_s) or slack_s < 0:
        raise ValueError(f"slack_s={slack_s!r} must be a finite number of seconds >= 0")
    return round(p95_step_s * factor + slack_s, 12)


def memory_request_gib(peak_bytes: int | float) -> int:
    """The memory request in whole GiB: ``peak_bytes`` rounded up (3.63 GiB → 4).

    Raises:
        ValueError: a negative or non-finite peak.
    """
    if not math.isfinite(peak_bytes) or peak_bytes < 0:
        raise ValueError(f"peak_bytes={peak_bytes!r} must be a finite number of bytes >= 0")
    if isinstance(peak_bytes, int):
        return -(-peak_bytes // GIB)  # exact for whole bytes
    return _ceil_multiple(float(peak_bytes), float(GIB))


@dataclass(frozen=True, kw_only=True)
class Profile:
    """A side task measured alone, and the limits it was measured under.

    Args:
        median_step_s, p95_step_s: step durations in seconds.
        peak_memory_bytes: peak device memory of the task (NVML used memory in the reference,
            context included).
        n_steps: steps the statistics cover.
        sm_pct: the SM share (MPS active-thread percentage, 0-100) it ran with; None = uncapped.
        memory_cap_bytes: the device-memory cap it ran with; None = uncapped.
    """

    median_step_s: float
    p95_step_s: float
    peak_memory_bytes: int
    n_steps: int
    sm_pct: float | None = None
    memory_cap_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in ("median_step_s", "p95_step_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name}={value!r} must be a finite number of seconds >= 0")
        if self.p95_step_s < self.median_step_s:
            raise ValueError(
                f"p95_step_s={self.p95_step_s} < median_step_s={self.median_step_s}; "
                "the 95th percentile cannot be below the median"
            )
        if self.peak_memory_bytes < 0:
            raise ValueError(f"peak_memory_bytes={self.peak_memory_bytes} must be >= 0")
        if self.n_steps < 1:
            raise ValueError(f"n_steps={self.n_steps} must be >= 1")
        if self.sm_pct is not None and not 0 < self.sm_pct <= 100:
            raise ValueError(f"sm_pct={self.sm_pct} must be in (0, 100] or None (uncapped)")
        if self.memory_cap_bytes is not None and self.memory_cap_bytes <= 0:
            raise ValueError(f"memory_cap_bytes={self.memory_cap_bytes} must be > 0 or None")

    def budget_s(self, *, round_to_s: float = 0.010, factor: float = 1.2) -> float:
        """This profile's step guard (``step_budget_s`` of the median)."""
        return step_budget_s(self.median_step_s, round_to_s=round_to_s, factor=factor)

    def tight_budget_s(self) -> float:
        """The guard without FreeRide's rounding (``tight_step_budget_s`` of the p95)."""
        return tight_step_budget_s(self.p95_step_s)

    @property
    def memory_request_gib(self) -> int:
        """This profile's memory request in whole GiB."""
        return memory_request_gib(self.peak_memory_bytes)


def profile_from_steps(
    step_durations_s: Sequence[float],
    peak_bytes: int,
    *,
    warmup_steps: int = 0,
    sm_pct: float | None = None,
    memory_cap_bytes: int | None = None,
) -> Profile:
    """A ``Profile`` from measured step durations (seconds), skipping ``warmup_steps`` first.

    Raises:
        ValueError: no steps left after the warm-up, or a negative/non-finite duration.
    """
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps={warmup_steps} must be >= 0")
    steps = np.asarray(list(step_durations_s)[warmup_steps:], dtype=float)
    if steps.size == 0:
        raise ValueError(
            f"no step durations left after warmup_steps={warmup_steps} "
            f"(got {len(step_durations_s)}); profile more steps or lower warmup_steps"
        )
    if not np.all(np.isfinite(steps)) or np.any(steps < 0):
        raise ValueError("step durations must be finite numbers of seconds >= 0")
    return Profile(
        median_step_s=float(np.median(steps)),
        p95_step_s=float(np.percentile(steps, 95)),
        peak_memory_bytes=int(peak_bytes),
        n_steps=int(steps.size),
        sm_pct=sm_pct,
        memory_cap_bytes=memory_cap_bytes,
    )


def should_step(now_ns: int, predicted_end_ns: int, budget_ns: int, observed_end: bool) -> bool:
    """True if a step may start now: the bubble was not seen to end and has > budget left.

    The comparison is strict, as in FreeRide's ``do_i_have_enough_time``: a bubble with exactly
    ``budget_ns`` left is not used. A step in flight is never interrupted; this only gates the
    next one.
    """
    return not observed_end and predicted_end_ns - now_ns > budget_ns


def sized_budget_ns(
    budget_ns: int, size: int, top: int, top_ns: float | None, size_ns: float | None
) -> int:
    """The guard of a step of ``size`` smallest steps, where ``budget_ns`` guards the task's
    largest step, of ``top`` smallest steps.

    The guard keeps the largest step's margin in proportion: ``budget_ns`` x ``size_ns`` /
    ``top_ns``, the two sizes' recent step times, at most ``budget_ns``. Before both are timed
    a step is taken to last in proportion to its size (``size`` / ``top``): a slice of a batch
    runs a little slower per image than the whole batch, so the first guess errs short by
    about as much as the budget's own margin, and three steps of the size replace it.

        >>> sized_budget_ns(72_000_000, 1, 4, 58.5e6, 16.5e6)  # VGG-19: a quarter batch
        20307692
        >>> sized_budget_ns(72_000_000, 2, 4, 58.5e6, None)  # half a batch, not timed yet
        36000000

    Raises:
        ValueError: ``size`` outside 1..``top``, or a time that is not > 0.
    """
    if not 1 <= size <= top:
        raise ValueError(f"size={size} must be in 1..top={top}")
    for name, value in (("top_ns", top_ns), ("size_ns", size_ns)):
        if value is not None and not value > 0:
            raise ValueError(f"{name}={value} must be > 0")
    if size == top:
        return budget_ns
    ratio = size / top if top_ns is None or size_ns is None else min(size_ns / top_ns, 1.0)
    return round(budget_ns * ratio)


class OverrunPolicy(StrEnum):
    """What to do when a task's steps keep running past the bubble's real end."""

    WARN = "WARN"  # report only
    SHRINK_BUDGET = "SHRINK_BUDGET"  # use less of each bubble: raise the step guard
    PAUSE = "PAUSE"  # keep the task PAUSED until someone resumes it
    KILL = "KILL"  # stop the task


class OverrunActionKind(StrEnum):
    """The action ``apply_overrun_policy`` asks the caller to carry out."""

    NONE = "NONE"
    WARN = "WARN"
    SET_BUDGET = "SET_BUDGET"
    PAUSE = "PAUSE"
    STOP = "STOP"


def overrun_mask(overrun: Iterable[float | int | None]) -> np.ndarray:
    """Which steps overran: the one definition every count uses (see [Note: overruns]).

    A step overran when it ended after its bubble was seen to end: its recorded overrun
    (``overrun_ns`` on the bus, ``overrun_ms`` in tables; the unit does not matter) is > 0.
    A missing or NaN overrun is a step that did not overrun.
    """
    a = np.asarray(overrun if isinstance(overrun, np.ndarray) else list(overrun), dtype=float)
    mask: np.ndarray = np.nan_to_num(a, nan=0.0) > 0
    return mask


def overran(overrun: float | int | None) -> bool:
    """One step's verdict under ``overrun_mask``, in plain Python: a task host asks it after
    every step, between two launches, where numpy's array round trip cost several µs."""
    return overrun is not None and not math.isnan(overrun) and overrun > 0


@dataclass(frozen=True, kw_only=True)
class OverrunStats:
    """A task's overrun record over some window of steps.

    Args:
        steps: steps run in the window.
        overruns: steps that ended after training resumed (overrun > 0).
        overrun_ns_total: summed overrun of those steps.
        budget_ns: the step guard in force.
    """

    steps: int
    overruns: int
    overrun_ns_total: int
    budget_ns: int

    def __post_init__(self) -> None:
        if self.steps < 0 or self.overruns < 0 or self.overrun_ns_total < 0:
            raise ValueError(
                f"steps={self.steps}, overruns={self.overruns}, "
                f"overrun_ns_total={self.overrun_ns_total} must all be >= 0"
            )
        if self.overruns > self.steps:
            raise ValueError(f"overruns={self.overruns} > steps={self.steps}")
        if self.budget_ns < 0:
            raise ValueError(f"budget_ns={self.budget_ns} must be >= 0")

    @classmethod
    def of(cls, overrun_ns: Iterable[float | int | None], *, budget_ns: int = 0) -> OverrunStats:
        """The record of steps with these overruns (ns), counted by ``overrun_mask``."""
        values = list(overrun_ns)
        mask = overrun_mask(values)
        total = sum(float(v or 0) for v, m in zip(values, mask, strict=True) if m)
        return cls(
            steps=len(values),
            overruns=int(mask.sum()),
            overrun_ns_total=round(total),
            budget_ns=budget_ns,
        )

    @property
    def overrun_frac(self) -> float:
        """Share of steps that overran (0 with no steps)."""
        return self.overruns / self.steps if self.steps else 0.0

    def describe(self) -> str:
        """ "2 of 33 steps overran (4.10 ms in all)": the sentence logs and tables share."""
        return (
            f"{self.overruns} of {self.steps} steps overran "
            f"({self.overrun_ns_total / 1e6:.2f} ms in all)"
        )


@dataclass(frozen=True, slots=True)
class OverrunAction:
    """What to do; ``budget_ns`` is the new step guard for SET_BUDGET, else None."""

    kind: OverrunActionKind
    reason: str
    budget_ns: int | None = None


def apply_overrun_policy(
    policy: OverrunPolicy,
    stats: OverrunStats,
    *,
    max_overrun_frac: float = 0.05,
    min_steps: int = 20,
    budget_growth: float = 1.25,
    max_budget_ns: int | None = None,
) -> OverrunAction:
    """The action ``policy`` calls for, given ``stats``.

    Nothing happens until ``min_steps`` steps were seen and more than ``max_overrun_frac`` of
    them overran. Then WARN → WARN; PAUSE → PAUSE; KILL → STOP; SHRINK_BUDGET → SET_BUDGET with
    the guard grown by ``budget_growth`` and at least by the mean overrun, so the task starts
    fewer steps near a bubble's end (a larger guard shrinks the usable part of each bubble).
    When the guard would pass ``max_budget_ns`` the policy falls back to PAUSE.
    """
    policy = OverrunPolicy(policy)
    if not 0 <= max_overrun_frac <= 1:
        raise ValueError(f"max_overrun_frac={max_overrun_frac} must be in [0, 1]")
    if budget_growth <= 1:
        raise ValueError(f"budget_growth={budget_growth} must be > 1 (it grows the step guard)")
    if stats.steps < min_steps or stats.overrun_frac <= max_overrun_frac:
        return OverrunAction(
            OverrunActionKind.NONE,
            f"{stats.overruns}/{stats.steps} steps overran; limit {max_overrun_frac:.1%} "
            f"after {min_steps} steps",
        )
    mean_overrun_ns = stats.overrun_ns_total // max(stats.overruns, 1)
    why = (
        f"{stats.overruns}/{stats.steps} steps overran ({stats.overrun_frac:.1%} > "
        f"{max_overrun_frac:.1%}), mean {mean_overrun_ns / 1e6:.2f} ms"
    )
    if policy is OverrunPolicy.WARN:
        return OverrunAction(OverrunActionKind.WARN, why)
    if policy is OverrunPolicy.PAUSE:
        return OverrunAction(OverrunActionKind.PAUSE, why)
    if policy is OverrunPolicy.KILL:
        return OverrunAction(OverrunActionKind.STOP, why)
    new_budget_ns = max(
        math.ceil(stats.budget_ns * budget_growth), stats.budget_ns + mean_overrun_ns
    )
    if max_budget_ns is not None and new_budget_ns > max_budget_ns:
        return OverrunAction(
            OverrunActionKind.PAUSE,
            f"{why}; guard {new_budget_ns} ns would pass max_budget_ns={max_budget_ns}",
        )
    return OverrunAction(
        OverrunActionKind.SET_BUDGET,
        f"{why}; guard {stats.budget_ns} -> {new_budget_ns} ns",
        budget_ns=new_budget_ns,
    )
