"""Events: what ranks, workers and side tasks record, one JSON object per line.

Every event is a frozen dataclass with a ``kind`` and ``schema_version``; times are integer
nanoseconds on the run's common clock (``time.time_ns`` corrected by the rank's clock offset),
durations are integer nanoseconds. ``to_json``/``from_json`` round-trip exactly.

    >>> ev = ActionTimed(rank=1, stage=1, step=3, action="F", microbatch=0, start_ns=10, end_ns=25)
    >>> from_json(to_json(ev)) == ev
    True
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

__all__ = [
    "EVENT_TYPES",
    "SCHEMA_VERSION",
    "ActionTimed",
    "BubbleEdge",
    "ControlAck",
    "Event",
    "MemoryReport",
    "RankFailed",
    "RankFinished",
    "RankStarted",
    "SideTaskStateChanged",
    "SideTaskStep",
    "StepTimed",
    "from_dict",
    "from_json",
    "to_json",
]

SCHEMA_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class Event:
    """Base of all events. ``kind`` names the concrete type on disk and on the bus."""

    kind: ClassVar[str] = "event"
    schema_version: int = SCHEMA_VERSION


@dataclass(frozen=True, kw_only=True)
class RankStarted(Event):
    """A rank is up: its stages, pid, host, device and clock offset to the run clock."""

    kind: ClassVar[str] = "rank_started"
    rank: int
    world_size: int
    stages: tuple[int, ...]
    pid: int
    host: str
    device: str
    t_ns: int
    clock_offset_ns: int = 0  # added to this host's time.time_ns to get run time
    clock_uncertainty_ns: int = 0  # bound on the offset's error (RTT / 2; 0: exact, same host)
    clock_rtt_ns: int = 0  # round trip of the clock exchange the offset came from


@dataclass(frozen=True, kw_only=True)
class ActionTimed(Event):
    """One compute action (F, B, I or W) of one micro-batch on one stage."""

    kind: ClassVar[str] = "action"
    rank: int
    stage: int
    step: int
    action: str  # "F" | "B" | "I" | "W"
    microbatch: int
    start_ns: int
    end_ns: int


@dataclass(frozen=True, kw_only=True)
class StepTimed(Event):
    """One training step of one rank: schedule window, optimizer step and loss (last stage)."""

    kind: ClassVar[str] = "step"
    rank: int
    step: int
    start_ns: int
    end_ns: int
    optimizer_start_ns: int
    optimizer_end_ns: int
    loss: float | None = None
    tokens: int = 0


@dataclass(frozen=True, kw_only=True)
class MemoryReport(Event):
    """Device memory of one rank after a step (bytes); on CPU the process RSS, capacity = RAM."""

    kind: ClassVar[str] = "memory"
    rank: int
    step: int
    peak_reserved_bytes: int
    capacity_bytes: int
    device: str


@dataclass(frozen=True, kw_only=True)
class BubbleEdge(Event):
    """A bubble edge seen live by a rank: ``edge`` is "start" (with a prediction) or "end"."""

    kind: ClassVar[str] = "bubble_edge"
    rank: int
    stage: int
    step: int
    slot: int  # index of this idle gap among the rank's gaps in the step
    edge: str  # "start" | "end"
    t_ns: int
    predicted_end_ns: int | None = None
    label: str | None = None


@dataclass(frozen=True, kw_only=True)
class RankFinished(Event):
    """A rank ended normally after ``steps`` steps."""

    kind: ClassVar[str] = "rank_finished"
    rank: int
    steps: int
    t_ns: int
    dropped_events: int = 0


@dataclass(frozen=True, kw_only=True)
class RankFailed(Event):
    """A rank ended with an error; ``error`` is one line, ``traceback`` the full text."""

    kind: ClassVar[str] = "rank_failed"
    rank: int
    t_ns: int
    error: str
    traceback: str = ""


@dataclass(frozen=True, kw_only=True)
class SideTaskStateChanged(Event):
    """A side task changed state (``state`` is a ``sidetask_state.SideTaskState`` value) or a
    change was refused."""

    kind: ClassVar[str] = "side_task_state"
    task_id: str
    name: str
    stage: int
    state: str
    t_ns: int
    event: str = ""
    accepted: bool = True
    reason: str = ""
    traceback: str = ""  # full text for FAILED; ``reason`` is its one-line summary


@dataclass(frozen=True, kw_only=True)
class SideTaskStep(Event):
    """One unit of side-task work, with its progress and whether it overran the bubble."""

    kind: ClassVar[str] = "side_task_step"
    task_id: str
    name: str
    stage: int
    rank: int
    step: int  # training step whose bubble hosted it
    start_ns: int
    end_ns: int
    progress: float  # in the task's unit, this step only
    unit: str
    overrun_ns: int = 0


@dataclass(frozen=True, kw_only=True)
class ControlAck(Event):
    """A control command (attach, tune, detach, stop) was carried out or refused."""

    kind: ClassVar[str] = "control_ack"
    command: str
    t_ns: int
    ok: bool
    message: str = ""
    payload: dict[str, Any] = field(default_factory=dict)


EVENT_TYPES: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (
        RankStarted,
        ActionTimed,
        StepTimed,
        MemoryReport,
        BubbleEdge,
        RankFinished,
        RankFailed,
        SideTaskStateChanged,
        SideTaskStep,
        ControlAck,
    )
}


def to_dict(event: Event) -> dict[str, Any]:
    """The event as a plain dict with its ``kind`` first."""
    return {"kind": event.kind, **asdict(event)}


def to_json(event: Event) -> str:
    """One compact JSON line (no trailing newline)."""
    return json.dumps(to_dict(event), separators=(",", ":"))


def from_dict(data: dict[str, Any]) -> Event:
    """Rebuild an event from its dict; unknown keys from newer writers are ignored."""
    kind = data.get("kind")
    cls = EVENT_TYPES.get(str(kind))
    if cls is None:
        raise ValueError(f"unknown event kind {kind!r}; valid: {', '.join(EVENT_TYPES)}")
    names = {f.name for f in fields(cls)}
    kwargs = {k: v for k, v in data.items() if k in names}
    if "stages" in kwargs and isinstance(kwargs["stages"], list):
        kwargs["stages"] = tuple(kwargs["stages"])
    return cls(**kwargs)


def from_json(line: str) -> Event:
    """Parse one JSON line written by ``to_json``."""
    return from_dict(json.loads(line))
