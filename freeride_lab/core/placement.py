"""Placement of side tasks on stages, and the per-worker choice of what runs in a bubble.

**Placement** (paper notes §8, FreeRide's ``get_task_runner_index_for_task``), as data in,
data out:

1. *memory*: a stage is eligible only if its free memory is **strictly greater** than the
   task's request;
2. *bubble fit*: a stage none of whose predicted bubbles is longer than the task's step
   budget is refused too — the task could never take a step there (same strict rule as
   ``budget.should_step``); FreeRide had a stub for this (a constant ``duration`` key). A
   task that steps in sizes (slices of a batch, ``host.iterative`` [Note: step sizes]) is
   judged by its smallest step, whose budget is the whole step's in proportion (the host's
   own first guess, ``budget.sized_budget_ns``);
3. *order*, by ``policy``:
   - ``"freeride"`` (FreeRide's): request 0 → most free memory first, then queue length;
     otherwise → queue length counting only queued tasks with priority >= the task's own (the
     running task included);
   - ``"harvest"``: the most bubble time the task's own steps would fill per training step
     (``usable_ms``: whole steps, each started only with more than the budget left, then
     its smallest steps in what is left), shared
     with the tasks queued there (÷ (1 + queue length)); FreeRide's order breaks ties and
     stands in where bubbles are not measured yet. A stage whose bubbles are long enough for
     one step but waste most of them on tails ranks below one they suit.
   Ties keep stage order (stable sort).

    >>> g = 2**30
    >>> stages = [StageInfo(stage=s, free_bytes=f * g) for s, f in enumerate((3, 9, 16, 24))]
    >>> place(TaskRequest(name="vgg19", memory_bytes=12 * g, budget_s=0.216), stages)
    Placement(stage=2)
    >>> fits = [StageInfo(stage=0, free_bytes=g, bubble_ms=(30.0, 30.0)),
    ...         StageInfo(stage=1, free_bytes=g, bubble_ms=(90.0,))]
    >>> task = TaskRequest(name="resnet18", memory_bytes=0, budget_s=0.020, step_s=0.017)
    >>> place(task, fits), place(task, fits, policy="harvest")
    (Placement(stage=0), Placement(stage=1))

**Per worker** (§8 "Per worker"/"Priority"): which of a stage's tasks holds its bubbles, and
when one preempts another, is ``core.task_queue``. At most one side task runs per GPU.

# [Note: units of free memory]
The paper's free memory ("3 / 9 / 16 / 24 GB") is capacity (47.38 GiB) minus peak reserved
memory, so it is GiB; its requests are ceil(peak GiB). Both are bytes here, so any unit
works as long as the caller converts both the same way.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from freeride_lab.core.sidetask_state import SideTaskState

__all__ = [
    "NoPlacement",
    "Placement",
    "PlacementPolicy",
    "QueuedTask",
    "RefusalRule",
    "StageInfo",
    "StageRefusal",
    "TaskRequest",
    "place",
    "place_all",
    "placement_policy",
    "usable_ms",
]

_GIB = 2**30


@dataclass(frozen=True, slots=True)
class QueuedTask:
    """A task assigned to a stage's worker (queued or current)."""

    task_id: str
    priority: int = 0  # higher = more important
    state: SideTaskState = SideTaskState.CREATED


@dataclass(frozen=True, kw_only=True)
class StageInfo:
    """What placement knows about one stage.

    Args:
        stage: stage index.
        free_bytes: device memory a side task may use there.
        bubble_ms: predicted bubble lengths of one training step; None = not profiled, the
            bubble-fit rule is skipped; () = no bubbles, nothing fits.
        queue: tasks already assigned there, current task included.
    """

    stage: int
    free_bytes: int
    bubble_ms: tuple[float, ...] | None = None
    queue: tuple[QueuedTask, ...] = ()

    def queue_length(self, priority: int) -> int:
        """Assigned tasks with priority >= ``priority`` (FreeRide's priority-filtered length)."""
        return sum(1 for t in self.queue if t.priority >= priority)


