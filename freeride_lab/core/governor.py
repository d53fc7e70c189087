"""An overhead governor: keep side tasks' cost to training under a target, AIMD-style.

FreeRide fixes each task's limits up front (MPS priority, a memory cap, a step budget) and
never looks at what they cost while training runs. ``OverheadGovernor`` closes that loop.
The caller feeds it one ``StepObservation`` per training step; it measures each step's
overhead, (step - baseline) / baseline, keeps the samples since its last change (the newest
``evidence_max`` of them) and answers with ``GovernorDecision`` values the caller applies (an
MPS SM share, a step-budget scale) and logs. Every ``window`` observations it decides on the
samples' mean **and its spread**: a change needs evidence at one-sided confidence ``evidence``
(Student's t over the samples), not an estimate that crossed a line.

- overhead above ``target_frac`` (the mean's lower bound is) → **multiplicative decrease** of
  every active task's SM share (by ``decrease_factor``, snapped down to ``sm_step_pct``); a
  task already at ``sm_min_pct`` gets its step budget scaled up instead (it then starts fewer
  steps near a bubble's end);
- overhead below ``low_water`` x target (the mean's upper bound is) → **additive increase**:
  first undo budget scaling, then raise the share by ``sm_step_pct``, up to ``sm_max_pct``;
- otherwise → hold, and keep gathering samples: the bounds narrow until one side is clear;
- after any change it ignores ``settle_steps`` observations and starts a fresh sample, then
  waits for ``window`` observations before it decides again.

Why evidence: a training step's time varies by a percent or two from step to step (the
emulated-peer bench's H100 steps of 460 ms spread 457-487 ms with no side task at all), and an
overhead target of 0.5% sits well inside that noise. Deciding on the mean alone
(``evidence=0.5``), the bench's governor grew one task's guard 2.4-fold on readings of
3.4%, 1.2%, 0.6% and 0.5% over three-step windows while the blocks around it measured that
stage's overhead at +0.08% [-2.32, +2.47] (H100, 2026-12-06): it paid harvest for noise.

A task that may also run between bubbles (gating "trickle": a paced trickle of steps through
training's compute, see ``sidetasks.host.trickle``) has a third limit, its **trickle duty**: the
share of the time between bubbles it may step, in [0, ``trickle_max``]. It is the first thing
cut when training slows (x ``decrease_factor``; below ``trickle_min`` it drops to 0, bubbles
only) and the last thing raised (+ ``trickle_step``, once budget and SM share are back at their
best), so the governor spends the overhead ceiling on work between bubbles only while work in
bubbles costs nothing.

Optional device signals add pressure: an SM clock more than ``clock_drop_frac`` below the
highest clock seen, or board power above ``power_cap_frac`` of the board's power cap (or above
``power_limit_w``, where given), counts as "too much" even when step time has not moved yet:
a board at its cap lowers its clocks, and the next training phase pays for it. The governor
is pure: no clock, no device access.

    >>> g = OverheadGovernor(target_frac=0.01, window=2, settle_steps=0)
    >>> g.add_task("t1")
    >>> slow = [1.04, 1.02, 1.03, 1.04]  # 3% over a 1 s baseline, give or take a percent
    >>> def step(s): return StepObservation(step_s=s, baseline_step_s=1.0, active_task_ids=("t1",))
    >>> [g.observe(step(s)) for s in slow[:2]]  # two samples: 3% +- 6.3%, no evidence yet
    [[], []]
    >>> [d.reason for s in slow[2:] for d in g.observe(step(s))]
    ['overhead 3.25% (>= 2.12% at 95%, 4 steps) > target 1.00%: SM share 100 -> 50%']
"""

from __future__ import annotations

import functools
import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from freeride_lab.core.intervals import t_quantile

__all__ = ["GovernorDecision", "OverheadGovernor", "StepObservation"]


