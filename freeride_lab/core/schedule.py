"""Pipeline schedules as data: names, actions, stage placement and torch's own plans.

A plan maps each pipeline rank to its ordered compute actions. It is read from the installed
torch's schedule classes (``pipeline_order``), built against lightweight stand-in stages, so it
is exactly what ``torch.distributed.pipelining`` will run — no process group is needed.

    >>> Schedule.from_name("1f1b").name
    '1F1B'
    >>> Action.parse("2W3")
    Action(stage=2, kind=<ActionKind.BACKWARD_WEIGHT: 'W'>, microbatch=3)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

__all__ = [
    "SCHEDULES",
    "Action",
    "ActionKind",
    "Schedule",
    "feeding_stage",
    "stage_indices",
    "torch_plan",
    "torch_plan_with_held_sends",
]


class ActionKind(StrEnum):
    """Compute actions, spelt with torch's letters (``str()`` gives the letter)."""

    FORWARD = "F"
    BACKWARD = "B"  # full backward (input and weight gradients)
    BACKWARD_INPUT = "I"
    BACKWARD_WEIGHT = "W"


_ACTION_RE = re.compile(r"^(\d+)([FBIW])(\d+)$")


@dataclass(frozen=True, slots=True)
class Action:
    """One compute action: ``stage`` (global stage index), ``kind``, ``microbatch``."""

    stage: int
    kind: ActionKind
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind.value}{self.microbatch}"

    @classmethod
    def parse(cls, text: str) -> Action:
        """Parse the short form (``"2F0"``, ``"1W3"``) back into an action."""
        m = _ACTION_RE.match(text.strip())
        if m is None:
            raise ValueError(
                f"cannot parse action {text!r}; expected <stage><F|B|I|W><microbatch>, e.g. '2F0'"
            )
        return cls(int(m.group(1)), ActionKind(m.group(2)), int(m.group(3)))


StageStyle = Literal["loop", "v"]


@dataclass(frozen=True, slots=True)
class Schedule:
    """A schedule class of ``torch.distributed.pipelining``, described as data.

    ``multi`` schedules hold several stage chunks per rank; ``style`` says how chunks map to
    ranks ("loop": rank r holds stages r, r+S, r+2S…; "v": rank r holds r and 2S-1-r).
    """

    name: str
    torch_class: str
    multi: bool
    style: StageStyle = "loop"
    default_chunks: int = 1
    fixed_chunks: int | None = None  # V schedules need exactly two chunks per rank
    splits_backward: bool = False  # runs I and W actions instead of B

    @classmethod
    def from_name(cls, name: str) -> Schedule:
        """Look a schedule up by name, ignoring case, ``-`` and ``_`` ("interleaved-1f1b")."""
        if not isinstance(name, str):
            raise ValueError(f"schedule={name!r} must be a name; valid: {', '.join(SCHEDULES)}")
        key = _norm(name)
        for spec in SCHEDULES.values():
            if key in (_norm(spec.name), _norm(spec.torch_class)):
                return spec
        raise ValueError(f"unknown schedule {name!r}; valid: {', '.join(SCHEDULES)}")

    def resolve_chunks(self, chunks: int | None) -> int:
        """Chunks (model pieces) per rank for this schedule, checking ``chunks`` if given."""
        if chunks is None:
            return self.fixed_chunks or self.default_chunks
        if chunks < 1:
            raise ValueError(f"chunks={chunks} must be >= 1")
        if not self.multi and chunks != 1:
            raise ValueError(
                f"chunks={chunks} but {self.name} runs one stage per rank; "
                "use chunks=1 or a multi-stage schedule such as Interleaved1F1B"
            )
        if self.fixed_chunks is not None and chunks != self.fixed_chunks:
            raise ValueError(f"chunks={chunks} but {self.name} needs exactly {self.fixed_chunks}")
        return chunks


def _norm(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "").removeprefix("schedule")


SCHEDULES: dict[str, Schedule] = {
    s.name: s
    for s in (
        Schedule("GPipe", "ScheduleGPipe", multi=False),
        Schedule("1F1B", "Schedule1F1B", multi=False),
        Schedule("Interleaved1F1B", "ScheduleInterleaved1F1B", multi=True, default_chunks=2),
        Schedule("LoopedBFS", "ScheduleLoopedBFS", multi=True, default_chunks=2),
        Schedule(
            "InterleavedZeroBubble",
            "ScheduleInterleavedZeroBubble",
            multi=True,
            default_chunks=2,
            splits_backward=True,
        ),
        Schedule(
            "ZBVZeroBubble",
            "ScheduleZBVZeroBubble",
            multi=True,
            style="v",
            fixed_chunks=2,
            splits_backward=True,
        ),
        Schedule(
            "DualPipeV",
            "ScheduleDualPipeV",
            multi=True,
            style="v",
            fixed_chunks=2,
            splits_backward=True,
        ),
    )
}


def feeding_stage(stage: int, kind: ActionKind) -> int | None:
    """The stage whose output ``kind`` on ``stage`` waits for: a forward's input comes from
    the stage before, a backward's (B or I) gradient from the stage after; None for a W, which
    waits on its own stage's I. A first stage's forward gets -1, a stage that does not exist
    (its input is the data).

        >>> feeding_stage(2, ActionKind.FORWARD), feeding_stage(2, ActionKind.BACKWARD_INPUT)
        (1, 3)
    """
    if kind is ActionKind.FORWARD:
        return stage - 1
    if kind in (ActionKind.BACKWARD, ActionKind.BACKWARD_INPUT):
        return stage + 1
    return None


