"""``TimedPipelineStage``: a ``PipelineStage`` that times every F, B, I and W it runs.

Every schedule class of ``torch.distributed.pipelining`` computes through exactly three stage
methods: ``forward_one_chunk`` (F), ``backward_one_chunk`` (B, or I when ``full_backward`` is
false) and ``backward_weight_one_chunk`` (W). The subclass overrides those three, passes every
argument through untouched and reports each call's start and end to an ``ActionRecorder``.
A rank's stages (several for interleaved and V schedules) share one recorder, so the recorder
sees the rank's whole timeline and knows when the rank is idle: from the end of one compute
action to the start of the next. It can announce those bubbles live to an ``edges`` object.

[Note: CUDA event timing]
On CUDA the host returns from a stage call once the kernels are *launched*, so host clocks
measure launches, not execution. The recorder records a timing-enabled CUDA event before and
after each call (a few microseconds, never a wait) through the rank's ``StepClock``, which
turns a step's events into run-clock times only once they have completed, after later work is
queued: nothing on the training path waits for the device (one re-anchoring synchronisation
every 30 s aside; ``pipeline.step_clock`` [Note: anchoring CUDA events to the host clock]).
``finish_step`` therefore hands out the steps that are ready, usually the previous one.
Live bubble edges on CUDA come from a watcher thread that waits for each event with
``synchronize()`` on a blocking-sync event: the wait releases the GIL and sleeps, instead of
polling ``query()`` with the GIL held. The edge is stamped with the host clock when the thread
wakes (so it lags by the wake-up and by the main thread holding the GIL; the resolved spans are
exact).

[Note: bubble slots]
Within one step, slot k of a rank is the k-th idle gap in time order: slot 0 runs from the
window start (``begin_step``) to the rank's first action, slot k from the end of action k-1 to
the start of action k, and the last slot from the last action's end to ``end_window``. A rank
runs the same number of actions every step, so slot k means the same gap in every step, which
is what the predictor needs.

[Note: quiet slots]
Most gaps between a rank's actions are far too short for a side task: microseconds between an
F and the next B in the steady state. Announcing each one costs the training process a
wake-up, and on CUDA a watcher thread that must take the GIL from the main thread per edge, so
the recorder announces only the slots whose predicted length reaches ``announce_min_ns``; the
others stay quiet (recorded, never announced). The predictor learns every slot's length from
the step's resolved stamps, so a quiet slot that grows becomes announced one or two steps
later; a slot never seen before has no prediction and stays quiet until it has one.

Between two steps the rank runs its optimizer and then usually waits: for the step-boundary
collectives (the stop agreement, a loss all-reduce) and then for its first input. On the last
stage of 1F1B that wait is most of the drain bubble ((S-1)·B) plus the fill bubble ((S-1)·F):
one idle span that FreeRide treats as one bubble. ``carry_gap(step + 1)``, called after the
optimizer, opens the next step's slot 0 at once, and ``begin_step`` keeps it open, so slot 0
runs from the optimizer's end to the first action and a side task sees the whole span with
one prediction instead of missing the part outside the schedule window. The bubbles table
(``core.bubble_spans`` [Note: step boundary bubbles]) holds the same span as step s's "boundary"
bubble up to step s+1's window start plus step s+1's leading bubble: nothing counted twice.

[Note: loss in the forward]
Torch computes the last stage's loss right after ``forward_one_chunk`` returns, as part of the
same forward action (``_maybe_compute_loss`` in every schedule's F branch), outside the three
stage methods. Timed naively, the loss would sit in the gap after F: compute recorded as idle
time, and a bubble announced while the rank still computes. So the loss is folded into the
forward, as torch does: the runner wraps its loss function with ``ActionRecorder.timed_loss``,
the last stage's ``forward_one_chunk`` holds its F open (``stop(token, loss_follows=True)``),
and the loss ends it; the bubble after F opens only then. A held F that no loss follows (no
loss function, or the schedule skips it) ends at its own end when the next thing happens.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.pipelining import PipelineStage

from freeride_lab.core.bubble_prediction import Predictor
from freeride_lab.core.peer_prediction import AwaitedPeerPredictor
from freeride_lab.core.schedule import ActionKind
from freeride_lab.core.torch_compat import is_full_backward
from freeride_lab.io.peer_board import AwaitedPeers
from freeride_lab.pipeline.bubble_edges import (
    BubbleEdges,
    EdgeRecord,
    _CudaEdgeWatcher,
    _EdgeTracker,
)
from freeride_lab.pipeline.step_clock import StepClock

log = logging.getLogger(__name__)

ANNOUNCE_MIN_MS = 1.0
"""A rank's default ``announce_min_ns`` in ms: shorter predicted bubbles stay quiet."""

