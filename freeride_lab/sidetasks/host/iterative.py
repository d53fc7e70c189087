"""The iterative driver: runs an ``IterativeSideTask``'s ``step()`` inside bubbles.

Inside a bubble the host calls ``step()`` while ``should_step(now, predicted end, budget,
observed end)`` holds; it stops launching as soon as the bubble is seen to end, even before its
predicted end. Without a fixed budget the first steps profile the task (see ``host.accounting``
[Note: profiling in bubbles]). Under gating "none" it steps in short bursts whatever training
does.

[Note: step groups]
Between two steps the host waits for the device, writes the step's record and looks at the
edges: about 70-100 µs on an H200 host. For a task whose steps take 0.2 ms (PageRank) that is a
quarter of the bubble lost between steps. Steps much shorter than ``step_group_ms`` (a
``RuntimeOptions`` field, 1 ms by default) are therefore launched in groups: ``step()`` is
called n times back to back, with one device wait and one ``SideTaskStep`` record (the group's
span and summed progress) at the end. n is the group length over the recent median step time,
and never more than the bubble's predicted remainder holds with the last step's full budget
kept as its guard, so a group ends where a lone step would have been allowed to. The host still
looks at the edges between the calls and stops launching once the bubble is seen to end. A
profiling step is always alone, and the profile is taken from single steps.
"""

from __future__ import annotations

import statistics
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
            ended = _has_ended(bubble, cur)
            start_ns = self.reader.now_ns()
            budget_ns = self._budget_ns()
            if not should_step(start_ns, predicted_end_ns, budget_ns, ended):
                break
            calls = 1 if profiling else self._group_size(predicted_end_ns - start_ns, budget_ns)
            if not self._step_in(task, bubble, start_ns, calls):
                return  # finished
            if self.machine.terminal or self._policy_paused or profiling:
                break  # a profiling step is alone in its bubble
        self._apply(SideTaskEvent.PAUSE)

    def _group_size(self, remaining_ns: int, budget_ns: int) -> int:
        """How many steps to launch before the next device wait ([Note: step groups])."""
        times = self._recent_step_ns
        if self.step_group_ns <= 0 or len(times) < 3:
            return 1
        step_ns = max(statistics.median(times), 1.0)
        by_length = int(self.step_group_ns // step_ns)
        by_bubble = 1 + int((remaining_ns - budget_ns) // step_ns)  # the last keeps its guard
        return max(1, min(by_length, by_bubble))

    def _step_in(
        self, task: IterativeSideTask, bubble: Edge, start_ns: int, calls: int = 1
    ) -> bool:
        """A step (or a group of ``calls`` steps) inside ``bubble``; False once FINISHED."""
        progress, done = self._one_step(task, bubble.step, calls, bubble)
        end_ns = self.reader.now_ns()
        self._recent_step_ns.append((end_ns - start_ns) / done)
        observed_end_ns = self._observed_end_ns(bubble, self.reader.latest())
        overrun_ns = max(0, end_ns - observed_end_ns) if observed_end_ns is not None else 0
        self._record_step(bubble.step, start_ns, end_ns, progress, overrun_ns, done)
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
            progress, _ = self._one_step(task, step)
            end_ns = self.reader.now_ns()
            end_edge = self.reader.latest()
            step = end_edge.step if end_edge is not None else -1
            busy_ns = training_busy_ns(start_edge, end_edge, start_ns, end_ns)
            self._record_step(step, start_ns, end_ns, progress, busy_ns)
            if task.is_finished():
                self._apply(SideTaskEvent.FINISH, f"progress {task.progress:g} {task.unit}")
                return
            if self.machine.terminal:
                return

    def _one_step(
        self, task: IterativeSideTask, step: int, calls: int = 1, bubble: Edge | None = None
    ) -> tuple[float, int]:
        """Run ``step()`` ``calls`` times (fewer if ``bubble`` is seen to end or the task
        finishes), then until its GPU work is done, marked in the beacon from this thread (a
        step that never returns leaves the mark for the worker's watchdog); the progress and
        the number of calls made. Each call's progress is added to ``task.progress`` as it
        returns, so ``is_finished()`` sees it."""
        self._where = "step"
        if self.beacon is not None:
            budget_ns = self._budget_ns() * calls
            self.beacon.step_started(step, budget_ns, first=self._steps_started == 0)
        self._steps_started += 1
        progress, done = 0.0, 0
        try:
            while True:
                made = float(task.step() or 0.0)
                task.progress += made
                progress += made
                done += 1
                if done >= calls or task.is_finished():
                    break
                if bubble is not None and _has_ended(bubble, self.reader.latest()):
                    break  # launch no more
            _wait_for_device(task)
        finally:
            if self.beacon is not None:
                self.beacon.busy()
        return progress, done


def _has_ended(bubble: Edge, cur: Edge | None) -> bool:
    """Whether an edge newer than ``bubble``'s start has come (its end, or a later one)."""
    return cur is not None and cur.seq > bubble.seq


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
