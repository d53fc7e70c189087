"""The side-task state machine: states, events and the one table of legal transitions.

FreeRide's lifecycle (paper notes §7), with FAILED added and preemption supported::

    SUBMITTED --CREATE--> CREATED --INIT--> PAUSED --START--> RUNNING --FINISH--> FINISHED
                                   ^          ^ <---PAUSE----   |
                                   +-PREEMPT--+--PREEMPT--------+
    any non-terminal --STOP--> STOPPED        any non-terminal --FAIL--> FAILED

``TRANSITIONS`` is the only place transitions are defined. ``transition`` looks an event up
and returns a ``Transition`` (new state plus the ``SideTaskBase`` hooks to run, in order) or a
``Rejected`` value; it never raises for an event that does not apply. The caller logs a
rejection and drops the event — it is never kept pending, which is how the reference's stale
pause ended up pausing the *next* run.

    >>> transition(SideTaskState.PAUSED, SideTaskEvent.START)
    Transition(new_state=<SideTaskState.RUNNING: 'RUNNING'>, hooks=('on_start',))
    >>> transition(SideTaskState.PAUSED, SideTaskEvent.PAUSE).reason
    'PAUSE does not apply to PAUSED; PAUSED accepts: START, PREEMPT, STOP, FAIL'

# [Note: terminal states]
FINISHED, STOPPED and FAILED accept nothing, not even STOP or FAIL: a second STOP is
rejected ("already terminal") so that a late signal cannot rewrite how a task ended. The
caller treats a rejected STOP on a terminal task as done.

# [Note: teardown only after setup]
STOP and FAIL from SUBMITTED run no hook: ``setup()`` has not completed, so there is nothing
``teardown()`` may assume exists. From every other state they run ``teardown``; from RUNNING
``on_pause`` runs first so the task's own loop state is consistent.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from types import MappingProxyType
from typing import TypeVar

__all__ = [
    "HISTORY_LIMIT",
    "TERMINAL_STATES",
    "TRANSITIONS",
    "HistoryEntry",
    "Rejected",
    "SideTaskEvent",
    "SideTaskMachine",
    "SideTaskState",
    "Transition",
    "accepted_events",
    "is_terminal",
    "transition",
]


class SideTaskState(StrEnum):
    """Where a side task is in its lifecycle."""

    SUBMITTED = "SUBMITTED"  # process asked for, setup() not done
    CREATED = "CREATED"  # host-side state built; nothing on the device
    PAUSED = "PAUSED"  # device-resident, not stepping
    RUNNING = "RUNNING"  # device-resident, may step inside the current bubble
    FINISHED = "FINISHED"  # is_finished() became true
    STOPPED = "STOPPED"  # stopped from outside (user, shutdown, overrun policy)
    FAILED = "FAILED"  # raised or died


class SideTaskEvent(StrEnum):
    """What can happen to a side task."""

    CREATE = "CREATE"  # setup() completed
    INIT = "INIT"  # move state to the device
    START = "START"  # a bubble began: may step until its predicted end
    PAUSE = "PAUSE"  # the bubble ended
    PREEMPT = "PREEMPT"  # move state off the device (a higher-priority task takes the GPU)
    FINISH = "FINISH"  # the task reports it is done
    STOP = "STOP"  # stop from outside
    FAIL = "FAIL"  # an error


TERMINAL_STATES: frozenset[SideTaskState] = frozenset(
    {SideTaskState.FINISHED, SideTaskState.STOPPED, SideTaskState.FAILED}
)

_EnumT = TypeVar("_EnumT", bound=Enum)
_S = SideTaskState
_E = SideTaskEvent

#: (state, event) -> (new state, hooks of ``SideTaskBase`` to call, in order). Pairs not listed
#: are rejected. See the module notes for terminal states and teardown.
TRANSITIONS: Mapping[tuple[SideTaskState, SideTaskEvent], tuple[SideTaskState, tuple[str, ...]]]
TRANSITIONS = MappingProxyType(
    {
        (_S.SUBMITTED, _E.CREATE): (_S.CREATED, ("setup",)),
        (_S.SUBMITTED, _E.STOP): (_S.STOPPED, ()),
        (_S.SUBMITTED, _E.FAIL): (_S.FAILED, ()),
        (_S.CREATED, _E.INIT): (_S.PAUSED, ("to_device",)),
        (_S.CREATED, _E.STOP): (_S.STOPPED, ("teardown",)),
        (_S.CREATED, _E.FAIL): (_S.FAILED, ("teardown",)),
        (_S.PAUSED, _E.START): (_S.RUNNING, ("on_start",)),
        (_S.PAUSED, _E.PREEMPT): (_S.CREATED, ("to_host",)),
        (_S.PAUSED, _E.STOP): (_S.STOPPED, ("teardown",)),
        (_S.PAUSED, _E.FAIL): (_S.FAILED, ("teardown",)),
        (_S.RUNNING, _E.PAUSE): (_S.PAUSED, ("on_pause",)),
        (_S.RUNNING, _E.PREEMPT): (_S.CREATED, ("on_pause", "to_host")),
        (_S.RUNNING, _E.FINISH): (_S.FINISHED, ("teardown",)),
        (_S.RUNNING, _E.STOP): (_S.STOPPED, ("on_pause", "teardown")),
        (_S.RUNNING, _E.FAIL): (_S.FAILED, ("teardown",)),
    }
)


@dataclass(frozen=True, slots=True)
class Transition:
    """An accepted event: the state to move to and the hooks to run, in order."""

    new_state: SideTaskState
    hooks: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Rejected:
    """An event that does not apply to the current state; log it and drop it."""

    reason: str


# One Transition per entry, made once: a task host looks one up twice per bubble it uses.
_ACCEPTED: Mapping[tuple[SideTaskState, SideTaskEvent], Transition] = MappingProxyType(
    {key: Transition(new_state=new, hooks=hooks) for key, (new, hooks) in TRANSITIONS.items()}
)


def is_terminal(state: SideTaskState) -> bool:
    """True for FINISHED, STOPPED and FAILED, which accept no event."""
    return SideTaskState(state) in TERMINAL_STATES


def accepted_events(state: SideTaskState) -> tuple[SideTaskEvent, ...]:
    """Events that ``state`` accepts, in ``SideTaskEvent`` order."""
    state = SideTaskState(state)
    return tuple(e for e in SideTaskEvent if (state, e) in TRANSITIONS)


def transition(state: SideTaskState, event: SideTaskEvent) -> Transition | Rejected:
    """Look ``event`` up for ``state``: a ``Transition`` or a ``Rejected`` with the reason.

    Raises:
        ValueError: ``state`` or ``event`` is not a member (or value) of its enum.
    """
    state = _coerce(SideTaskState, state)
    event = _coerce(SideTaskEvent, event)
    accepted = _ACCEPTED.get((state, event))
    if accepted is not None:
        return accepted
    if state in TERMINAL_STATES:
        return Rejected(f"{event} does not apply to {state}: already terminal, accepts nothing")
    valid = ", ".join(str(e) for e in accepted_events(state))
    return Rejected(f"{event} does not apply to {state}; {state} accepts: {valid}")


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One event offered to a machine, accepted or not (``to_state`` = ``from_state`` if not)."""

    t_ns: int
    event: SideTaskEvent
    from_state: SideTaskState
    to_state: SideTaskState
    accepted: bool
    reason: str = ""


