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
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields
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
    "SideTaskCheckpoint",
    "SideTaskStateChanged",
    "SideTaskStep",
    "StepTimed",
    "check_dict",
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
    # when the host saw the bubble edge this step answered (run clock): on the first step
    # after an edge only, else 0; edge → seen → start_ns are the hops of its signal latency
    seen_ns: int = 0
    # on that first step too: when the host's clock expected the bubble to start (0: no
    # prediction), and the spin window it waited with (0, 0: it slept until woken): the edge
    # came inside [spin_from_ns, spin_until_ns] if the spin caught it; see core.edge_timing
    # [Note: spin window]
    expected_ns: int = 0
    spin_from_ns: int = 0
    spin_until_ns: int = 0
    # the guard the bubble's predicted remainder had to exceed for any step of the task (its
    # smallest step's; ns) when this step was taken in a bubble; 0 outside bubbles or while
    # profiling. The bench reads it for the bubbles the task left (core.idle_use)
    guard_ns: int = 0
    # the step() calls this record covers: a group's (sidetasks.host.iterative [Note: step
    # groups]), 1 for a lone step; the time of one call is (end_ns - start_ns) / calls
    calls: int = 1


@dataclass(frozen=True, kw_only=True)
class SideTaskCheckpoint(Event):
    """A side task's host took the task's state for a checkpoint: from ``start_ns`` to
    ``end_ns`` (run clock) its thread did nothing else, so it took no bubble and handed none
    on. ``why`` is what asked for it: "periodic", "request", "preempt", "stop", "restart" or
    "overrun" (the KILL policy); a periodic one is written afterwards by a thread
    (``sidetasks.host.checkpoints`` [Note: periodic checkpoints in the background])."""

    kind: ClassVar[str] = "side_task_checkpoint"
    task_id: str
    name: str
    stage: int
    rank: int
    start_ns: int
    end_ns: int
    why: str


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
        SideTaskCheckpoint,
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


# [Note: checking events read back]
# Event files are the run's truth, but a file can be damaged after it was written (a disk
# error, a copy cut short, a hand edit). ``check_dict`` is what a reader asks of each decoded
# line before using it: the ``kind`` is a string; for a known kind, every field without a
# default is there and every field present has its declared type (``bool`` is not an ``int``;
# ``1e400`` decodes to a float, so it is not one either); integers fit in int64 and are >= 0
# (indices, pids, counts and run-clock times) except where ``_INT_MINIMUM`` says otherwise;
# floats may be NaN or infinite (a diverged loss is data). Unknown kinds and unknown keys pass:
# a newer writer may add them, and the all-events table shows them.

_INT64_MAX = 2**63 - 1
# (kind, field) -> the least value allowed; None = any int64 (a signed offset).
_INT_MINIMUM: dict[tuple[str, str], int | None] = {
    ("rank_started", "clock_offset_ns"): None,
    ("side_task_step", "step"): -1,  # -1: the task stepped before training's first bubble
}

_Check = Callable[[object], bool]


def _int_check(least: int | None) -> _Check:
    low = -_INT64_MAX - 1 if least is None else least
    return lambda v: type(v) is int and low <= v <= _INT64_MAX


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _is_index_list(v: object) -> bool:
    return isinstance(v, list | tuple) and all(type(x) is int and 0 <= x <= _INT64_MAX for x in v)


def _check_of(kind: str, name: str, hint: object) -> tuple[_Check, str]:
    """A test for one field's value, and the rule it enforces in words."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    (base,) = [o for o in options if o is not type(None)]
    origin = typing.get_origin(base) or base
    check: _Check
    if base is int:
        least = _INT_MINIMUM.get((kind, name), 0)
        check, rule = _int_check(least), "an integer" + ("" if least is None else f" >= {least}")
    elif base is float:
        check, rule = _is_number, "a number"
    elif base in (str, bool) or origin is dict:
        check, rule = lambda v: isinstance(v, origin), _RULES[origin]
    elif origin is tuple:
        check, rule = _is_index_list, "a list of integers >= 0"
    else:  # a field type this checker does not know: a new event type needs a rule here
        raise TypeError(f"no check for {kind}.{name}: {hint!r}")
    if type(None) in options:
        inner = check
        return (lambda v: v is None or inner(v)), rule + " or null"
    return check, rule


_RULES: dict[object, str] = {str: "a string", bool: "true or false", dict: "an object"}


def _field_checks(cls: type[Event]) -> tuple[tuple[str, bool, _Check, str], ...]:
    """(name, required, check, rule) per field of ``cls``."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in fields(cls):
        required = f.default is MISSING and f.default_factory is MISSING
        out.append((f.name, required, *_check_of(cls.kind, f.name, hints[f.name])))
    return tuple(out)


_FIELD_CHECKS = {kind: _field_checks(cls) for kind, cls in EVENT_TYPES.items()}


def check_dict(data: object) -> None:
    """Raise ``ValueError`` saying what is wrong if ``data`` (a decoded event line) is not an
    event a reader can use (see [Note: checking events read back]); return quietly if it is."""
    if not isinstance(data, Mapping):
        raise ValueError(f"not a JSON object but {type(data).__name__}")
    kind = data.get("kind")
    if not isinstance(kind, str):
        raise ValueError(f"'kind' must be a string naming the event type, got {kind!r}")
    for name, required, check, rule in _FIELD_CHECKS.get(kind, ()):
        if name not in data:
            if required:
                raise ValueError(f"{kind} event without its {name!r}")
            continue
        value = data[name]
        if not check(value):
            shown = repr(value)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise ValueError(f"{kind} event: {name!r} must be {rule}, got {shown}")
