"""The iterative driver: runs an ``IterativeSideTask``'s ``step()`` inside bubbles.

Inside a bubble the host calls ``step()`` while ``should_step(now, predicted end, budget,
observed end)`` holds; it stops launching as soon as the bubble is seen to end, even before its
predicted end. Without a fixed budget the first steps profile the task (see ``host.accounting``
[Note: profiling in bubbles]). Under gating "none" it steps in short bursts whatever training
does.
"""

from __future__ import annotations

import sys
import time

from freeride_lab.core.budget import should_step
from freeride_lab.core.sidetask_state import SideTaskEvent, SideTaskState
from freeride_lab.sidetasks.api import IterativeSideTask, SideTaskBase
from freeride_lab.sidetasks.edges import Edge
from freeride_lab.sidetasks.host.accounting import StepAccounting, training_busy_ns

__all__ = ["IterativeSteps"]

_FREE_BURST_S = 0.05  # gating "none": steps between two looks at the commands


class IterativeSteps(StepAccounting):
    """Steps of an iterative task: in a bubble, as profile samples, or continuously."""

    @property
    def _profiling_in_bubbles(self) -> bool:
        """No budget yet: steps are profile samples, one per largest bubble."""
        return (
            self.profile is None
            and self._budget_fixed_ns is None
            and self.spec.task.gating == "bubbles"
        )

    def _largest_bubble(self, bubble: Edge) -> bool:
        """Note ``bubble``'s predicted length; True if it is the longest of its rank's bubbles
        seen so far (see [Note: profiling in bubbles])."""
        if self._first_step_seen is None:
            self._first_step_seen = bubble.step
        if bubble.predicted_end_ns is None:
            return False
        length_ns = bubble.predicted_end_ns - bubble.start_ns
        self._slot_predicted_ns[bubble.slot] = length_ns
        if bubble.step <= self._first_step_seen:
            return False  # the rank's slots are not all known yet
        return length_ns >= max(self._slot_predicted_ns.values())

    def _run_bubble(self, bubble: Edge) -> None:
        task = self.task
        assert isinstance(task, IterativeSideTask)
        self._bubble = bubble
        profiling = self._profiling_in_bubbles
        largest = self._largest_bubble(bubble) if profiling else False
        predicted_end_ns = bubble.predicted_end_ns
        if predicted_end_ns is None:
            return  # no prediction yet: a step could not be checked against the bubble's length
        if profiling and not largest:
            return  # profile samples come from the largest bubbles only
        if not should_step(self.reader.now_ns(), predicted_end_ns, self._budget_ns(), False):
            return  # too short (or seen too late) for one step: leave it without events
        if not self._apply(SideTaskEvent.START):
            return
        while self._cmds.empty():
            cur = self.reader.latest()
            ended = cur is not None and cur.seq > bubble.seq
            start_ns = self.reader.now_ns()
            if not should_step(start_ns, predicted_end_ns, self._budget_ns(), ended):
                break
            if not self._step_in(task, bubble, start_ns):
                return  # finished
            if self.machine.terminal or self._policy_paused or profiling:
                break  # a profiling step is alone in its bubble
        self._apply(SideTaskEvent.PAUSE)

    def _step_in(self, task: IterativeSideTask, bubble: Edge, start_ns: int) -> bool:
        """One step inside ``bubble``; False once the task has FINISHED."""
        progress = self._one_step(task, bubble.step)
        end_ns = self.reader.now_ns()
        observed_end_ns = self._observed_end_ns(bubble, self.reader.latest())
        overrun_ns = max(0, end_ns - observed_end_ns) if observed_end_ns is not None else 0
        task.progress += progress
        self._record_step(bubble.step, start_ns, end_ns, progress, overrun_ns)
        if task.is_finished():
            self._apply(SideTaskEvent.FINISH, f"progress {task.progress:g} {task.unit}")
            return False
        return True

    def _run_free(self) -> None:
        """Gating "none": step for a short burst whatever training does (naive co-location)."""
        task = self.task
        assert isinstance(task, IterativeSideTask)
        if self.machine.state is SideTaskState.PAUSED and not self._apply(SideTaskEvent.START):
            return
        deadline = time.monotonic() + _FREE_BURST_S
        while self._cmds.empty() and time.monotonic() < deadline:
            start_edge = self.reader.latest()
            start_ns = self.reader.now_ns()
            step = start_edge.step if start_edge is not None else -1
            progress = self._one_step(task, step)
            end_ns = self.reader.now_ns()
            end_edge = self.reader.latest()
            task.progress += progress
            step = end_edge.step if end_edge is not None else -1
            busy_ns = training_busy_ns(start_edge, end_edge, start_ns, end_ns)
            self._record_step(step, start_ns, end_ns, progress, busy_ns)
            if task.is_finished():
                self._apply(SideTaskEvent.FINISH, f"progress {task.progress:g} {task.unit}")
                return
            if self.machine.terminal:
                return

    def _one_step(self, task: IterativeSideTask, step: int) -> float:
        """Run ``step()`` until its GPU work is done, marked in the beacon from this thread (a
        step that never returns leaves the mark for the worker's watchdog); its progress."""
        self._where = "step"
        if self.beacon is not None:
            self.beacon.step_started(step, self._budget_ns(), first=self._steps_started == 0)
        self._steps_started += 1
        try:
            progress = float(task.step() or 0.0)
            _wait_for_device(task)
        finally:
            if self.beacon is not None:
                self.beacon.busy()
        return progress


def _wait_for_device(task: SideTaskBase) -> None:
    """Block until ``task``'s queued GPU work is done.

    A step ends when its kernels do, not when ``step()`` returns: CUDA launches are
    asynchronous, and work still queued at the bubble's end would run into training's compute
    (and a profile of launch times alone would be far too short a budget).
    """
    torch = sys.modules.get("torch")  # a task that never imported torch has no GPU work
    if torch is not None and str(task.device).startswith("cuda"):
        # Not gated on torch.cuda.is_initialized(): work queued through torch._C alone (a
        # custom kernel, torch.cuda._sleep) leaves that flag False.
        torch.cuda.synchronize(task.device)
