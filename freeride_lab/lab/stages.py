"""The stages of a run as side tasks see them: which rank holds which stage, what each has
free, and where a task goes (``core.placement``'s rules over this run's tables).

``lab.manager.SideTaskManager`` places its requests with a ``StagePlacer``; ``stage_info`` is
the task board's view of the same facts (``Session.stage_info()``).

    placer = StagePlacer(config, book, memory=lambda: s.memory, bubbles=s._recent_bubbles)
    rank, how = placer.choose_rank(record, limits, stage=None)   # placed, and why there
    stage_info(manager, s.memory, s.bubbles)                     # the task board's stages

See ``lab.manager`` [Note: stages and ranks] and [Note: placement inputs].
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from freeride_lab.core.config import RunConfig
from freeride_lab.core.placement import (
    NoPlacement,
    PlacementPolicy,
    QueuedTask,
    StageInfo,
    TaskRequest,
    place,
)
from freeride_lab.core.schedule import Schedule, stage_indices
from freeride_lab.core.sidetask_state import SideTaskState, is_terminal
from freeride_lab.lab.taskbook import TaskBook, TaskRecord
from freeride_lab.sidetasks.limits import GpuLimits
from freeride_lab.sidetasks.spec import profiled_top_size

if TYPE_CHECKING:  # the tables are the session's; placing a task reads them, listing does not
    import pandas as pd

__all__ = [
    "StagePlacer",
    "free_bytes_by_rank",
    "predicted_bubbles_by_rank",
    "stage_info",
]

_UNKNOWN_FREE_BYTES = 2**62  # stands in for "not measured yet": the memory rule passes


class TaskedRanks(Protocol):
    """What ``stage_info`` reads of a run's side tasks (``lab.manager.SideTaskManager``)."""

    ranks: list[int]

    def stages_of(self, rank: int) -> list[int]: ...
    def tasks(self) -> list[dict[str, Any]]: ...


class StagePlacer:
    """Ranks and stages of this node, and the placement of side tasks on them.

    Args:
        book: the run's task records (queues per rank; profiled budgets).
        memory, bubbles: the run's ``memory`` and (recent) ``bubbles`` tables, now.
    """

    def __init__(
        self,
        config: RunConfig,
        book: TaskBook,
        *,
        memory: Callable[[], pd.DataFrame],
        bubbles: Callable[[], pd.DataFrame],
    ) -> None:
        self.config = config
        self.book = book
        self._memory = memory
        self._bubbles = bubbles
        spec = Schedule.from_name(config.schedule)
        nproc = config.stages // config.nnodes
        self.ranks = list(range(config.node_rank * nproc, (config.node_rank + 1) * nproc))
        self._stages_of = {
            r: stage_indices(spec, r, config.stages, config.chunks or 1) for r in self.ranks
        }
        self._rank_of = {s: r for r, ss in self._stages_of.items() for s in ss}

    def rank_for(self, stage: object) -> int:
        if isinstance(stage, bool) or not isinstance(stage, int) or stage not in self._rank_of:
            valid = sorted(self._rank_of)
            span = f"{valid[0]}..{valid[-1]}" if valid else "none"
            raise ValueError(
                f"stage={stage!r} is out of range: this run's stages here are {span} "
                f"({len(self.ranks)} rank(s) on node {self.config.node_rank})"
            )
        return self._rank_of[stage]

    def lowest(self, rank: int) -> int:
        return min(self._stages_of[rank])

    def stages_of(self, rank: int) -> list[int]:
        """The stage indices ``rank`` holds, ascending."""
        return sorted(self._stages_of[rank])

    def choose_rank(
        self,
        record: TaskRecord,
        limits: GpuLimits,
        stage: int | None,
        *,
        moving: bool = False,
        policy: PlacementPolicy = PlacementPolicy.FREERIDE,
    ) -> tuple[int, str]:
        """The rank for ``record`` under ``limits``, and how it was chosen (placement rules,
        ``policy`` ordering the stages when ``stage`` is None)."""
        leftovers = record.gating == "leftovers"
        infos, notes = self.stage_infos(exclude=record.id, leftovers=leftovers)
        if leftovers:  # beside a stage's main task, in the queue of the tasks beside them
            mains = self._ranks_with_main(exclude=record.id)
            if stage is None:
                infos = {r: info for r, info in infos.items() if r in mains}
                if not infos:
                    raise ValueError(
                        "gating='leftovers' takes the bubble time a stage's main side task "
                        "leaves, and no stage has one: attach a main task first, or name the "
                        "stage one will go to (stage=...)"
                    )
            elif self.rank_for(stage) not in mains:
                notes.append(f"stage {stage} has no main side task yet: it waits for one")
        if record.gating == "none":
            # Naive co-location runs through training compute, so bubbles do not bound its steps.
            infos = {r: dataclasses.replace(info, bubble_ms=None) for r, info in infos.items()}
            notes.append('gating="none": bubble-fit rule not applied')
        budget_s = limits.budget_s if limits.budget_s is not None else self.budget_s(record)
        if budget_s is None:
            notes.append("step budget not known until the task is profiled")
        request = TaskRequest(
            name=record.name,
            memory_bytes=limits.memory_bytes or 0,
            budget_s=budget_s or 0.0,
            priority=1 - limits.priority,
            task_id=record.id,
            step_s=self.step_s(record),
            smallest_step_s=self.smallest_step_s(record),
        )
        if stage is None:
            outcome = place(request, list(infos.values()), policy=policy)
            if isinstance(outcome, NoPlacement):
                raise ValueError(outcome.reason)
            rank = self._rank_of[outcome.stage]
            how = f"placed on stage {outcome.stage}"
            if policy is PlacementPolicy.HARVEST:
                how += " (by the bubble time its steps would fill)"
        else:
            rank = self.rank_for(stage)
            if not (moving and rank == record.rank):
                outcome = place(request, [infos[rank]])
                if isinstance(outcome, NoPlacement):
                    refusal = outcome.refusals[0]
                    raise ValueError(
                        f"stage {stage} cannot host {record.name!r}: {refusal.rule}: "
                        f"{refusal.detail}; fix: lower its memory or budget_ms, or pick another "
                        "stage (session.stage_info() lists free memory and bubbles)"
                    )
            how = f"stage {stage} as asked"
        return rank, "; ".join([how, *notes])

    def check_stage(self, record: TaskRecord, limits: GpuLimits, rank: int) -> None:
        self.choose_rank(record, limits, self.lowest(rank))

    def stage_infos(
        self, *, exclude: str = "", leftovers: bool = False
    ) -> tuple[dict[int, StageInfo], list[str]]:
        """Placement's view of each rank (keyed by rank), plus notes on what is not known.
        Its queues hold the stages' main tasks, or with ``leftovers`` the tasks beside them
        (gating "leftovers"): the two take turns apart (``sidetasks.worker``)."""
        notes: list[str] = []
        free = free_bytes_by_rank(self._memory())
        if not free:
            notes.append("free memory not measured yet (no step done): memory rule skipped")
        predicted = predicted_bubbles_by_rank(self._bubbles())
        if not predicted:
            notes.append("bubbles not measured yet: bubble-fit rule skipped")
        queues: dict[int, list[QueuedTask]] = {r: [] for r in self.ranks}
        for record in self.book.records().values():
            if record.id == exclude or not self.book.live(record):
                continue
            if (record.gating == "leftovers") != leftovers:
                continue
            if record.rank in queues:
                priority = 1 - int(record.limits.get("priority", 1))
                queues[record.rank].append(QueuedTask(record.id, priority))
        infos = {
            r: StageInfo(
                stage=self.lowest(r),
                free_bytes=free.get(r, _UNKNOWN_FREE_BYTES) if free else _UNKNOWN_FREE_BYTES,
                bubble_ms=tuple(predicted.get(r, ())) if predicted else None,
                queue=tuple(queues[r]),
            )
            for r in self.ranks
        }
        return infos, notes

    def _ranks_with_main(self, *, exclude: str) -> set[int]:
        """The ranks with a live main side task (any gating but "leftovers")."""
        return {
            record.rank
            for record in self.book.records().values()
            if record.id != exclude and record.gating != "leftovers" and self.book.live(record)
        }

    def step_s(self, record: TaskRecord) -> float | None:
        """The task's profiled median step time, if a profile is on record."""
        profile = self.book.profile(record)
        step = None if profile is None else profile.get("median_step_s")
        return float(step) if isinstance(step, int | float) and step > 0 else None

    def smallest_step_s(self, record: TaskRecord) -> float | None:
        """The task's smallest step, for a task that steps in sizes: its profiled step (the
        largest size) in proportion to the sizes, as the task host first guesses it; None
        for a task whose steps are all whole or before a profile."""
        step, top = self.step_s(record), profiled_top_size(self.book.profile(record))
        return step / top if step is not None and top is not None and top > 1 else None

    def budget_s(self, record: TaskRecord) -> float | None:
        if record.limits.get("budget_s") is not None:
            return float(record.limits["budget_s"])
        profile = self.book.profile(record)
        return None if profile is None else float(profile["budget_s"])


