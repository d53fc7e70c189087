"""The overhead governor at work: a daemon thread that feeds ``core.governor`` and applies it.

    session.enable_governor(target_frac=0.01)   # starts the thread in this process
    session.governor_log                        # one row per decision (also after a restart)
    session.disable_governor()

Each tick the loop folds in the run's events that arrived since the last one (never the whole
run again: a tick costs what arrived, not what the run has done), keeping per training step
its window across ranks and the side tasks that stepped in it until the step is observed.
It observes the steps that every rank has finished (one step behind the newest, so the
side-task steps of a step have arrived), turns each into a
``StepObservation`` (the step's window across ranks; the side tasks that stepped in its
bubbles; on CUDA, from ``gpu.nvml``, the power and power cap of the GPU nearest its cap and
the lowest SM clock) and applies the
governor's decisions through ``SideTaskManager.tune``: an SM share (only where an MPS daemon
serves the run; elsewhere the governor is pinned at 100% and works on budgets alone) and a
step budget = the task's base budget (set by the user, else the profile's p95 x 1.1 + 0.5 ms:
``SideTaskManager.base_budget_s``) x the decision's scale, a task put on its base at once when
the governor takes it on (it had FreeRide's guard, the median rounded up to 10 ms x 1.2);
and, for a task attached with gating "trickle", its trickle duty (``core.governor``).

Every decision is logged (``logging``) and appended to ``<run_dir>/governor.jsonl``, which
``governor_log_frame`` reads; columns in ``GOVERNOR_LOG_COLUMNS``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from freeride_lab.core.governor import GovernorDecision, OverheadGovernor, StepObservation
from freeride_lab.core.sidetask_state import SideTaskState, is_terminal
from freeride_lab.io.background import BackgroundThread
from freeride_lab.io.rundir import open_append
from freeride_lab.lab.manager import SideTaskManager

log = logging.getLogger(__name__)

__all__ = [
    "GOVERNOR_LOG_COLUMNS",
    "GovernorLoop",
    "governor_log_frame",
    "nearest_cap",
    "step_times_s",
]

#: Columns of ``governor_log_frame``, in order: t_ns (run clock of this host), step (training
#: step the decision followed), task_id, sm_pct, budget_scale, budget_ms (the budget applied;
#: NaN if the task had none yet), overhead_frac (the governor's overhead estimate before the
#: decision), applied (a tune was sent and accepted), reason, error (why it was not applied).
GOVERNOR_LOG_COLUMNS: tuple[str, ...] = (
    "t_ns",
    "step",
    "task_id",
    "sm_pct",
    "budget_scale",
    "budget_ms",
    "overhead_frac",
    "applied",
    "reason",
    "error",
    "trickle_duty",
)
_SCHEMA = {
    "t_ns": "int64",
    "step": "int64",
    "task_id": "str",
    "sm_pct": "float64",
    "budget_scale": "float64",
    "budget_ms": "float64",
    "overhead_frac": "float64",
    "applied": "bool",
    "reason": "str",
    "error": "str",
    "trickle_duty": "float64",
}


class GovernorLoop:
    """Runs an ``OverheadGovernor`` over a live run (see the module docstring).

    Args:
        steps, side_task_steps: the run's tables, now.
        live: False once the run has ended (the loop then stops).
        ranks: ranks whose step events make a step complete.
        sm_applies: SM shares can be changed (an MPS daemon serves the run).
        gpu_ordinals: CUDA ordinals of this node's GPUs for NVML power/clock; () = none.
        baseline_step_s: training's step time without side tasks, if known (as
            ``step_times_s`` measures it); None lets the governor learn it from steps without
            side-task work.
        task_ids: govern only these tasks (while live); None: every live task.
        base_budget_s: the budget a decision's scale multiplies, per task; None: the task's
            own (``SideTaskManager.base_budget_s``: set by the user, else profiled).
        trickle: govern trickle tasks' duty (False holds them in bubbles: duty 0).

    Drive it from a thread (``start``) or by calling ``tick`` from a loop of your own (the
    benchmark's governed blocks do, after ``skip_to`` their first step).
    """

    def __init__(
        self,
        manager: SideTaskManager,
        *,
        events: Callable[[int], Sequence[Mapping[str, Any]]],
        live: Callable[[], bool],
        governor: OverheadGovernor,
        ranks: int,
        log_path: Path,
        sm_applies: bool = False,
        gpu_ordinals: tuple[int, ...] = (),
        baseline_step_s: float | None = None,
        interval_s: float = 0.5,
        task_ids: Collection[str] | None = None,
        base_budget_s: Callable[[str], float | None] | None = None,
        trickle: bool = True,
    ) -> None:
        self.manager = manager
        self.trickle = trickle
        self.governor = governor
        self.ranks = ranks
        self.log_path = log_path
        self.sm_applies = sm_applies
        self.gpu_ordinals = gpu_ordinals
        self.baseline_step_s = baseline_step_s
        self.interval_s = interval_s
        self.task_ids = None if task_ids is None else frozenset(task_ids)
        self._base_budget_s = manager.base_budget_s if base_budget_s is None else base_budget_s
        self._events = events
        self._live = live
        self._governed: set[str] = set()
        self._started: set[str] = set()  # governed tasks put on their base budget
        self._last_step = -1
        self._cursor = 0  # events folded so far
        self._windows: dict[int, _StepWindow] = {}  # per step not yet observed
        self._active: dict[int, set[str]] = {}  # per step not yet observed: the tasks in it
        self._thread = BackgroundThread(self._run, name="freeride-governor")
        self.errors = 0

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return (
            f"<GovernorLoop(target={self.governor.target_frac:.2%}, {state}, "
            f"tasks={len(self._governed)}, last_step={self._last_step})>"
        )

    @property
    def running(self) -> bool:
        return self._thread.running

    def start(self) -> GovernorLoop:
        """Start the daemon thread (returns at once)."""
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread; idempotent."""
        self._thread.stop(timeout_s)

    def skip_to(self, step: int) -> None:
        """Observe no step before ``step`` (steps run under other conditions)."""
        self._last_step = max(self._last_step, step - 1)
        self._forget_observed()

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval_s):
            if not self._live():
                log.info("governor: the run ended; stopping")
                return
            try:
                self.tick()
            except Exception:  # one bad tick must not end the control loop
                self.errors += 1
                log.exception("governor tick failed")

    def tick(self) -> list[dict[str, Any]]:
        """One pass: observe the newly complete steps and apply decisions; the log records."""
        self._fold()
        complete = sorted(s for s, w in self._windows.items() if len(w.ranks) >= self.ranks)
        ready = complete[:-1]  # one step behind the newest; every step here is unobserved
        if not ready:
            return []
        self._sync_tasks()
        records = self._start_budgets()
        power_w, cap_w, clock_mhz = self._gpu_reading()
        for step in ready:
            self._last_step = step
            window = self._windows[step]
            step_s = (window.end_ns - window.start_ns) / 1e9
            if not step_s > 0:
                continue
            active = tuple(sorted(self._active.get(step, set()) & self._governed))
            obs = StepObservation(
                step_s=step_s,
                baseline_step_s=self.baseline_step_s,
                active_task_ids=active,
                power_w=power_w,
                power_cap_w=cap_w,
                sm_clock_mhz=clock_mhz,
            )
            overhead = self.governor.overhead_frac
            for decision in self.governor.observe(obs):
                records.append(self._apply(step, decision, overhead))
        self._forget_observed()
        return records

    def _fold(self) -> None:
        """Take in the events that arrived since the last fold: each rank's step window and
        the side-task steps, for the steps not yet observed. A malformed event is left out."""
        new = self._events(self._cursor)
        self._cursor += len(new)
        for e in new:
            kind = e.get("kind")
            if kind not in ("step", "side_task_step"):
                continue
            try:
                step = int(e["step"])
                if step <= self._last_step:
                    continue
                if kind == "side_task_step":
                    self._active.setdefault(step, set()).add(str(e["task_id"]))
                    continue
                rank, start_ns, end_ns = int(e["rank"]), int(e["start_ns"]), int(e["end_ns"])
            except (KeyError, TypeError, ValueError):
                continue
            window = self._windows.setdefault(step, _StepWindow(start_ns, end_ns))
            window.start_ns, window.end_ns = (
                min(window.start_ns, start_ns),
                max(window.end_ns, end_ns),
            )
            window.ranks.add(rank)

    def _forget_observed(self) -> None:
        """Drop what is kept of the steps observed (or skipped) already."""
        last = self._last_step
        for kept in (self._windows, self._active):
            for step in [s for s in kept if s <= last]:
                del kept[step]

    def _sync_tasks(self) -> None:
        """Govern exactly the live tasks."""
        live: dict[str, dict[str, Any]] = {}
        for task in self.manager.tasks():
            if task["detached"] or is_terminal(SideTaskState(task["state"])):
                continue
            if self.task_ids is None or task["id"] in self.task_ids:
                live[task["id"]] = task
        for task_id in sorted(self._governed - set(live)):
            self.governor.remove_task(task_id)
            self._governed.discard(task_id)
            self._started.discard(task_id)
        g = self.governor
        for task_id, task in live.items():
            if task_id in self._governed:
                continue
            sm = task["sm_pct"] if self.sm_applies and task["sm_pct"] is not None else g.sm_max_pct
            duty = None  # bubbles only, to the governor
            if task.get("gating") == "trickle" and self.trickle:
                duty = min(float(task.get("trickle_duty") or 0.0), g.trickle_max)
            elif task.get("trickle_duty"):  # held in bubbles by this loop
                self.manager.tune(task_id, by="governor", trickle_duty=0.0)
            g.add_task(
                task_id, sm_pct=int(min(max(sm, g.sm_min_pct), g.sm_max_pct)), trickle_duty=duty
            )
            self._governed.add(task_id)

    def _start_budgets(self) -> list[dict[str, Any]]:
        """Put each governed task whose base budget is known (profiled, or set by the user) on
        it once: a governed task starts from the base the governor scales, not from the
        budget it had before (``SideTaskManager.base_budget_s``). The log records each one
        applied."""
        records = []
        for task_id in sorted(self._governed - self._started):
            base_s = self._base_budget_s(task_id)
            if base_s is None:
                continue  # still profiling: the next tick looks again
            self._started.add(task_id)
            sm_pct, scale = self.governor.limits(task_id)
            if _same_ms(self.manager.task(task_id)["budget_ms"], _scaled_ms(base_s, scale)):
                continue
            start = GovernorDecision(
                task_id, sm_pct, scale, "governed: starts from its base budget",
                self.governor.trickle_duty(task_id),
            )  # fmt: skip
            records.append(self._apply(self._last_step, start, None))
        return records

    def _gpu_reading(self) -> tuple[float | None, float | None, float | None]:
        """Board power and power cap (W) of the run's GPU nearest its cap, and the lowest SM
        clock (MHz) among them, where NVML has them (``nearest_cap``)."""
        if not self.gpu_ordinals:
            return None, None, None
        from freeride_lab.gpu import nvml

        samples = [s for s in nvml.read_samples() if s.cuda_ordinal in self.gpu_ordinals]
        power_w, cap_w = nearest_cap([(s.power_w, nvml.power_limit_w(s.index)) for s in samples])
        clock = [s.sm_clock_mhz for s in samples if math.isfinite(s.sm_clock_mhz)]
        return power_w, cap_w, (min(clock) if clock else None)

    def _apply(
        self, step: int, decision: GovernorDecision, overhead: float | None
    ) -> dict[str, Any]:
        changes: dict[str, Any] = {}
        error = ""
        budget_ms = math.nan
        try:
            task = self.manager.task(decision.task_id)
            if self.sm_applies and task["sm_pct"] != decision.sm_pct:
                changes["sm_pct"] = decision.sm_pct
            base_s = self._base_budget_s(decision.task_id)
            if base_s is None:
                error = "no budget yet (still profiling): budget scale not applied"
            else:
                budget_ms = _scaled_ms(base_s, decision.budget_scale)
                if not _same_ms(task["budget_ms"], budget_ms):
                    changes["budget_ms"] = budget_ms
            duty = decision.trickle_duty
            if self.trickle and duty is not None and duty != task.get("trickle_duty"):
                changes["trickle_duty"] = duty
            if changes:
                self.manager.tune(decision.task_id, by="governor", **changes)
        except (ValueError, RuntimeError, OSError, TimeoutError) as exc:
            error = str(exc)
            changes = {}
        record = {
            "t_ns": time.time_ns(),
            "step": step,
            "task_id": decision.task_id,
            "sm_pct": float(decision.sm_pct),
            "budget_scale": float(decision.budget_scale),
            "budget_ms": budget_ms,
            "overhead_frac": math.nan if overhead is None else float(overhead),
            "applied": bool(changes),
            "reason": decision.reason,
            "error": error,
            "trickle_duty": math.nan if decision.trickle_duty is None else decision.trickle_duty,
        }
        log.info(
            "governor after step %d: %s -> sm %d%%, budget x%g (%s)%s",
            step,
            decision.task_id,
            decision.sm_pct,
            decision.budget_scale,
            decision.reason,
            f"; not applied: {error}" if error else "",
        )
        self._write(record)
        return record

    def _write(self, record: dict[str, Any]) -> None:
        line = json.dumps({k: (None if _nan(v) else v) for k, v in record.items()})
        try:
            with os.fdopen(open_append(self.log_path), "a") as f:
                f.write(line + "\n")
        except OSError as exc:
            log.warning("governor: could not append to %s: %s", self.log_path, exc)