def stage_indices(schedule: Schedule, rank: int, ranks: int, chunks: int) -> list[int]:
    """Global stage indices held by ``rank`` (ascending), for ``ranks`` ranks of ``chunks`` each."""
    if schedule.style == "v":
        return sorted((rank, 2 * ranks - 1 - rank))
    return [rank + ranks * k for k in range(chunks)]


def torch_plan(
    schedule: Schedule | str, ranks: int, microbatches: int, chunks: int | None = None
) -> dict[int, list[Action | None]]:
    """The installed torch's plan: rank → ordered compute actions, ``None`` for planned idle slots.

    Overlapped actions (DualPipeV's OVERLAP_F_B) are expanded into their sub-actions in the
    order torch runs them; communication and gradient-reduction actions are dropped.

    Raises:
        ValueError: the schedule cannot run these sizes (torch's reason, with the numbers).
    """
    return torch_plan_with_held_sends(schedule, ranks, microbatches, chunks)[0]


def torch_plan_with_held_sends(
    schedule: Schedule | str, ranks: int, microbatches: int, chunks: int | None = None
) -> tuple[dict[int, list[Action | None]], dict[int, frozenset[int]]]:
    """``torch_plan`` and, per rank, the positions (among its actions, ``None`` left out) of
    the actions whose results torch sends to other ranks only when the next action has ended.

    [Note: held sends] torch adds the sends of an overlapped action (DualPipeV's
    OVERLAP_F_B) after the whole action, so the output of its first sub-action leaves the
    rank only once the second has run too; a rank downstream waits that long. Results used
    on the same rank pass at once.
    """
    from freeride_lab.core.torch_compat import StandInStage, plan_order, schedule_class

    spec = Schedule.from_name(schedule) if isinstance(schedule, str) else schedule
    v = spec.resolve_chunks(chunks)
    if ranks < 1 or microbatches < 1:
        raise ValueError(f"stages={ranks} and microbatches={microbatches} must both be >= 1")
    if spec.name == "1F1B":  # planned here ([Note: 1F1B plan]): no torch import (seconds)
        if microbatches < ranks:
            raise ValueError(
                f"{spec.name} cannot run stages={ranks}, microbatches={microbatches}, "
                f"chunks={v}: Number of microbatches ({microbatches}) must be greater than or "
                f"equal to the number of stages ({ranks})."
            )
        executed: dict[int, list[Action | None]] = {
            r: list(_executed_1f1b(r, ranks, microbatches)) for r in range(ranks)
        }
        return executed, {r: frozenset() for r in range(ranks)}
    cls = schedule_class(spec.torch_class)
    if cls is None:
        import torch

        raise ValueError(
            f"schedule {spec.name!r} is not in the installed torch {torch.__version__}"
        )
    plan: dict[int, list[Action | None]] = {}
    held: dict[int, frozenset[int]] = {}
    single_order: dict[int, list[Any]] | None = None
    for rank in range(ranks):
        try:
            if spec.multi:
                stages = [
                    StandInStage(i, ranks * v, rank, ranks)
                    for i in stage_indices(spec, rank, ranks, v)
                ]
                order = plan_order(cls, stages, microbatches)
            elif single_order is None:  # single-stage schedules plan every rank at once
                single_order = plan_order(cls, StandInStage(0, ranks, 0, ranks), microbatches)
                order = single_order
            else:
                order = single_order
        except (ValueError, AssertionError, RuntimeError) as e:
            raise ValueError(
                f"{spec.name} cannot run stages={ranks}, microbatches={microbatches}, "
                f"chunks={v}: {e}"
            ) from None
        converted = [_convert(a) for a in order[rank]] if order else []
        plan[rank] = _flatten(converted)
        held[rank] = _held_positions(converted)
    return plan, held


def _held_positions(converted: list[Action | list[Action] | None]) -> frozenset[int]:
    """Positions (``None`` left out) of every sub-action of an overlapped action but its last:
    their sends wait for the rest of the action ([Note: held sends])."""
    held: set[int] = set()
    position = 0
    for a in converted:
        if isinstance(a, list):
            held.update(range(position, position + len(a) - 1))
            position += len(a)
        elif a is not None:
            position += 1
    return frozenset(held)


def _executed_1f1b(stage: int, stages: int, microbatches: int) -> list[Action]:
    """1F1B as ``Schedule1F1B._step_microbatches`` runs it.

    [Note: 1F1B plan] torch's ``Schedule1F1B.pipeline_order`` numbers the last stage's
    micro-batches from 1 (``3F1 … 3F4`` at S=M=4), which is not what executes: the step runs
    min(M, S-s) warm-up forwards, then alternates B, F, then drains the remaining backwards.
    """
    warmup = min(microbatches, stages - stage)
    plan = [Action(stage, ActionKind.FORWARD, j) for j in range(warmup)]
    fwd = warmup
    for bwd in range(microbatches):
        plan.append(Action(stage, ActionKind.BACKWARD, bwd))
        if fwd < microbatches:
            plan.append(Action(stage, ActionKind.FORWARD, fwd))
            fwd += 1
    return plan


def _flatten(actions: list[Action | list[Action] | None]) -> list[Action | None]:
    out: list[Action | None] = []
    for a in actions:
        if isinstance(a, list):
            out.extend(a)
        else:
            out.append(a)
    return out


def _convert(a: object) -> Action | list[Action] | None:
    from freeride_lab.core.torch_compat import action_parts

    if a is None or isinstance(a, Action):
        return a
    parts = action_parts(a)
    if isinstance(parts, list):  # an overlapped action: its sub-actions, in torch's order
        return [x for s in parts if isinstance(x := _convert(s), Action)]
    letter, stage, microbatch = parts
    if letter not in ("F", "B", "I", "W") or microbatch is None:
        return []  # communication, REDUCE_GRAD, …: not compute
    return Action(stage, ActionKind(letter), microbatch)