__all__ = [
    "ANNOUNCE_MIN_MS",
    "ActionRecorder",
    "ActionSpan",
    "BubbleEdges",
    "EdgeRecord",
    "SettledStage",
    "StepRecord",
    "TimedPipelineStage",
]


@dataclass(frozen=True, slots=True)
class ActionSpan:
    """One timed compute action on the run clock (ns)."""

    stage: int
    kind: ActionKind
    microbatch: int
    start_ns: int
    end_ns: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind.value}{self.microbatch}"


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What a rank recorded in one step: its actions in start order and named marks (ns).

    Marks: ``window_start``, ``window_end`` and whatever the caller ``mark``-ed (the rank marks
    ``optimizer_start`` and ``optimizer_end``).
    """

    step: int
    spans: list[ActionSpan]
    marks: dict[str, int]


class ActionRecorder:
    """Per-rank timeline of compute actions, shared by the rank's ``TimedPipelineStage``s.

    Call ``begin_step`` before ``schedule.step``, ``end_window`` after it, ``mark`` around the
    optimizer and ``finish_step`` to collect the ``StepRecord``; give the schedule
    ``timed_loss(loss_fn)`` as its loss (see [Note: loss in the forward]). Times are on the
    run clock: ``time.time_ns() + clock_offset_ns``.

    Args:
        device: the stages' device; CUDA turns on event timing (see [Note: CUDA event timing]).
        edges: receives live bubble edges (see [Note: bubble slots]); None turns them off.
        predictor: predicts each slot's length for ``bubble_start``; used only with ``edges``.
            It learns each slot's length from the step's resolved stamps (exact on CUDA too),
            on the calling thread.
        clock: the rank's ``StepClock`` (shared with its untimed steps); made here if None.
        announce_min_ns: announce only the slots predicted to last at least this long (see
            [Note: quiet slots]); 0 announces every slot, predicted or not.
        peers: the run's action boards ([Note: awaited peer] in ``core.peer_prediction``):
            the recorder publishes each action's start and expected end (the lower median of
            its last 16 of that stage and kind), and opens each bubble with the end its
            awaited peer published, for an ``AwaitedPeerPredictor``. Host clocks only: a CUDA
            rank's host sees its launches, not their starts.
    """

    def __init__(
        self,
        *,
        device: torch.device | str = "cpu",
        clock_offset_ns: int = 0,
        edges: BubbleEdges | None = None,
        predictor: Predictor | None = None,
        clock: StepClock | None = None,
        announce_min_ns: int = 0,
        peers: AwaitedPeers | None = None,
    ) -> None:
        self.device = torch.device(device)
        self.is_cuda = self.device.type == "cuda"
        if peers is not None and self.is_cuda:
            raise ValueError(
                "peers need host-clock stamps, and a CUDA rank's host sees its launches, not "
                "their starts; pass peers=None on CUDA"
            )
        self._peers = peers
        self._order: list[tuple[ActionKind, int, int]] = []  # the last step's actions, in order
        self._durations: dict[tuple[int, ActionKind], deque[int]] = {}  # (stage, kind) -> ns
        self._expected: dict[tuple[int, ActionKind], int] = {}  # their medians
        self.clock_offset_ns = clock_offset_ns
        self.announce_min_ns = announce_min_ns
        self.step = -1
        self._tracker = _EdgeTracker(edges) if edges is not None else None
        self._predictor = predictor if edges is not None else None
        by_peer = self._predictor  # the predictor that takes a peer's end, if it is one
        self._by_peer = by_peer if isinstance(by_peer, AwaitedPeerPredictor) else None
        watched = self._tracker is not None and self.is_cuda
        self.clock = clock or StepClock(self.device, clock_offset_ns, blocking=watched)
        if watched:  # the watcher sleeps on its events; they are held until it is done
            self.clock.blocking = True
        self._watcher = (
            _CudaEdgeWatcher(self._tracker, clock_offset_ns, self.clock.release)
            if self._tracker is not None and watched
            else None
        )
        self._slot = 0
        # the open slot, its start, whether announced, its awaited peer's published end
        self._gap: tuple[int, Any, bool, int | None] | None = None
        # closed this step: slot, start, end, and the awaited peer's end, read at the open or,
        # where it was not published yet, at the close (the slot's hand-over is learnt from it)
        self._gaps: list[tuple[int, Any, Any, int | None]] = []
        self._times_loss = False  # ``timed_loss`` was called: the last stage's F holds for it
        self._held: tuple[tuple[ActionKind, int, int, Any], Any] | None = None  # (token, end)
        self._spans: list[tuple[ActionKind, int, int, Any, Any]] = []
        self._marks: dict[str, Any] = {}
        self._last: Any = None  # the latest stamp: once it completes, the step can be read

    def __repr__(self) -> str:
        return (
            f"ActionRecorder(device={str(self.device)!r}, step={self.step}, "
            f"edges={'on' if self._tracker else 'off'})"
        )

    @property
    def edge_errors(self) -> int:
        """Exceptions raised by ``edges`` or the predictor (swallowed)."""
        return self._tracker.errors if self._tracker is not None else 0

    def now_ns(self) -> int:
        """The run clock now (host)."""
        return time.time_ns() + self.clock_offset_ns

    # -- step boundaries -------------------------------------------------------------------

    def begin_step(self, step: int) -> None:
        """Start step ``step``'s window (and open bubble slot 0)."""
        self.step = step
        self._spans = []
        self._marks = {}
        self._slot = 0
        self._held = None
        self._marks["window_start"] = self._last = self.clock.begin_step()
        if self._gap is None:  # else slot 0 was opened by ``carry_gap`` and goes on
            self._open_gap(self._marks["window_start"])

    def carry_gap(self, next_step: int) -> None:
        """Open step ``next_step``'s slot 0 now, after this step's optimizer: the rank idles
        until its next action (see [Note: bubble slots]). No-op without edges."""
        if self._tracker is None or self._gap is not None:
            return
        self._open_gap(self._stamp(), step=next_step, slot=0)

    def close_gap(self) -> None:
        """Close an open bubble now (the rank stops training, or runs an untimed step, with a
        carried gap open). Such a gap is announced but not learned from: its stamps belong to
        no timed step."""
        self._close_gap(self._stamp(), learn=False)

    def end_window(self) -> None:
        """End the schedule window (``schedule.step`` returned) and close the last bubble."""
        self._release()
        self.mark("window_end")
        self._close_gap(self._marks["window_end"])

    def mark(self, name: str) -> None:
        """Stamp a named moment of this step (a CUDA event on CUDA)."""
        self._marks[name] = self._stamp()

    def finish_step(self) -> list[StepRecord]:
        """End the step; returns the steps whose records are ready, oldest first.

        On CPU that is this step. On CUDA it is the steps whose events have completed, usually
        the previous one; nothing waits for the device (``flush`` at the end does).
        """
        step, spans, marks, gaps = self.step, self._spans, self._marks, self._gaps
        self._spans, self._marks, self._gaps = [], {}, []
        if self._peers is not None and spans:
            self._order = [(kind, stage, mb) for kind, stage, mb, _, _ in spans]

        def build(resolve: Callable[[Any], int]) -> StepRecord:
            if gaps:
                self._observe(gaps, resolve)
            if self._peers is not None:
                self._learn_durations(spans, resolve)
            return StepRecord(
                step,
                [
                    ActionSpan(stage, kind, mb, resolve(start), resolve(end))
                    for kind, stage, mb, start, end in spans
                ],
                {name: resolve(stamp) for name, stamp in marks.items()},
            )

        self.clock.defer(self._last, build)
        return self.clock.ready()

    def flush(self) -> list[StepRecord]:
        """Every step not yet handed out (waits for the device on CUDA)."""
        return self.clock.flush()

    def drain_edges(self) -> list[EdgeRecord]:
        """Bubble edges announced since the last drain (empty when edges are off)."""
        if self._tracker is None:
            return []
        out: list[EdgeRecord] = []
        records = self._tracker.records
        while records:
            out.append(records.popleft())
        return out

    def close(self) -> None:
        """Stop the CUDA edge watcher, if any, and unmap the peers' boards. Idempotent."""
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
        if self._peers is not None:
            self._peers.close()

    # -- actions (hot path) ----------------------------------------------------------------

    def start(
        self, kind: ActionKind, stage: int, microbatch: int
    ) -> tuple[ActionKind, int, int, Any]:
        """A compute action begins; returns the token to pass to ``stop``."""
        self._release()
        stamp = self._stamp()
        self._close_gap(stamp)
        if self._peers is not None:
            self._publish(kind, stage, microbatch, stamp)
        return (kind, stage, microbatch, stamp)

    def stop(self, token: tuple[ActionKind, int, int, Any], *, loss_follows: bool = False) -> None:
        """The action of ``token`` ended; the rank is idle until the next ``start``.

        ``loss_follows``: the last stage's forward, whose loss torch computes next; with a
        ``timed_loss`` installed the action stays open until that loss returns (see
        [Note: loss in the forward]).
        """
        stamp = self._stamp()
        if loss_follows and self._times_loss:
            self._release()
            self._held = (token, stamp)
            return
        self._end(token, stamp)

    def timed_loss(self, loss_fn: Callable[..., Any]) -> Callable[..., Any]:
        """``loss_fn`` wrapped so that its time is part of the last stage's forward (pass the
        wrapper as the schedule's ``loss_fn``; see [Note: loss in the forward])."""
        self._times_loss = True

        def loss(*args: Any, **kwargs: Any) -> Any:
            try:
                return loss_fn(*args, **kwargs)
            finally:
                held, self._held = self._held, None
                if held is not None:
                    self._end(held[0], self._stamp())

        return loss

    # -- internals -------------------------------------------------------------------------

    def _observe(
        self, gaps: list[tuple[int, Any, Any, int | None]], resolve: Callable[[Any], int]
    ) -> None:
        """Teach the predictor the step's slot lengths, from resolved stamps, and where a
        bubble was opened with its awaited peer's end, how far it ended from that."""
        predictor, tracker = self._predictor, self._tracker
        if predictor is None or tracker is None:
            return
        by_peer = self._by_peer
        try:
            for slot, start, end, peer_end in gaps:
                predictor.observe(slot, max(0, resolve(end) - resolve(start)))
                if peer_end is not None and by_peer is not None:
                    by_peer.observe_peer(slot, resolve(end), peer_end)
        except Exception:
            tracker.error("predictor")

    def _predict(self, slot: int, start: Any, peer_end: int | None) -> int | None:
        if self._predictor is None or self._tracker is None:
            return None
        try:
            if peer_end is not None and self._by_peer is not None:
                return self._by_peer.predict_from_peer(slot, start, peer_end)
            return self._predictor.predict(slot)
        except Exception:
            self._tracker.error("predictor")
            return None

    def _publish(self, kind: ActionKind, stage: int, microbatch: int, start_ns: int) -> None:
        """Publish an action's start with its expected end, once the rank has timed one
        like it ([Note: awaited peer])."""
        assert self._peers is not None
        expected = self._expected.get((stage, kind))
        if expected is not None:
            self._peers.publish(self.step, stage, kind, microbatch, start_ns, start_ns + expected)

    def _awaited_end(self, step: int, slot: int) -> int | None:
        """The end the peer that slot ``slot``'s next action waits for published, if any."""
        if self._peers is None or slot >= len(self._order):
            return None
        kind, stage, microbatch = self._order[slot]
        try:
            return self._peers.awaited_end(step, stage, kind, microbatch)
        except Exception:
            if self._tracker is not None:
                self._tracker.error("peers")
            return None

    def _say_awaited(self, step: int, slot: int) -> None:
        """The bubble opened before its awaited peer began the action it waits for: name
        that action on the rank's board, with the slot's hand-over, for the side task that
        takes the bubble ([Note: told mid-bubble] in ``sidetasks.host.iterative``)."""
        by_peer = self._by_peer
        if self._peers is None or by_peer is None or slot >= len(self._order):
            return
        kind, stage, microbatch = self._order[slot]
        try:
            ns = by_peer.hand_over(slot)
            if ns is not None:
                self._peers.awaiting(step, slot, stage, kind, microbatch, ns)
        except Exception:
            if self._tracker is not None:
                self._tracker.error("peers")

    def _learn_durations(
        self, spans: list[tuple[ActionKind, int, int, Any, Any]], resolve: Callable[[Any], int]
    ) -> None:
        for kind, stage, _, start, end in spans:
            past = self._durations.get((stage, kind))
            if past is None:
                past = self._durations[(stage, kind)] = deque(maxlen=16)
            past.append(max(0, resolve(end) - resolve(start)))
        for key, past in self._durations.items():
            self._expected[key] = sorted(past)[(len(past) - 1) // 2]  # the lower median

    def _end(self, token: tuple[ActionKind, int, int, Any], stamp: Any) -> None:
        kind, stage, microbatch, start = token
        self._spans.append((kind, stage, microbatch, start, stamp))
        self._open_gap(stamp)

    def _release(self) -> None:
        """End a held forward at its own end: no loss followed it."""
        held, self._held = self._held, None
        if held is not None:
            self._end(*held)

    def _stamp(self) -> Any:
        self._last = stamp = self.clock.stamp()
        return stamp

    def _open_gap(self, stamp: Any, *, step: int | None = None, slot: int | None = None) -> None:
        if self._tracker is None:
            return
        step = self.step if step is None else step
        slot = self._slot if slot is None else slot
        peer_end = self._awaited_end(step, slot)
        duration = self._predict(slot, stamp, peer_end)
        announce = self.announce_min_ns <= 0 or (
            duration is not None and duration >= self.announce_min_ns
        )
        self._gap = (slot, stamp, announce, peer_end)
        if not announce:
            return
        if self._peers is not None and peer_end is None:
            self._say_awaited(step, slot)  # before the edge: its side task may look for it
        if self._watcher is not None:
            self.clock.hold(stamp)
            self._watcher.push("start", step, slot, stamp, duration)
        else:
            self._tracker.open(step, slot, stamp, duration)

    def _close_gap(self, stamp: Any, *, learn: bool = True) -> None:
        gap, self._gap = self._gap, None
        if self._tracker is None or gap is None:
            return
        self._slot += 1
        slot, start, announced, peer_end = gap
        if announced and self._watcher is not None:
            self.clock.hold(stamp)
            self._watcher.push("end", self.step, slot, stamp)
        elif announced:
            self._tracker.close(stamp)
        if learn:
            if peer_end is None and self._peers is not None:  # after the end edge, not before
                peer_end = self._awaited_end(self.step, slot)  # published since it opened
            self._gaps.append((slot, start, stamp, peer_end))


class SettledStage(PipelineStage):
    """``PipelineStage`` whose W returns only once ``settle()`` has (None: a plain stage).

    [Note: settled W]
    In emulate mode a stage's chunk computes on the GPU while the pipeline's tensors and
    clocks stay on the host. F ends when its output has been copied back (the copy waits for
    the device) and B in the chunk's own synchronise (``pipeline.emulate_chunks``), so on the
    host clock both end when their kernels end. torch's W (``stage_backward_weight``) only
    launches the weights' gradients and returns: timed on the host it would end early, and its
    kernels would run on into what the rank records as idle, beside any side task started
    there. ``settle`` (a device synchronise on a rank that computes for real) closes it, as the
    calibration closes the W the sleeping peers replay. Timed and plain stages both take it, so
    comparing the two still compares the recorder alone.
    """

    def __init__(self, *args: Any, settle: Callable[[], None] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.settle = settle

    def backward_weight_one_chunk(self, bwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        result = super().backward_weight_one_chunk(bwd_chunk_id, *args, **kwargs)
        if self.settle is not None:
            self.settle()
        return result


class TimedPipelineStage(SettledStage):
    """``PipelineStage`` that reports each F, B/I and W call to a shared ``ActionRecorder``.

    Takes ``PipelineStage``'s arguments unchanged plus the keywords ``recorder`` and
    ``settle`` (``SettledStage``: its W is timed up to the end of ``settle``).
    """

    def __init__(self, *args: Any, recorder: ActionRecorder, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.recorder = recorder

    def forward_one_chunk(self, fwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        token = self.recorder.start(ActionKind.FORWARD, self.stage_index, fwd_chunk_id)
        try:
            return super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)
        finally:  # the last stage's loss comes next and is part of this F
            self.recorder.stop(token, loss_follows=self.is_last)

    def backward_one_chunk(self, bwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        full = is_full_backward(args, kwargs)  # positional in torch: core.torch_compat
        kind = ActionKind.BACKWARD if full else ActionKind.BACKWARD_INPUT
        token = self.recorder.start(kind, self.stage_index, bwd_chunk_id)
        try:
            return super().backward_one_chunk(bwd_chunk_id, *args, **kwargs)
        finally:
            self.recorder.stop(token)

    def backward_weight_one_chunk(self, bwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        token = self.recorder.start(ActionKind.BACKWARD_WEIGHT, self.stage_index, bwd_chunk_id)
        try:
            return super().backward_weight_one_chunk(bwd_chunk_id, *args, **kwargs)
        finally:
            self.recorder.stop(token)