@dataclass(slots=True)
class _StepWindow:
    """A training step across the ranks that have ended it so far: its earliest start and
    latest end (ns), and those ranks; ``step_times_s`` over a table once every rank has."""

    start_ns: int
    end_ns: int
    ranks: set[int] = field(default_factory=set)


def nearest_cap(
    readings: Collection[tuple[float, float | None]],
) -> tuple[float | None, float | None]:
    """Of (board power, power cap) per GPU, the one nearest its cap (the highest power/cap):
    one board at its cap slows its stage, and so the whole pipeline. Boards without a cap are
    read by power alone, and only where no board has one; unreadable powers are skipped.

        >>> nearest_cap([(400.0, 700.0), (300.0, 350.0), (float("nan"), 700.0)])
        (300.0, 350.0)
        >>> nearest_cap([(400.0, None), (500.0, None)])
        (500.0, None)
    """
    finite = [(p, c) for p, c in readings if math.isfinite(p)]
    capped = [(p, c) for p, c in finite if c is not None and c > 0]
    if capped:
        return max(capped, key=lambda pc: pc[0] / pc[1])
    return (max(p for p, _ in finite), None) if finite else (None, None)


def step_times_s(steps: pd.DataFrame) -> dict[int, float]:
    """Each step's time in s as the governor sees it: its window across ranks (the earliest
    start to the latest end in the steps table). The loop keeps the same window from the
    events as they arrive (``_StepWindow``); this is it over a whole table, for readers of a
    run's tables (the bench's baselines)."""
    if steps.empty:
        return {}
    windows = steps.groupby("step").agg(start=("start_ms", "min"), end=("end_ms", "max"))
    durations = (windows["end"] - windows["start"]) / 1e3
    return {int(k): float(v) for k, v in durations.items()}


def _scaled_ms(base_s: float, scale: float) -> float:
    """The budget a decision applies: the base x its scale, in ms to the microsecond."""
    return round(base_s * 1e3 * scale, 3)


def _same_ms(had_ms: float | None, budget_ms: float) -> bool:
    """Whether a task's budget already is ``budget_ms`` (None: it has none yet)."""
    return had_ms is not None and math.isclose(had_ms, budget_ms)


def _nan(value: object) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def governor_log_frame(path: Path) -> pd.DataFrame:
    """The decisions in ``path`` (governor.jsonl), in order; columns ``GOVERNOR_LOG_COLUMNS``."""
    rows: list[dict[str, Any]] = []
    try:
        text = path.read_text()
    except FileNotFoundError:
        text = ""
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue  # a line being written
    if not rows:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in _SCHEMA.items()})
    frame = pd.DataFrame.from_records(rows, columns=list(GOVERNOR_LOG_COLUMNS))
    frame["error"] = frame["error"].fillna("")
    for column in ("sm_pct", "budget_scale", "budget_ms", "overhead_frac", "trickle_duty"):
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    return frame.astype(_SCHEMA).reset_index(drop=True)
