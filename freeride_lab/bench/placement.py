"""What each placement policy would harvest, read off a run that measured every task on every
stage (lever 6: harvest-aware placement against FreeRide's rule).

    rows = placement_summary(summary, result["runs"], stages=4)   # PLACEMENT_COLUMNS
    fill = predicted_fill_ms(result["runs"], "m4-timeslice", "governed")  # {(task, stage): ms}

The harness computes on one real stage at a time, so a pipeline's harvest under a placement
of its side tasks is the mean over the stages of the (task, stage) harvests measured in that
task's segment on that stage. A run whose cases are two or more built-in tasks, each on the
same two or more stages (``--cases pagerank,resnet18,image,vgg19 --real-stage all``),
measured every cell, so every placement's harvest can be read off it with its interval.

Each policy places the tasks as the lab would (``core.placement.place_all``, submitted in
the run's case order) from what the lab's placer reads ([Note: placement inputs]): each
stage's bubbles predicted from its vanilla blocks, and each task's median solo step and the
step budget it runs with in that mode, from its solo phases (for a task that steps in
sizes, its smallest step too, in proportion to how many its profiled step was). A stage
holds the first task placed there (its worker runs one task at a time; a task queued behind
a side task that never ends harvests nothing). Beside the policies, the best and the worst
assignment of one task to a stage, chosen in hindsight on the same blocks: the best is an
optimistic bound, not a policy.

# [Note: placement inputs]
Free memory is not compared: the harness's ranks share one board, so no stage's free memory
is its own, and every stage counts as having room (the memory rule passes everywhere, as in
the lab before a step was measured). FreeRide's order is then its queue rule: the tasks go
to the stages in submission order. The budget is the one the task runs with in the mode
compared: the tight budget governed blocks start from (``tight_budget_ms``), FreeRide's
rounded one (``budget_ms``) otherwise; a task whose budget no stage's bubbles exceed is
placed nowhere (the bubble-fit rule) and harvests nothing. The harvest order compares the
bubble time the task's whole steps would fill per training step
(``core.placement.usable_ms``), shared with the stage's queue; ``fill_predicted_ms`` is
that prediction summed over the assignment, beside what was measured.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from freeride_lab.bench.stats import REFERENCE_MODE
from freeride_lab.bench.tables import (
    interval_columns,
    interval_of,
    pipeline_harvest,
    with_interval,
)
from freeride_lab.core.intervals import Interval, quotient_interval, sum_interval
from freeride_lab.core.placement import (
    Placement,
    PlacementPolicy,
    StageInfo,
    TaskRequest,
    place_all,
)

__all__ = ["HINDSIGHT", "PLACEMENT_COLUMNS", "placement_summary", "predicted_fill_ms"]

#: The assignments chosen in hindsight, on the measured harvests themselves.
HINDSIGHT: tuple[str, ...] = ("best in hindsight", "worst in hindsight")
_MOST_PERMUTATIONS = 40_320  # 8 tasks on 8 stages; beyond, the hindsight rows are left out

#: Columns of ``placement_summary``, in order.
PLACEMENT_COLUMNS: tuple[str, ...] = (
    "run",
    "mode",
    "policy",  # a core.placement policy, or one of HINDSIGHT
    "tasks",  # "stage:task, ..." of the assignment, in stage order
    "stages_covered",
    "fill_predicted_ms",  # bubble time per training step the tasks' steps should fill, summed
    *with_interval("harvest", "frac"),  # mean over the S stages, as the pipeline rows
    *with_interval("harvest_of_measured_idle", "frac"),
    # the assigned cells' slowdowns summed: every stage harvesting at once, as the pipeline rows
    *with_interval("overhead_all_stages_estimate", "frac"),
)


def placement_summary(
    summary: pd.DataFrame, runs: Sequence[Mapping[str, Any]], *, stages: int
) -> pd.DataFrame:
    """One row per (run, mode, policy) for each run that measured two or more tasks on the
    same two or more stages (see the module docstring); no rows for any other run.

    Args:
        summary: ``bench.tables.summarize_blocks`` output.
        runs: the result's runs (their segments hold ``stage_bubbles_ms``, ``budget_ms`` and
            ``solo_step_ms_median``).
        stages: S, which the harvest is a mean over.
    """
    rows: list[dict[str, object]] = []
    for name in dict.fromkeys(str(run.get("name", "")) for run in runs):
        segments = _task_segments(runs, name)
        tasks = list(dict.fromkeys(str(s["task"]) for s in segments))
        mine = summary[
            (summary["run"] == name)
            & (summary["mode"] != REFERENCE_MODE)
            & summary["case"].isin(tasks)
            & (summary["case"] == summary["task"])
        ]
        for mode, g in mine.groupby("mode", sort=False):
            cells = {(str(r["task"]), int(r["stage"])): r for _, r in g.iterrows()}
            covered = sorted(
                s for s in {st for _, st in cells} if all((t, s) in cells for t in tasks)
            )
            if len(tasks) < 2 or len(covered) < 2:
                continue
            requests = [_request(t, segments, str(mode)) for t in tasks]
            infos = [_stage(s, segments) for s in covered]
            fill = _fills(requests, infos)
            arms = {
                str(p): _placed(place_all(requests, infos, policy=p)[0], tasks)
                for p in PlacementPolicy
            }
            arms.update(_hindsight(tasks, covered, cells, stages))
            for policy, assignment in arms.items():
                picked = [cells[(t, s)] for s, t in sorted(assignment.items())]
                harvest, _ = pipeline_harvest(picked, stages=stages)
                overhead = sum_interval([interval_of(r, "overhead", "frac") for r in picked])
                if not picked:  # no task placed anywhere: nothing runs
                    harvest = Interval(0.0, 0.0, 0.0, 0.0, math.inf, 0)
                    overhead = Interval(0.0, 0.0, 0.0, 0.0, math.inf, 0)
                # the idle each covered stage leaves, from the assigned task's segment (or the
                # first task's, where none was placed)
                idle_rows = [cells[(assignment.get(s, tasks[0]), s)] for s in covered]
                _, idle = pipeline_harvest(idle_rows, stages=stages)
                rows.append(
                    {
                        "run": name,
                        "mode": str(mode),
                        "policy": policy,
                        "tasks": ", ".join(f"{s}:{t}" for s, t in sorted(assignment.items()))
                        or "none placed",
                        "stages_covered": len(covered),
                        "fill_predicted_ms": math.fsum(
                            fill.get((t, s), math.nan) for s, t in assignment.items()
                        ),
                        **interval_columns("harvest", "frac", harvest),
                        **interval_columns(
                            "harvest_of_measured_idle", "frac", quotient_interval(harvest, idle)
                        ),
                        **interval_columns("overhead_all_stages_estimate", "frac", overhead),
                    }
                )
    return pd.DataFrame(rows, columns=list(PLACEMENT_COLUMNS))


def predicted_fill_ms(
    runs: Sequence[Mapping[str, Any]], name: str, mode: str
) -> dict[tuple[str, int], float]:
    """Bubble time per training step each task's steps should fill on each stage (whole
    steps, then its slices in each bubble's tail), by the placer's prediction
    (``core.placement.usable_ms``) from the segments of run ``name``, keyed (task, stage); a
    stage whose bubbles were not recorded is left out."""
    segments = _task_segments(runs, name)
    tasks = list(dict.fromkeys(str(s["task"]) for s in segments))
    stages = sorted({int(s["stage"]) for s in segments})
    return _fills(
        [_request(t, segments, mode) for t in tasks], [_stage(s, segments) for s in stages]
    )


def _task_segments(runs: Sequence[Mapping[str, Any]], name: str) -> list[Mapping[str, Any]]:
    """Run ``name``'s segments of single-task cases (a built-in task on each of its stages),
    over all its records (a run continued by ``--resume`` has one a call)."""
    return [
        s
        for run in runs
        if run.get("name") == name
        for s in run.get("segments", [])
        if s.get("task") and s["case"] == s["task"]
    ]


def _fills(
    requests: Sequence[TaskRequest], infos: Sequence[StageInfo]
) -> dict[tuple[str, int], float]:
    """``TaskRequest.fill_ms`` of each (task, stage) whose bubbles and step are known (0 where
    the task's budget exceeds every bubble there)."""
    return {
        (req.name, info.stage): round(req.fill_ms(info.bubble_ms), 3)
        for req in requests
        for info in infos
        if info.bubble_ms is not None and req.step_s is not None
    }


def _request(task: str, segments: Sequence[Mapping[str, Any]], mode: str) -> TaskRequest:
    """``task``'s request in ``mode``: no memory, the median of its segments' budgets for the
    mode and of their solo step medians ([Note: placement inputs]; one board: a task's step
    is the same on every stage)."""
    mine = [s for s in segments if s["task"] == task]
    key = "tight_budget_ms" if mode == "governed" else "budget_ms"
    budget_ms = _median(s.get(key, s.get("budget_ms")) for s in mine)
    step_ms = _median(s.get("solo_step_ms_median") for s in mine)
    step_s = step_ms / 1e3 if math.isfinite(step_ms) and step_ms > 0 else None
    top = _median(s.get("top_step_size") for s in mine)  # NaN where no profile said
    return TaskRequest(
        name=task,
        memory_bytes=0,
        budget_s=budget_ms / 1e3 if math.isfinite(budget_ms) else 0.0,
        step_s=step_s,
        smallest_step_s=step_s / top if step_s is not None and top > 1 else None,
    )


def _stage(stage: int, segments: Sequence[Mapping[str, Any]]) -> StageInfo:
    """``stage`` as the placer sees it: its bubbles as first predicted (the first segment on
    it that recorded them: before any side task ran there), room for any task."""
    bubbles = next(
        (s["stage_bubbles_ms"] for s in segments
         if int(s["stage"]) == stage and s.get("stage_bubbles_ms")),
        None,
    )  # fmt: skip
    return StageInfo(
        stage=stage,
        free_bytes=1,  # every stage has room ([Note: placement inputs]); requests are 0
        bubble_ms=tuple(float(b) for b in bubbles) if bubbles else None,
    )


def _placed(outcomes: Sequence[object], tasks: Sequence[str]) -> dict[int, str]:
    """stage → the first of ``tasks`` placed there, from ``place_all``'s outcomes for them."""
    out: dict[int, str] = {}
    for task, outcome in zip(tasks, outcomes, strict=True):
        if isinstance(outcome, Placement):
            out.setdefault(outcome.stage, task)
    return out


def _hindsight(
    tasks: Sequence[str],
    covered: Sequence[int],
    cells: Mapping[tuple[str, int], Any],
    stages: int,
) -> dict[str, dict[int, str]]:
    """The best and worst one-task-a-stage assignments by measured harvest (HINDSIGHT)."""
    k = min(len(tasks), len(covered))
    if math.perm(max(len(tasks), len(covered)), k) > _MOST_PERMUTATIONS:
        return {}
    options: list[dict[int, str]] = []
    if len(tasks) >= len(covered):
        options = [dict(zip(covered, p, strict=True)) for p in itertools.permutations(tasks, k)]
    else:
        options = [dict(zip(p, tasks, strict=True)) for p in itertools.permutations(covered, k)]

    def harvest(a: dict[int, str]) -> float:
        value = pipeline_harvest([cells[(t, s)] for s, t in a.items()], stages=stages)[0].value
        return value if math.isfinite(value) else -math.inf

    # the first of equals, in the order of the permutations (the submission order first)
    return {HINDSIGHT[0]: max(options, key=harvest), HINDSIGHT[1]: min(options, key=harvest)}


def _median(values: Any) -> float:
    finite = [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]
    return statistics.median(finite) if finite else math.nan