def free_bytes_by_rank(memory: pd.DataFrame) -> dict[int, int]:
    """Free memory per rank (``core.bubbles.free_memory``); {} before any memory report."""
    if memory.empty:
        return {}
    from freeride_lab.core import bubbles as core_bubbles  # pandas: where tables are read

    free = core_bubbles.free_memory(memory)
    return {int(r): int(f) for r, f in zip(free["rank"], free["free_bytes"], strict=True)}


def predicted_bubbles_by_rank(bubbles: pd.DataFrame) -> dict[int, list[float]]:
    """Predicted bubble length (ms) per rank, in slot order (``core.bubbles.predict_bubbles``);
    {} before any bubble was measured."""
    if bubbles.empty:
        return {}
    from freeride_lab.core import bubbles as core_bubbles

    predicted = core_bubbles.predict_bubbles(bubbles)
    out: dict[int, list[float]] = {}
    for rank, group in predicted.groupby("rank", sort=True):
        out[int(rank)] = [float(v) for v in group.sort_values("slot")["predicted_ms"]]
    return out


def stage_info(
    manager: TaskedRanks, memory: pd.DataFrame, bubbles: pd.DataFrame
) -> list[dict[str, Any]]:
    """One dict per rank of this node, for the task board: stage (the rank's lowest), rank,
    stages, free_bytes (None before a step was measured), bubbles_ms (predicted length per slot,
    in slot order), label, tasks (ids of its live tasks, FIFO order)."""
    free = free_bytes_by_rank(memory)
    predicted = predicted_bubbles_by_rank(bubbles)
    live: dict[int, list[str]] = {r: [] for r in manager.ranks}
    for task in manager.tasks():
        if not task["detached"] and not is_terminal(SideTaskState(task["state"])):
            live.setdefault(task["rank"], []).append(task["id"])
    out = []
    for rank in manager.ranks:
        stages = manager.stages_of(rank)
        listed = ", ".join(map(str, stages))
        label = f"stage {stages[0]}" if len(stages) == 1 else f"stages {listed}"
        out.append(
            {
                "stage": stages[0],
                "rank": rank,
                "stages": stages,
                "free_bytes": free.get(rank),
                "bubbles_ms": predicted.get(rank, []),
                "label": label,
                "tasks": live.get(rank, []),
            }
        )
    return out