@dataclass(frozen=True, kw_only=True)
class StepObservation:
    """One training step as the governor sees it.

    Args:
        step_s: the step's duration.
        baseline_step_s: the expected duration without side tasks (from vanilla steps); None
            lets the governor use its own estimate from steps without side-task activity.
        active_task_ids: side tasks that stepped during this training step; () means none did,
            so the step is a baseline sample; None means unknown: every governed task counts
            as active and the step is not a baseline sample.
        power_w: GPU board power, if known.
        power_cap_w: that board's power cap (the limit it throttles at), if known.
        sm_clock_mhz: SM clock, if known.
    """

    step_s: float
    baseline_step_s: float | None = None
    active_task_ids: tuple[str, ...] | None = None
    power_w: float | None = None
    power_cap_w: float | None = None
    sm_clock_mhz: float | None = None


@dataclass(frozen=True, slots=True)
class GovernorDecision:
    """New limits for one task: SM share (percent of SMs), step-budget scale (>= 1) and, for a
    trickle task, its trickle duty (None for a task that steps in bubbles only)."""

    task_id: str
    sm_pct: int
    budget_scale: float
    reason: str
    trickle_duty: float | None = None


@dataclass(slots=True)
class _TaskLimits:
    sm_pct: int
    budget_scale: float = 1.0
    trickle_duty: float | None = None  # None: bubbles only