@dataclass(frozen=True, kw_only=True)
class TaskRequest:
    """A side task asking for a stage: memory request (bytes), step budget (s), priority."""

    name: str
    memory_bytes: int
    budget_s: float
    priority: int = 0
    task_id: str | None = None  # id to queue it under; None → "<name>#<submission index>"
    step_s: float | None = None  # its typical step time (profiled); None: the budget stands in
    # its smallest step's time, for a task that steps in sizes; None: every step is whole
    smallest_step_s: float | None = None

    def __post_init__(self) -> None:
        if self.memory_bytes < 0:
            raise ValueError(f"memory_bytes={self.memory_bytes} must be >= 0 (0 = no request)")
        if not math.isfinite(self.budget_s) or self.budget_s < 0:
            raise ValueError(f"budget_s={self.budget_s!r} must be a finite number >= 0")
        for name in ("step_s", "smallest_step_s"):
            step = getattr(self, name)
            if step is not None and not (math.isfinite(step) and step > 0):
                raise ValueError(f"{name}={step!r} must be a finite number > 0, or None")

    @property
    def smallest(self) -> tuple[float, float] | None:
        """(budget, step) in seconds of the task's smallest step, where it is smaller than its
        whole step: the budget in proportion to the step; None otherwise."""
        whole, small = self.step_s, self.smallest_step_s
        if whole is None or small is None or small >= whole:
            return None
        return self.budget_s * small / whole, small

    def fill_ms(self, bubbles_ms: Iterable[float]) -> float:
        """Bubble time per training step this task's steps would fill (``usable_ms``: whole
        steps, then its smallest in what is left); the budget stands in for an unknown step."""
        smallest = self.smallest
        return usable_ms(
            bubbles_ms,
            self.budget_s * 1e3,
            (self.step_s or self.budget_s) * 1e3,
            smallest_ms=(smallest[0] * 1e3, smallest[1] * 1e3) if smallest else None,
        )


class PlacementPolicy(StrEnum):
    """How eligible stages are ordered (see the module docstring)."""

    FREERIDE = "freeride"
    HARVEST = "harvest"


def placement_policy(value: object) -> PlacementPolicy:
    """``value`` as a ``PlacementPolicy``.

    Raises:
        ValueError: not one of the policies; the message lists them.
    """
    try:
        return PlacementPolicy(str(value) if isinstance(value, str) else "")
    except ValueError:
        valid = ", ".join(p.value for p in PlacementPolicy)
        raise ValueError(f"placement={value!r} is unknown; valid: {valid}") from None


def usable_ms(
    bubbles_ms: Iterable[float],
    budget_ms: float,
    step_ms: float,
    *,
    smallest_ms: tuple[float, float] | None = None,
) -> float:
    """Bubble time per training step that whole ``step_ms`` steps fill, a step starting only
    while more than ``budget_ms`` of its bubble is left (``budget.should_step``); then, with
    ``smallest_ms`` = (budget, step) of the task's smallest step, such steps in what is left.

    >>> usable_ms([30.0, 90.0, 5.0], budget_ms=20.0, step_ms=17.0)  # 1 + 5 + 0 steps
    102.0
    >>> usable_ms([30.0, 90.0, 5.0], 20.0, 17.0, smallest_ms=(5.0, 4.25))  # + 2 + 0 + 0
    110.5
    """
    total = 0.0
    for b in bubbles_ms:
        used = _filled(b, budget_ms, step_ms)
        if smallest_ms is not None:
            used += _filled(b - used, *smallest_ms)
        total += used
    return total


def _filled(bubble_ms: float, budget_ms: float, step_ms: float) -> float:
    """What steps of ``step_ms`` fill of a bubble, each started while more than ``budget_ms``
    of it is left."""
    if not bubble_ms > budget_ms:
        return 0.0
    starts = math.ceil((bubble_ms - budget_ms) / max(step_ms, 1e-9))  # at 0, step, ...
    return min(starts * step_ms, bubble_ms)


class RefusalRule(StrEnum):
    """Why a stage was not eligible."""

    MEMORY = "memory"
    BUBBLE_FIT = "bubble_fit"


@dataclass(frozen=True, slots=True)
class StageRefusal:
    """One stage that could not take the task, and why."""

    stage: int
    rule: RefusalRule
    detail: str


@dataclass(frozen=True, slots=True)
class Placement:
    """The stage the task goes to."""

    stage: int


@dataclass(frozen=True, slots=True)
class NoPlacement:
    """No stage can take the task; ``refusals`` says why, stage by stage."""

    reason: str
    refusals: tuple[StageRefusal, ...]


