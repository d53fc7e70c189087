"""The worker's edge thread: stops and continues its active imperative task at bubble edges.

An imperative task's ``run()`` only pauses at its own ``pause_point()`` calls; the guarantee
that it computes nothing while training does comes from here (paper notes §6.2): at a bubble
end the worker waits up to ``pause_grace_s`` for the task's cooperative pause, then stops the
whole process with SIGSTOP; at the next bubble start it sends SIGCONT. It also notices the end
of training (the rank closes its edge file) and keeps the worker's run clock offset current.

[Note: a worker without a task is not woken]
Every edge the rank announces writes a byte to each waiting reader's FIFO and wakes that process
(tens of times a second, on the cores training runs on, from inside the rank's step). A worker
with no active task has nothing to stop or continue at an edge, so its edge thread mutes its
reader (the rank then writes to no FIFO of it) and looks at the edge file every ``IDLE_CHECK_S``
for the end of training and for a task; once one is active it is woken at every edge again. A
task's own edge reader (in its host process) is not affected.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable
from pathlib import Path

from freeride_lab.core.sidetask_state import SideTaskState
from freeride_lab.sidetasks.edges import EdgeReader, Phase
from freeride_lab.sidetasks.process import TaskProcess

__all__ = ["IDLE_CHECK_S", "watch_edges"]

IDLE_CHECK_S = 0.1
"""How often the edge thread looks for a task (and for the end of training) while none is
active: fewer wake-ups than the rank's announced edges (tens a second), and a task made
active starts being stopped and continued at most this much later."""

_ON_DEVICE = (SideTaskState.PAUSED, SideTaskState.RUNNING)


def watch_edges(
    path: Path,
    *,
    stopping: Callable[[], bool],
    active: Callable[[], TaskProcess | None],
    on_clock_offset: Callable[[int], None],
    on_closed: Callable[[], None],
) -> None:
    """Follow the edge file at ``path`` until ``stopping()``: SIGSTOP/SIGCONT of the task
    ``active()`` returns, ``on_clock_offset`` with the writer's offset after every wait,
    ``on_closed`` at each CLOSED edge."""
    reader: EdgeReader | None = None
    while reader is None and not stopping():
        with contextlib.suppress(FileNotFoundError):
            reader = EdgeReader.open(path, timeout_s=1.0)
    if reader is None:
        return
    while not stopping():
        if active() is None:  # [Note: a worker without a task is not woken]
            reader.mute()
            time.sleep(IDLE_CHECK_S)
            edge = reader.wait(timeout_s=0)
        else:
            reader.unmute()
            edge = reader.wait(timeout_s=0.25)
        on_clock_offset(reader.clock_offset_ns)
        if edge is None:
            continue
        if edge.phase is Phase.CLOSED:
            on_closed()
            continue
        task = active()
        if task is None or task.busy or not task.alive:
            continue
        if edge.in_bubble:
            task.paused.clear()
            if task.sigstopped:
                task.signal(signal.SIGCONT)
        elif task.mode == "imperative" and task.state in _ON_DEVICE:
            if task.spec.gating == "none":
                continue  # naive co-location: it runs through training's compute
            task.paused.wait(task.spec.pause_grace_s)  # the cooperative pause first
            if not task.busy and active() is task:
                task.signal(signal.SIGSTOP)
    reader.close()
