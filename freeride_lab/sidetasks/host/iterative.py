"""The iterative driver: runs an ``IterativeSideTask``'s ``step()`` inside bubbles.

Inside a bubble the host calls ``step()`` while ``should_step(now, predicted end, budget,
observed end)`` holds; it stops launching as soon as the bubble is seen to end, even before its
predicted end. Without a fixed budget the first steps profile the task (see ``host.accounting``
[Note: profiling in bubbles]). Under gating "none" it steps in short bursts whatever training
does; under gating "trickle" it also steps between bubbles, paced ([Note: trickle]).

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

[Note: step sizes]
A step sized for the short bubbles wastes the long ones' time on launches and waits, and one
sized for the long bubbles leaves the short ones, and the last milliseconds of every bubble,
empty. A task that can take several of its smallest steps as one (``step_sizes``: a vision
task with ``fit_slices`` runs 1, 2 or 4 slices of its batch in one step) gets, at each launch
in a bubble, the largest size whose guard still fits the bubble's predicted remainder, so a
bubble is filled coarse to fine; a size once too large for the remainder stays out of that
bubble, while a size the task did not offer at one step (a slice count that would have crossed
its batch's end) may come back at the next. The budget
(FreeRide's, the governor's, a tuned one) guards the task's largest step, the one it takes
alone and is profiled by; a smaller size's guard is that budget scaled by the two sizes'
recent median step times (``core.budget.sized_budget_ns``; in proportion to the size before
both are timed). A bubble is used at all when the smallest size's guard fits. Steps outside
the bubbles (gating "none") take the largest size, the task's own best pace; the profile
samples steps of the largest size alone. A task with sizes is never stepped in groups.

[Note: launch, then tell]
A bubble's first step is what the signal latency measures, so nothing that can wait runs
between the host seeing the bubble's start and calling ``step()``. The START transition (the
state machine and the task's ``on_start`` hook) is applied at once, but its announcement (a
``SideTaskStateChanged`` event and a message to the worker, which wakes the worker's reader:
another process that competes for the host's core) is held back until the step's kernels are
queued, and sent while the device runs them (on a CPU task, once its step has run). The event
keeps the time the transition happened, and any later announcement sends a held one first, so
every reader still sees RUNNING before the step's record and before the PAUSE that ends it.

[Note: outlived bubbles]
The rank's prediction is made before a bubble begins; once the bubble has outlived it, the
host knows more than the rank did. Under ``RuntimeOptions.outlived`` "survivors" the host keeps
each slot's recent lengths as it saw them (from the edges it reads: a bubble's start, and its
end from its own end edge or from the next edge's report of it) and, where the rank's
prediction no longer fits a step of the smallest size, plans to the end those of them longer
than the bubble has lasted give (``core.bubble_survival`` [Note: survivors' minimum]: their
shortest, once one in five is set aside). If that end is too close for a step, the host
sleeps in the bubble until the shortest of them has passed, or the bubble ends, and asks
again (a host with a leftovers task hands the bubble on instead: [Note: leftovers]). It
stops when too few lengths are left, the bubble ends or a command comes. The same holds at a
bubble's start, for a bubble predicted too short for any step. The guard is the one in
force, as for the rank's prediction; profiling steps never go past it. Under "stop"
(FreeRide's) nothing is learnt and no step starts past the rank's prediction, unless the rank
predicts from its peers and one has told its end since ([Note: told mid-bubble]).

A step planned to the survivors overruns in about one bubble in five that reaches it, by up
to the step's length, and the governor answers overruns by widening the task's guard for
every bubble: with a stage's main task of 5 ms steps and a leftovers task of 0.3 ms ones,
the main task's overruns past the prediction cost more than the time they find. Under
"hand-on" a main task whose hand-ons a leftovers task reads never plans past the rank's
prediction: it hands the bubble on there, and the leftovers task, whose overruns are short,
plans to the survivors. A task alone on its stage, and the leftovers task, go on as under
"survivors". On an H100 with the image task on the leftovers, "hand-on" took most of the time
past the prediction without a clear gain in harvest, and training's own actions on one
stage ran longer (BENCHMARKS, "2026-12-07, evening"): it is opt-in.

[Note: told mid-bubble]
Under ``RuntimeOptions.predictor`` "peers" a rank predicts a bubble from the end its awaited
peer published for the action the bubble waits on (``core.peer_prediction`` [Note: awaited
peer]). A bubble that began before that peer had started the action is predicted from its
slot alone, and the rank names the action, with the hand-over it would add to its end, on its
board (``io.peer_board``, ``PeerBoard.awaiting``). Once such a bubble outlives the rank's
prediction, the host reads the peer's board: where the peer has started the action since, the
bubble is taken to end at the peer's published end plus the hand-over, and the host steps on
while a step fits that (the guard in force, as for the rank's own prediction); where it has
not, the host sleeps in the bubble ``_PEER_LOOK_S`` at a time and looks again, until the
peer's end comes, the bubble ends or a command comes. A host whose hand-ons a leftovers task
reads hands the bubble on instead of waiting, and under "hand-on" it never plans past the
rank's prediction ([Note: outlived bubbles]). Only then do the survivors' lengths answer.

[Note: leftovers]
FreeRide runs at most one side task per GPU, and the bubble time its steps cannot use stays
empty: bubbles shorter than its smallest step (with its guard), and the end of a bubble after
its last step fitted. A task attached with gating "leftovers" takes that time, and only that.
The stage's main task's host hands it on: where it leaves a bubble that has not ended (it
never stepped in it, or its next step no longer fits), it writes that bubble's start to the
stage's leftovers file (``edges.leftovers_path``) as the rank wrote it (step, slot, start,
predicted end); when it reads the rank's end of that bubble, it writes that end there too.
The leftovers task's host reads that file as any host reads its rank's edges, so its steps
are planned and guarded by its own budget, sizes and profile, against the rank's predicted
end, and under "survivors" it learns the bubbles' own lengths, not what was left of them
([Note: outlived bubbles]; it sees only the bubbles handed on, so a bubble the main task
stepped to its end is not among them). Its spin clock learns the rank's starts too, and
spins across them: a bubble too short for the main task is handed on at once. The main
task's last step has finished on the device before the hand-on is written, so the two never
step at once (a leftovers step is guarded to the bubble's end as every step is). The hand-on
costs the main task nothing before its steps: it is written after them. A main task's host
with a leftovers task does not wait in a bubble for a survivor's length to pass: it hands the
bubble on instead, and the leftovers task's smaller steps may fit where its own did not.
Nothing is handed on from a bubble without a prediction, nor while the main task is off the
device; a main task's host that ends leaves the file to the next one (``EdgeWriter.release``).

[Note: trickle]
Under gating "trickle" a task steps in bubbles exactly as under "bubbles", and between bubbles,
while the rank computes, it runs groups of steps (about ``_TRICKLE_GROUP_NS`` long, one device
wait each) paced to its duty d (``GpuLimits.trickle_duty``): after a group of length t the next
starts no sooner than t x (1 - d) / d later, so it keeps about d of the time between bubbles.
A group stops launching at the next edge, so a bubble that starts is taken at once. d = 0 is
gating "bubbles"; the overhead governor moves d (``core.governor``), so that work through
training's compute is bought only while training's step time stays under its ceiling. Nothing
steps between bubbles before the task is profiled, or once the rank's newest edge is older
than ``_TRICKLE_STALE_NS`` (training parked or gone). A step's time during training's compute
is its ``overrun_ns``, as under gating "none"; the overrun policy judges bubble steps only.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import statistics
import sys
import time
from typing import Any

from freeride_lab.core.budget import should_step, sized_budget_ns
from freeride_lab.core.sidetask_state import SideTaskEvent, SideTaskState
from freeride_lab.sidetasks.api import IterativeSideTask, SideTaskBase
from freeride_lab.sidetasks.edges import Edge, EdgeWriter, Phase
from freeride_lab.sidetasks.host.accounting import StepAccounting, training_busy_ns

__all__ = ["IterativeSteps"]

log = logging.getLogger("freeride_lab.sidetasks.host")

_FREE_BURST_S = 0.05  # gating "none": steps between two looks at the commands
_TRICKLE_GROUP_NS = 2_000_000  # gating "trickle": steps launched between two device waits
_TRICKLE_STALE_NS = 5 * 10**9  # no step between bubbles once the newest edge is this old
_IN_BUBBLE_WAIT_S = 0.25  # the longest sleep in a bubble for a survivor's length to pass
_PEER_LOOK_S = 200e-6  # a sleep in a bubble between two looks for its awaited peer's start
_STARTS_KEPT = 64  # bubble starts remembered until their ends are seen
_LEFTOVERS_LOOK_S = 0.5  # how often a main task's host looks for a leftovers file


class IterativeSteps(StepAccounting):
    """Steps of an iterative task: in a bubble, as profile samples, or continuously."""

    @property
    def _profiling_in_bubbles(self) -> bool:
        """No budget yet: steps are profile samples, one per largest bubble."""
        return (
            self.profile is None
            and self._budget_fixed_ns is None
            and self.spec.task.gating != "none"
        )

    def _largest_bubble(self, bubble: Edge) -> bool:
        """Note ``bubble``'s predicted length; True if it is the longest of its rank's bubbles
        seen so far (see [Note: profiling in bubbles])."""
        if self._first_step_seen is None:
            self._first_step_seen = bubble.step
        if bubble.predicted_end_ns is None:
            return False
        # what is left of it when seen: a leftovers task's bubbles began before the hand-on
        length_ns = bubble.predicted_end_ns - max(bubble.start_ns, self.reader.now_ns())
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
            self._hand_on(bubble)
            return  # profile samples come from the largest bubbles only
        if not should_step(self.reader.now_ns(), predicted_end_ns, self._guard_ns(1), False):
            outlived_end_ns = None if profiling else self._outlived_end(bubble)
            if outlived_end_ns is None:
                self._hand_on(bubble)
                return  # too short (or seen too late) for one step: leave it without events
            predicted_end_ns = outlived_end_ns  # [Note: outlived bubbles]
        if not self._apply(SideTaskEvent.START, hold=True):  # [Note: launch, then tell]
            return
        too_large = 0  # the smallest size whose guard no longer fitted this bubble; 0: none
        while self._cmds.empty():
            ended = _has_ended(bubble, self.reader.latest())
            now_ns = self.reader.now_ns()
            budget_ns = self._guard_ns(1)
            if not should_step(now_ns, predicted_end_ns, budget_ns, ended):
                outlived_end_ns = None if ended or profiling else self._outlived_end(bubble)
                if outlived_end_ns is None:
                    break
                predicted_end_ns = outlived_end_ns
                continue
            remaining_ns = predicted_end_ns - now_ns
            sizes = self._step_sizes(task)
            size, too_large = self._fitting_size(sizes, remaining_ns, too_large)
            grouped = not profiling and len(sizes) == 1
            calls = self._group_size(remaining_ns, budget_ns) if grouped else 1
            self._entry_guard_ns = budget_ns  # the step's record tells the guard it cleared
            if not self._step_in(task, bubble, calls, size):
                self._hand_on(bubble)
                return  # finished
            if self.machine.terminal or self._policy_paused or profiling:
                break  # a profiling step is alone in its bubble
        self._hand_on(bubble)  # before the PAUSE's announcement: the rest is not this task's
        self._apply(SideTaskEvent.PAUSE)

    def _hand_on(self, bubble: Edge) -> None:
        """Hand what is left of ``bubble`` to the stage's leftovers task, if it has not ended
        ([Note: leftovers]); a host without a leftovers file does nothing."""
        if (
            not self.spec.leftovers_file
            or bubble.predicted_end_ns is None
            or self._handed == (bubble.step, bubble.slot)
        ):
            return
        reader = self.reader
        if _has_ended(bubble, reader.latest()):
            return
        writer = self._leftovers_writer()
        if writer is None:
            return
        writer.set_clock_offset(reader.clock_offset_ns)
        self._forward_end(bubble)  # a bubble still handed on ends before the next one starts
        writer.bubble_start(bubble.step, bubble.slot, bubble.start_ns, bubble.predicted_end_ns)
        self._handed = (bubble.step, bubble.slot)

    def _open_leftovers(self, path: str) -> EdgeWriter | None:
        """The writer of the leftovers file once a leftovers task's worker has made it (looked
        for at most every ``_LEFTOVERS_LOOK_S``); None before, and after a failure (logged)."""
        now_s = time.monotonic()
        if now_s < self._leftovers_look_s:
            return None
        self._leftovers_look_s = now_s + _LEFTOVERS_LOOK_S
        if not os.path.exists(path):
            return None
        try:
            writer = EdgeWriter.create(path, clock_offset_ns=self.reader.clock_offset_ns)
        except (OSError, ValueError) as exc:  # unwritable, or not an edge file: this task goes on
            log.warning("no hand-ons to the leftovers task (%s): %s", path, exc)
            self._leftovers = False
            return None
        self._leftovers = writer
        return writer

    def _leftovers_writer(self) -> EdgeWriter | None:
        """The writer of the hand-ons, the leftovers file opened here if it is due a look;
        None without one."""
        writer = self._leftovers
        if writer is None and self.spec.leftovers_file:
            writer = self._open_leftovers(self.spec.leftovers_file)
        return writer if isinstance(writer, EdgeWriter) else None

    def _leftovers_reading(self) -> bool:
        """True if a leftovers task reads this host's hand-ons now."""
        writer = self._leftovers_writer()
        return writer is not None and writer.readers > 0

    def _forward_end(self, edge: Edge) -> None:
        """Pass the end of the bubble handed on, once an edge newer than its start is read:
        the rank's end of it (from ``edge`` itself or the end it reports for the bubble
        before it), or now ([Note: leftovers])."""
        handed = self._handed
        writer = self._leftovers
        if handed is None or not isinstance(writer, EdgeWriter):
            return
        if edge.in_bubble and (edge.step, edge.slot) == handed:
            return  # the bubble handed on itself
        if edge.phase is Phase.BUSY and (edge.step, edge.slot) == handed:
            end_ns = edge.observed_end_ns
        elif (edge.previous_step, edge.previous_slot) == handed:
            end_ns = edge.previous_end_ns
        else:
            end_ns = None
        writer.bubble_end(*handed, self.reader.now_ns() if end_ns is None else end_ns)
        self._handed = None

    def _release_leftovers(self) -> None:
        """Leave the leftovers file to the stage's next main task (the host ends)."""
        writer, self._leftovers = self._leftovers, None
        if isinstance(writer, EdgeWriter):
            writer.release()

    def _outlived_end(self, bubble: Edge) -> int | None:
        """For ``bubble`` past the end it was planned to: the end its awaited peer has told
        since ([Note: told mid-bubble]), else, under ``outlived="survivors"``, an end that a
        step of the smallest size fits before now, from the slot's recent lengths longer than
        the bubble has lasted (``SurvivorLengths.room_after``); where none is far enough yet,
        the host sleeps in the bubble until one may be and asks again. None once none is
        left, the bubble ends or a command comes; under "stop" None but for a peer's end, and
        under "hand-on" None while a leftovers task reads this host's hand-ons ([Note:
        outlived bubbles])."""
        if self._outlived_handed_on and self._leftovers_reading():
            return None  # "hand-on": the time past the prediction is the leftovers task's
        told_ns = self._told_end(bubble)
        if told_ns is not None:
            return told_ns
        survivors = self._survivors
        if survivors is None:
            return None
        while self._cmds.empty() and not _has_ended(bubble, self.reader.latest()):
            now_ns = self.reader.now_ns()
            room = survivors.room_after(bubble.slot, now_ns - bubble.start_ns, self._guard_ns(1))
            if room is None:
                return None
            from_ns, end_ns = (bubble.start_ns + t for t in room)
            if from_ns <= now_ns:
                return end_ns
            if self._leftovers_reading():
                return None  # the leftovers task takes it from here ([Note: leftovers])
            if self._wait_in_bubble(bubble, from_ns):
                return None
        return None

    def _told_end(self, bubble: Edge) -> int | None:
        """For ``bubble`` past the rank's prediction, the end its awaited peer has published
        since it began, plus the rank's hand-over, if a step of the smallest size fits before
        it; waiting in the bubble for the peer to start. None where the rank named no action
        for this bubble, once the end no longer fits, the bubble ends or a command comes, and
        instead of waiting where a leftovers task reads the hand-ons ([Note: told
        mid-bubble])."""
        boards = self._boards
        if boards is None:
            return None
        while self._cmds.empty() and not _has_ended(bubble, self.reader.latest()):
            awaited = boards.awaiting(self.spec.rank)
            if awaited is None or (awaited.step, awaited.slot) != (bubble.step, bubble.slot):
                return None  # the rank had the peer's end at the start, or names another
            end_ns = boards.end_of(
                awaited.rank, awaited.step, awaited.stage, awaited.kind, awaited.microbatch
            )
            now_ns = self.reader.now_ns()
            if end_ns is not None:
                end_ns += awaited.hand_over_ns
                return end_ns if should_step(now_ns, end_ns, self._guard_ns(1), False) else None
            if self._leftovers_reading():
                return None  # the leftovers task takes it from here ([Note: leftovers])
            if self._wait_in_bubble(bubble, now_ns + round(_PEER_LOOK_S * 1e9)):
                return None
        return None

    def _wait_in_bubble(self, bubble: Edge, until_ns: int) -> bool:
        """Sleep until just past ``until_ns`` or until ``bubble`` ends (or a command comes);
        True if it ended. The edge that ended it stays unread for the main loop."""
        reader = self.reader
        timeout_s = min(_IN_BUBBLE_WAIT_S, max(0, until_ns - reader.now_ns()) / 1e9 + 20e-6)
        if self.beacon is not None:
            self.beacon.waiting(timeout_s)
        try:
            edge = reader.wait(timeout_s, after_seq=bubble.seq)  # a look: the edge stays new
        finally:
            if self.beacon is not None:
                self.beacon.busy()
        return edge is not None or _has_ended(bubble, reader.latest())

    def _note_length(self, edge: Edge) -> None:
        """Learn the slots' bubble lengths from an edge the host saw (under
        ``outlived="survivors"``): a start is kept, and a length is noted once its end is
        known, from the edge's own end or the one it reports for the bubble before it."""
        if self._survivors is None:
            return
        if edge.in_bubble:
            self._starts.setdefault((edge.step, edge.slot), edge.start_ns)
        elif edge.phase is Phase.BUSY and edge.observed_end_ns is not None:
            self._length_known(edge.step, edge.slot, edge.observed_end_ns, edge.start_ns)
        if edge.previous_end_ns is not None:
            self._length_known(edge.previous_step, edge.previous_slot, edge.previous_end_ns)
        while len(self._starts) > _STARTS_KEPT:
            self._starts.popitem(last=False)

    def _length_known(self, step: int, slot: int, end_ns: int, start_ns: int | None = None) -> None:
        """Note the length of bubble (``step``, ``slot``) once, if its start is known (kept,
        or ``start_ns``); its start is then kept as None: noted."""
        assert self._survivors is not None
        key = (step, slot)
        start = self._starts.get(key, start_ns)
        if start is None:
            return  # start never seen, or length already noted
        self._starts[key] = None
        if end_ns >= start:
            self._survivors.observe(slot, end_ns - start)

    def _group_size(self, remaining_ns: int, budget_ns: int) -> int:
        """How many steps to launch before the next device wait ([Note: step groups])."""
        times = self._recent_step_ns
        if self.step_group_ns <= 0 or len(times) < 3:
            return 1
        step_ns = max(statistics.median(times), 1.0)
        by_length = int(self.step_group_ns // step_ns)
        by_bubble = 1 + int((remaining_ns - budget_ns) // step_ns)  # the last keeps its guard
        return max(1, min(by_length, by_bubble))

    def _step_sizes(self, task: IterativeSideTask) -> tuple[int, ...]:
        """The task's step sizes now, checked; notes the largest ever offered."""
        sizes = step_sizes(task)
        self._top_size = max(self._top_size, sizes[-1])
        return sizes

    def _fitting_size(
        self, sizes: tuple[int, ...], remaining_ns: int, too_large: int = 0
    ) -> tuple[int, int]:
        """The largest of ``sizes`` below ``too_large`` (if > 0) whose guard fits
        ``remaining_ns``, else the smallest; and the new ``too_large``: the smallest size whose
        guard did not fit, which stays out of the bubble from then on ([Note: step sizes])."""
        for size in reversed(sizes[1:]):
            if too_large and size >= too_large:
                continue
            if remaining_ns > self._guard_ns(size):
                return size, too_large
            too_large = size
        return sizes[0], too_large

    def _median_size_ns(self, size: int) -> float | None:
        """The recent median time of steps of ``size``; None before three of them."""
        times = self._size_ns.get(size)
        return statistics.median(times) if times is not None and len(times) >= 3 else None

    def _guard_ns(self, size: int) -> int:
        """The guard in force for one step of ``size`` ([Note: step sizes]); 0 while
        profiling. Kept until the next step's time is noted (it is asked for several times
        between a bubble's edge and its first step)."""
        budget_ns = self._budget_ns()
        top = self._top_size
        if size >= top:
            return budget_ns
        key = (size, top, budget_ns)
        guard = self._guards.get(key)
        if guard is None:
            top_ns, size_ns = self._median_size_ns(top), self._median_size_ns(size)
            guard = self._guards[key] = sized_budget_ns(budget_ns, size, top, top_ns, size_ns)
        return guard

    def _note_size_time(self, size: int, calls: int, duration_ns: int) -> None:
        """Remember one step's time under its size (a group's mean under size 1)."""
        self._guards.clear()
        per_step = duration_ns / calls
        if size == 1:
            self._recent_step_ns.append(per_step)
        times = self._size_ns.setdefault(size, collections.deque(maxlen=16))
        times.append(per_step)

    def _step_in(
        self, task: IterativeSideTask, bubble: Edge, calls: int = 1, size: int = 1
    ) -> bool:
        """A step of ``size`` (or a group of ``calls`` steps of size 1) inside ``bubble``;
        False once FINISHED."""
        progress, done, start_ns = self._one_step(task, bubble.step, calls, bubble, size)
        end_ns = self.reader.now_ns()
        self._note_size_time(size, done, end_ns - start_ns)
        observed_end_ns = self._observed_end_ns(bubble, self.reader.latest())
        overrun_ns = max(0, end_ns - observed_end_ns) if observed_end_ns is not None else 0
        self._record_step(
            bubble.step, start_ns, end_ns, progress, overrun_ns, done,
            sample=size == self._top_size,
        )  # fmt: skip
        if task.is_finished():
            self._apply(SideTaskEvent.FINISH, f"progress {task.progress:g} {task.unit}")
            return False
        return True

    def _trickle_due(self) -> bool:
        """Gating "trickle": whether a group of steps between bubbles may start now."""
        return (
            self._trickle_duty > 0
            and not self._profiling_in_bubbles
            and self.reader.now_ns() >= self._trickle_next_ns
        )

    def _run_trickle(self) -> None:
        """Gating "trickle": one group of steps through training's compute ([Note: trickle])."""
        task = self.task
        assert isinstance(task, IterativeSideTask)
        duty = self._trickle_duty
        start_edge = self.reader.latest()
        now_ns = self.reader.now_ns()
        if (
            start_edge is None
            or start_edge.in_bubble
            or now_ns - start_edge.start_ns > _TRICKLE_STALE_NS
        ):
            self._end_trickle()
            self._trickle_next_ns = now_ns + _TRICKLE_GROUP_NS  # look again later
            return
        if self.machine.state is SideTaskState.PAUSED and not self._apply(SideTaskEvent.START):
            return
        times = self._recent_step_ns
        calls = 1
        if len(times) >= 3:
            group_ns = max(self.step_group_ns, _TRICKLE_GROUP_NS)
            calls = max(1, int(group_ns // max(statistics.median(times), 1.0)))
        progress, done, start_ns = self._one_step(task, start_edge.step, calls, start_edge)
        end_ns = self.reader.now_ns()
        self._note_size_time(1, done, end_ns - start_ns)
        end_edge = self.reader.latest()
        busy_ns = training_busy_ns(start_edge, end_edge, start_ns, end_ns)
        self._record_step(start_edge.step, start_ns, end_ns, progress, busy_ns, done, policy=False)
        self._trickle_next_ns = end_ns + int((end_ns - start_ns) * (1 - duty) / duty)
        if task.is_finished():
            self._apply(SideTaskEvent.FINISH, f"progress {task.progress:g} {task.unit}")

    def _end_trickle(self) -> None:
        """Leave the steps between bubbles (RUNNING -> PAUSED), if in them."""
        if self.machine.state is SideTaskState.RUNNING:
            self._apply(SideTaskEvent.PAUSE)

    def _run_free(self) -> None:
        """Gating "none": step for a short burst whatever training does (naive co-location)."""
        task = self.task
        assert isinstance(task, IterativeSideTask)
        if self.machine.state is SideTaskState.PAUSED and not self._apply(SideTaskEvent.START):
            return
        deadline = time.monotonic() + _FREE_BURST_S
        while self._cmds.empty() and time.monotonic() < deadline:
            start_edge = self.reader.latest()
            step = start_edge.step if start_edge is not None else -1
            size = self._step_sizes(task)[-1]  # its own best pace ([Note: step sizes])
            progress, _, start_ns = self._one_step(task, step, size=size)
            end_ns = self.reader.now_ns()
            end_edge = self.reader.latest()
            step = end_edge.step if end_edge is not None else -1
            busy_ns = training_busy_ns(start_edge, end_edge, start_ns, end_ns)
            self._record_step(
                step, start_ns, end_ns, progress, busy_ns, policy=False,
                sample=size == self._top_size,
            )  # fmt: skip
            if task.is_finished():
                self._apply(SideTaskEvent.FINISH, f"progress {task.progress:g} {task.unit}")
                return
            if self.machine.terminal:
                return

    def _one_step(
        self,
        task: IterativeSideTask,
        step: int,
        calls: int = 1,
        bubble: Edge | None = None,
        size: int = 1,
    ) -> tuple[float, int, int]:
        """Run ``step()`` (``step(size)`` for a size above 1) ``calls`` times (fewer if
        ``bubble`` is seen to end or the task finishes), then until its GPU work is done,
        marked in the beacon from this thread (a step that never returns leaves the mark for
        the worker's watchdog); the progress, the number of calls made and when the first call
        was made (run clock: the step's start, after every decision that led to it). Each
        call's progress is added to ``task.progress`` as it returns, so ``is_finished()`` sees
        it."""
        self._where = "step"
        if self.beacon is not None:
            budget_ns = self._guard_ns(size) * calls
            self.beacon.step_started(step, budget_ns, first=self._steps_started == 0)
        self._steps_started += 1
        progress, done = 0.0, 0
        start_ns = self.reader.now_ns()
        try:
            while True:
                made = float(_call_step(task, size) or 0.0)
                task.progress += made
                progress += made
                done += 1
                if done >= calls or task.is_finished():
                    break
                if bubble is not None and _has_ended(bubble, self.reader.latest()):
                    break  # launch no more
            self._announce_held()  # the kernels are queued: tell while the device works
            _wait_for_device(task)
        finally:
            if self.beacon is not None:
                self.beacon.busy()
        return progress, done, start_ns


def step_sizes(task: IterativeSideTask) -> tuple[int, ...]:
    """``task.step_sizes``, checked: ascending whole numbers from 1.

    Raises:
        ValueError: anything else (the message names the task and what it gave).
    """
    sizes = task.step_sizes
    if (
        not isinstance(sizes, tuple)
        or not sizes
        or any(isinstance(n, bool) or not isinstance(n, int) for n in sizes)
        or sizes[0] != 1
        or any(b <= a for a, b in itertools.pairwise(sizes))
    ):
        raise ValueError(
            f"{type(task).__name__}.step_sizes={sizes!r} must be a tuple of ascending whole "
            "numbers starting at 1"
        )
    return sizes


def _call_step(task: IterativeSideTask, size: int) -> float | None:
    """``task.step()``, or ``task.step(size)`` for a size above 1 ([Note: step sizes])."""
    if size == 1:
        return task.step()
    step: Any = task.step  # a task with sizes takes one (``IterativeSideTask.step``)
    return step(size)  # type: ignore[no-any-return]


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