def _refusal(task: TaskRequest, info: StageInfo) -> StageRefusal | None:
    if not info.free_bytes > task.memory_bytes:
        return StageRefusal(
            info.stage,
            RefusalRule.MEMORY,
            f"free {info.free_bytes / _GIB:.2f} GiB is not > request "
            f"{task.memory_bytes / _GIB:.2f} GiB",
        )
    if info.bubble_ms is not None:
        smallest = task.smallest
        budget_ms = (smallest[0] if smallest else task.budget_s) * 1e3
        if not any(b > budget_ms for b in info.bubble_ms):
            longest = f"{max(info.bubble_ms):.1f} ms" if info.bubble_ms else "none"
            which = "its smallest step's budget" if smallest else "step budget"
            return StageRefusal(
                info.stage,
                RefusalRule.BUBBLE_FIT,
                f"longest predicted bubble {longest} is not > {which} {budget_ms:.1f} ms",
            )
    return None


def place(
    task: TaskRequest,
    stages: Sequence[StageInfo],
    *,
    policy: PlacementPolicy | str = PlacementPolicy.FREERIDE,
) -> Placement | NoPlacement:
    """The stage ``task`` should go to, or why none can take it.

    Raises:
        ValueError: an unknown ``policy``.
    """
    policy = placement_policy(policy)
    eligible: list[StageInfo] = []
    refusals: list[StageRefusal] = []
    for info in stages:
        refusal = _refusal(task, info)
        if refusal is None:
            eligible.append(info)
        else:
            refusals.append(refusal)
    if not eligible:
        per_stage = "; ".join(f"stage {r.stage}: {r.rule}: {r.detail}" for r in refusals)
        return NoPlacement(
            f"no stage can host {task.name!r}: {per_stage or 'no stages given'}; fix: lower "
            "its memory request or step budget, or free memory / lengthen bubbles "
            "(more micro-batches)",
            tuple(refusals),
        )
    if task.memory_bytes == 0:
        eligible.sort(key=lambda s: (-s.free_bytes, s.queue_length(task.priority)))
    else:
        eligible.sort(key=lambda s: s.queue_length(task.priority))
    if policy is PlacementPolicy.HARVEST and all(s.bubble_ms is not None for s in eligible):

        def share(s: StageInfo) -> float:
            return task.fill_ms(s.bubble_ms or ()) / (1 + s.queue_length(task.priority))

        eligible.sort(key=share, reverse=True)  # stable: FreeRide's order breaks ties
    return Placement(eligible[0].stage)


def place_all(
    tasks: Iterable[TaskRequest],
    stages: Sequence[StageInfo],
    *,
    policy: PlacementPolicy | str = PlacementPolicy.FREERIDE,
) -> tuple[list[Placement | NoPlacement], tuple[StageInfo, ...]]:
    """Place submissions in order, queueing each placed task; returns outcomes and new stages.

    This reproduces FreeRide's evaluation policy: submitting the same task once per eligible
    stage spreads the copies, because each placed copy lengthens that stage's queue. Under
    ``policy="harvest"`` a queued task halves what a stage offers the next one, so tasks
    spread unless one stage fills far more for them than the rest.

        >>> stages = [StageInfo(stage=0, free_bytes=1, bubble_ms=(30.0, 30.0, 30.0)),
        ...           StageInfo(stage=1, free_bytes=1, bubble_ms=(90.0,))]  # 51 vs 85 ms
        >>> tasks = [TaskRequest(name=n, memory_bytes=0, budget_s=0.02, step_s=0.017)
        ...          for n in ("a", "b")]
        >>> [o.stage for o in place_all(tasks, stages)[0]]
        [0, 1]
        >>> [o.stage for o in place_all(tasks, stages, policy="harvest")[0]]  # 85 / 2 < 51
        [1, 0]

    Raises:
        ValueError: an unknown ``policy``.
    """
    policy = placement_policy(policy)
    current = list(stages)
    by_stage = {info.stage: i for i, info in enumerate(current)}
    outcomes: list[Placement | NoPlacement] = []
    for index, task in enumerate(tasks):
        outcome = place(task, current, policy=policy)
        outcomes.append(outcome)
        if isinstance(outcome, Placement):
            i = by_stage[outcome.stage]
            queued = QueuedTask(task.task_id or f"{task.name}#{index}", task.priority)
            current[i] = replace(current[i], queue=(*current[i].queue, queued))
    return outcomes, tuple(current)