#: Events a machine remembers: a task host applies two per bubble it uses (START, PAUSE), for
#: as long as training runs, so an unbounded history would grow by millions a day.
HISTORY_LIMIT = 1024


@dataclass(slots=True)
class SideTaskMachine:
    """A task's current state plus the latest ``HISTORY_LIMIT`` events offered to it, oldest
    first. No clock: callers pass ``t_ns``.

    >>> m = SideTaskMachine()
    >>> m.apply(SideTaskEvent.CREATE, t_ns=1).new_state
    <SideTaskState.CREATED: 'CREATED'>
    >>> m.apply(SideTaskEvent.START, t_ns=2).reason
    'START does not apply to CREATED; CREATED accepts: INIT, STOP, FAIL'
    >>> [h.accepted for h in m.history]
    [True, False]
    """

    state: SideTaskState = SideTaskState.SUBMITTED
    history: deque[HistoryEntry] = field(default_factory=lambda: deque(maxlen=HISTORY_LIMIT))

    def apply(self, event: SideTaskEvent, *, t_ns: int) -> Transition | Rejected:
        """Offer ``event``; move if it applies, record it either way, return the outcome."""
        event = _coerce(SideTaskEvent, event)
        before = self.state
        outcome = transition(before, event)
        if isinstance(outcome, Transition):
            self.state = outcome.new_state
            self.history.append(HistoryEntry(t_ns, event, before, outcome.new_state, True))
        else:
            self.history.append(HistoryEntry(t_ns, event, before, before, False, outcome.reason))
        return outcome

    @property
    def terminal(self) -> bool:
        """True once the task has finished, stopped or failed."""
        return is_terminal(self.state)

    @property
    def rejected(self) -> list[HistoryEntry]:
        """The events in ``history`` that were refused, oldest first."""
        return [h for h in self.history if not h.accepted]


def _coerce(enum: type[_EnumT], value: object) -> _EnumT:
    if type(value) is enum:  # a member already (the usual case): no lookup
        return value
    try:
        return enum(value)
    except ValueError:
        valid = ", ".join(str(m.value) for m in enum)
        raise ValueError(f"unknown {enum.__name__} {value!r}; valid: {valid}") from None