@dataclass(kw_only=True)
class OverheadGovernor:
    """AIMD control of side tasks' SM share and step budget against a training overhead target.

    Args:
        target_frac: overhead to stay under, as a fraction of the baseline step time.
        low_water: increase only while the overhead (its upper bound) < ``low_water`` x
            ``target_frac``.
        sm_min_pct, sm_max_pct, sm_step_pct: the SM share range and its granularity (percent).
        decrease_factor: multiplicative cut of the share when over target (0-1).
        window: observations between decisions.
        settle_steps: observations ignored after a change.
        evidence: one-sided confidence a change needs (Student's t over the samples since the
            last change): 0.95 cuts only where the mean's 95% lower bound is over target and
            raises only where its upper bound is under the low water; 0.5 decides on the mean
            alone. A decision needs two samples unless ``evidence`` is 0.5.
        evidence_max: samples kept since the last change (the newest; older ones drop out, so
            a slow drift is followed).
        budget_growth, budget_scale_max: how the step-budget scale grows at the minimum share,
            and its ceiling.
        clock_drop_frac: SM clock drop (vs. the highest seen) that counts as overload.
        power_cap_frac: board power above this share of the observation's ``power_cap_w``
            counts as overload.
        power_limit_w: board power that counts as overload, in place of the cap's share; None
            = the cap's share (power is ignored where neither is known).
        device_signals: False ignores power and SM clock: step time alone decides (the
            benchmark's A/B of these signals).
        trickle_min, trickle_step, trickle_max: a trickle task's duty: cut below
            ``trickle_min`` means 0; raised by ``trickle_step`` at a time up to ``trickle_max``.
    """

    target_frac: float = 0.01
    low_water: float = 0.5
    sm_min_pct: int = 10
    sm_max_pct: int = 100
    sm_step_pct: int = 10
    decrease_factor: float = 0.5
    window: int = 8
    settle_steps: int = 3
    evidence: float = 0.95
    evidence_max: int = 64
    budget_growth: float = 1.25
    budget_scale_max: float = 4.0
    clock_drop_frac: float = 0.1
    power_cap_frac: float = 0.95
    power_limit_w: float | None = None
    device_signals: bool = True
    trickle_min: float = 0.02
    trickle_step: float = 0.05
    trickle_max: float = 1.0
    _tasks: dict[str, _TaskLimits] = field(default_factory=dict, init=False, repr=False)
    _overheads: deque[float] = field(default_factory=deque, init=False, repr=False)
    _samples: int = field(default=0, init=False, repr=False)
    _settle_left: int = field(default=0, init=False, repr=False)
    _baseline_s: float | None = field(default=None, init=False, repr=False)
    _max_clock_mhz: float = field(default=0.0, init=False, repr=False)
    _pressure: str = field(default="", init=False, repr=False)
    _active: set[str] = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.target_frac < 1:
            raise ValueError(f"target_frac={self.target_frac} must be in (0, 1); e.g. 0.01 = 1%")
        if not 0 <= self.low_water < 1:
            raise ValueError(f"low_water={self.low_water} must be in [0, 1)")
        if not 0 < self.sm_step_pct <= 100:
            raise ValueError(f"sm_step_pct={self.sm_step_pct} must be in (0, 100]")
        if not 0 < self.sm_min_pct <= self.sm_max_pct <= 100:
            raise ValueError(
                f"need 0 < sm_min_pct={self.sm_min_pct} <= sm_max_pct={self.sm_max_pct} <= 100"
            )
        if not 0 < self.decrease_factor < 1:
            raise ValueError(f"decrease_factor={self.decrease_factor} must be in (0, 1)")
        if self.window < 1 or self.settle_steps < 0:
            raise ValueError(
                f"window={self.window} must be >= 1 and settle_steps={self.settle_steps} >= 0"
            )
        if not 0.5 <= self.evidence < 1 or self.evidence_max < 2:
            raise ValueError(
                f"evidence={self.evidence} must be in [0.5, 1) (0.95: a change needs a 95% "
                f"one-sided bound; 0.5: the mean alone) and evidence_max={self.evidence_max} >= 2"
            )
        self._overheads = deque(maxlen=self.evidence_max)
        if not 0 < self.trickle_min <= self.trickle_max <= 1 or not 0 < self.trickle_step <= 1:
            raise ValueError(
                f"need 0 < trickle_min={self.trickle_min} <= trickle_max={self.trickle_max} <= 1 "
                f"and 0 < trickle_step={self.trickle_step} <= 1"
            )
        if not 0 < self.power_cap_frac <= 1:
            raise ValueError(
                f"power_cap_frac={self.power_cap_frac} must be in (0, 1]; e.g. 0.95 = 95% of "
                "the board's power cap"
            )
        if self.budget_growth <= 1 or self.budget_scale_max < 1:
            raise ValueError(
                f"budget_growth={self.budget_growth} must be > 1 and "
                f"budget_scale_max={self.budget_scale_max} >= 1"
            )

    # -- tasks -------------------------------------------------------------------------------
    def add_task(
        self,
        task_id: str,
        *,
        sm_pct: int | None = None,
        budget_scale: float = 1.0,
        trickle_duty: float | None = None,
    ) -> None:
        """Start governing ``task_id`` at ``sm_pct`` (default: the maximum) and ``budget_scale``;
        ``trickle_duty`` (in [0, ``trickle_max``]) makes it a trickle task starting at that duty."""
        pct = self.sm_max_pct if sm_pct is None else sm_pct
        if not self.sm_min_pct <= pct <= self.sm_max_pct:
            raise ValueError(
                f"sm_pct={pct} outside [{self.sm_min_pct}, {self.sm_max_pct}] for {task_id!r}"
            )
        if not 1.0 <= budget_scale <= self.budget_scale_max:
            raise ValueError(
                f"budget_scale={budget_scale} outside [1, {self.budget_scale_max}] for {task_id!r}"
            )
        if trickle_duty is not None and not 0 <= trickle_duty <= self.trickle_max:
            raise ValueError(
                f"trickle_duty={trickle_duty} outside [0, {self.trickle_max}] for {task_id!r}"
            )
        self._tasks[task_id] = _TaskLimits(pct, budget_scale, trickle_duty)

    def remove_task(self, task_id: str) -> None:
        """Stop governing ``task_id`` (a no-op if it is unknown)."""
        self._tasks.pop(task_id, None)
        self._active.discard(task_id)

    def limits(self, task_id: str) -> tuple[int, float]:
        """The current (sm_pct, budget_scale) of ``task_id``."""
        t = self._tasks[task_id]
        return t.sm_pct, t.budget_scale

    def trickle_duty(self, task_id: str) -> float | None:
        """The current trickle duty of ``task_id``; None if it steps in bubbles only."""
        return self._tasks[task_id].trickle_duty

    @property
    def overhead_frac(self) -> float | None:
        """The mean overhead of the samples since the last change; None before any."""
        return statistics.fmean(self._overheads) if self._overheads else None

    @property
    def baseline_step_s(self) -> float | None:
        """The governor's own baseline estimate (from steps without side-task activity)."""
        return self._baseline_s

    # -- control loop ------------------------------------------------------------------------
    def observe(self, obs: StepObservation) -> list[GovernorDecision]:
        """Take one step's observation; return the limits that changed (often none)."""
        if not math.isfinite(obs.step_s) or obs.step_s <= 0:
            raise ValueError(f"step_s={obs.step_s!r} must be a finite duration > 0")
        if obs.sm_clock_mhz is not None and obs.sm_clock_mhz > self._max_clock_mhz:
            self._max_clock_mhz = obs.sm_clock_mhz
        if obs.active_task_ids == ():
            self._update_baseline(obs.step_s)
        baseline = obs.baseline_step_s if obs.baseline_step_s is not None else self._baseline_s
        if self._settle_left > 0:
            self._settle_left -= 1
            return []
        if baseline is None or baseline <= 0:
            return []  # no baseline yet: cannot measure overhead
        active = self._tasks if obs.active_task_ids is None else obs.active_task_ids
        self._active.update(t for t in active if t in self._tasks)
        self._overheads.append((obs.step_s - baseline) / baseline)
        pressure = self._device_pressure(obs)
        if pressure:
            self._pressure = pressure
        self._samples += 1
        if self._samples < self.window:
            return []
        decisions = self._decide()
        self._samples = 0
        self._pressure = ""
        self._active.clear()
        if decisions:
            self._overheads.clear()
            self._settle_left = self.settle_steps
        return decisions

    def _update_baseline(self, step_s: float) -> None:
        alpha = 2.0 / (self.window + 1)
        if self._baseline_s is None:
            self._baseline_s = step_s
        else:
            self._baseline_s = alpha * step_s + (1 - alpha) * self._baseline_s

    def _device_pressure(self, obs: StepObservation) -> str:
        if not self.device_signals:
            return ""
        if (
            obs.sm_clock_mhz is not None
            and self._max_clock_mhz > 0
            and obs.sm_clock_mhz < (1 - self.clock_drop_frac) * self._max_clock_mhz
        ):
            return (
                f"SM clock {obs.sm_clock_mhz:.0f} MHz < {1 - self.clock_drop_frac:.0%} of "
                f"{self._max_clock_mhz:.0f} MHz"
            )
        limit, of = self.power_limit_w, ""
        if limit is None and obs.power_cap_w is not None and obs.power_cap_w > 0:
            limit = self.power_cap_frac * obs.power_cap_w
            of = f" ({self.power_cap_frac:.0%} of the {obs.power_cap_w:.0f} W cap)"
        if limit is not None and obs.power_w is not None and obs.power_w > limit:
            return f"power {obs.power_w:.0f} W > {limit:.0f} W{of}"
        return ""

    def _bounds(self) -> tuple[float, float, float]:
        """The samples' mean and its one-sided ``evidence`` bounds (lower, upper): the mean
        itself under ``evidence`` 0.5; unbounded with one sample (no spread to go by)."""
        n = len(self._overheads)
        mean = statistics.fmean(self._overheads)
        if self.evidence == 0.5:
            return mean, mean, mean
        if n < 2:
            return mean, -math.inf, math.inf
        half = _t(self.evidence, n - 1) * statistics.stdev(self._overheads) / math.sqrt(n)
        return mean, mean - half, mean + half

    def _decide(self) -> list[GovernorDecision]:
        mean, lo, hi = self._bounds()
        n = len(self._overheads)

        def status(sign: str, bound: float) -> str:
            if self.evidence == 0.5:
                return f"overhead {mean:.2%}"
            if not math.isfinite(bound):
                return f"overhead {mean:.2%} (one step)"
            return f"overhead {mean:.2%} ({sign} {bound:.2%} at {self.evidence:.0%}, {n} steps)"

        if lo > self.target_frac:
            why = f"{status('>=', lo)} > target {self.target_frac:.2%}"
            # only tasks that ran in the window can have caused it; none ran -> not ours
            return self._decrease(sorted(self._active), why)
        if self._pressure:
            return self._decrease(sorted(self._active), f"{self._pressure} ({status('>=', lo)})")
        if hi < self.low_water * self.target_frac:
            why = f"{status('<=', hi)} < {self.low_water:g} x target {self.target_frac:.2%}"
            return self._increase(sorted(self._tasks), why)
        return []

    def _decrease(self, task_ids: Sequence[str], why: str) -> list[GovernorDecision]:
        out: list[GovernorDecision] = []
        for tid in task_ids:
            t = self._tasks[tid]
            if t.trickle_duty:  # work between bubbles goes first
                duty = round(t.trickle_duty * self.decrease_factor, 6)
                out.append(self._set_duty(tid, duty if duty >= self.trickle_min else 0.0, why))
            elif t.sm_pct > self.sm_min_pct:
                cut = math.floor(t.sm_pct * self.decrease_factor / self.sm_step_pct)
                new = max(self.sm_min_pct, cut * self.sm_step_pct)
                out.append(
                    self._set(tid, new, t.budget_scale, f"{why}: SM share {t.sm_pct} -> {new}%")
                )
            elif t.budget_scale < self.budget_scale_max:
                scale = min(self.budget_scale_max, round(t.budget_scale * self.budget_growth, 6))
                out.append(
                    self._set(
                        tid,
                        t.sm_pct,
                        scale,
                        f"{why}: SM share at minimum; budget x{t.budget_scale:g} -> x{scale:g}",
                    )
                )
        return out

    def _increase(self, task_ids: Sequence[str], why: str) -> list[GovernorDecision]:
        out: list[GovernorDecision] = []
        for tid in task_ids:
            t = self._tasks[tid]
            if t.budget_scale > 1.0:
                scale = max(1.0, round(t.budget_scale / self.budget_growth, 6))
                out.append(
                    self._set(
                        tid, t.sm_pct, scale, f"{why}: budget x{t.budget_scale:g} -> x{scale:g}"
                    )
                )
            elif t.sm_pct < self.sm_max_pct:
                new = min(self.sm_max_pct, t.sm_pct + self.sm_step_pct)
                out.append(
                    self._set(tid, new, t.budget_scale, f"{why}: SM share {t.sm_pct} -> {new}%")
                )
            elif t.trickle_duty is not None and t.trickle_duty < self.trickle_max:
                duty = round(min(self.trickle_max, t.trickle_duty + self.trickle_step), 6)
                out.append(self._set_duty(tid, duty, why))
        return out

    def _set_duty(self, task_id: str, duty: float, why: str) -> GovernorDecision:
        """A new trickle duty for ``task_id``, its SM share and budget scale kept."""
        t = self._tasks[task_id]
        reason = f"{why}: trickle duty {t.trickle_duty:g} -> {duty:g}"
        return self._set(task_id, t.sm_pct, t.budget_scale, reason, duty)

    def _set(
        self,
        task_id: str,
        sm_pct: int,
        budget_scale: float,
        reason: str,
        trickle_duty: float | None = None,
    ) -> GovernorDecision:
        """Record new limits; a trickle task keeps its duty unless ``trickle_duty`` is given."""
        duty = self._tasks[task_id].trickle_duty if trickle_duty is None else trickle_duty
        self._tasks[task_id] = _TaskLimits(sm_pct, budget_scale, duty)
        return GovernorDecision(task_id, sm_pct, budget_scale, reason, duty)


@functools.lru_cache(maxsize=256)
def _t(confidence: float, df: int) -> float:
    """Student's t quantile, once per (confidence, df) a governor meets."""
    return t_quantile(confidence, df)
