"""Which of a stage's side tasks takes its bubbles next, and when one preempts another.

One side task at a time steps in a stage's bubbles (FreeRide: "at most one side task runs per
GPU"). The waiting tasks are ordered by priority, then by when they were attached; priority
is the task's ``GpuLimits.priority``, which is also its MPS client priority: 0 (normal) goes
before 1 (below normal, the default). A waiting task of a higher priority than the active one
preempts it (paper notes §8): the active task is asked to move off the device (PREEMPT:
PAUSED/RUNNING -> CREATED, its state kept on the host), and once it has, the waiting one is
activated; the preempted task waits again in its place in the order (FreeRide requeues it at
the back, behind tasks attached after it; keeping its place means a preempted task is never
overtaken by one of its own priority). Equal priority never preempts. Imperative tasks cannot
be preempted (their process is stopped with SIGSTOP between bubbles, not moved off the
device), so they run until they end.

    >>> low = Queued("a", priority=1, state=SideTaskState.RUNNING, mode="iterative")
    >>> high = Queued("b", priority=0, state=SideTaskState.CREATED)
    >>> next_move([low, high], active="a")
    Move(activate=None, preempt='a')
    >>> next_move([low._replace(state=SideTaskState.CREATED), high], active=None)
    Move(activate='b', preempt=None)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from freeride_lab.core.sidetask_state import SideTaskState, is_terminal

__all__ = ["Move", "Queued", "next_move"]

_WAITING = (SideTaskState.SUBMITTED, SideTaskState.CREATED)
_ON_DEVICE = (SideTaskState.PAUSED, SideTaskState.RUNNING)


class Queued(NamedTuple):
    """What the order needs to know of one attached task, in attach order."""

    task_id: str
    priority: int = 1  # 0 goes first (``GpuLimits.priority``)
    state: SideTaskState = SideTaskState.SUBMITTED
    mode: str = ""  # "iterative" | "imperative" once its process said so
    ready: bool = True  # may be activated: its process is alive, no restart or stop under way


class Move(NamedTuple):
    """What the worker should do now: activate one task, preempt the active one, or nothing."""

    activate: str | None = None
    preempt: str | None = None


def next_move(tasks: Sequence[Queued], active: str | None) -> Move:
    """The next step of the stage's queue.

    Args:
        tasks: every attached task, in attach order.
        active: the task that holds the bubbles (activated, its process alive, not yet ended
            or preempted), or None.
    """
    waiting = [t for t in tasks if t.ready and t.state in _WAITING and t.task_id != active]
    best = min(waiting, key=lambda t: t.priority, default=None)  # min keeps attach order
    current = next((t for t in tasks if t.task_id == active), None)
    if current is not None and not is_terminal(current.state):
        preemptible = current.mode == "iterative" and current.state in _ON_DEVICE
        if best is not None and best.priority < current.priority and preemptible:
            return Move(preempt=current.task_id)
        return Move()
    return Move(activate=best.task_id) if best is not None else Move()
