"""Claims about action timing, live bubble edges and the sleep-timed synthetic stages.

The in-process tests run real torch schedules on a one-rank gloo group: multi-stage schedules
put both stage chunks on rank 0, which exercises F, B, I and W without extra processes.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from statistics import median
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from edge_receivers import RecordingEdges
from torch.distributed.pipelining import schedules as torch_schedules

from freeride_lab.core.schedule import ActionKind
from freeride_lab.pipeline.stage_build import make_stage
from freeride_lab.pipeline.synthetic import SleepStage, build_sleep_chunks
from freeride_lab.pipeline.timed_stage import (
    ActionRecorder,
    SettledStage,
    StepRecord,
    TimedPipelineStage,
    _CudaEdgeWatcher,
    _EdgeTracker,
)


class StandInPredictor:
    """The ``SlotPredictor`` interface: last observed duration per slot."""

    def __init__(self) -> None:
        self.seen: dict[int, int] = {}

    def observe(self, slot: int, duration_ns: int) -> None:
        self.seen[slot] = duration_ns

    def predict(self, slot: int) -> int | None:
        return self.seen.get(slot)


class BrokenEdges:
    def bubble_start(self, step: int, slot: int, t_ns: int, predicted_end_ns: int | None) -> None:
        raise OSError("shared memory gone")

    def bubble_end(self, step: int, slot: int, t_ns: int) -> None:
        raise OSError("shared memory gone")


def run_fake_step(rec: ActionRecorder, step: int) -> StepRecord:
    rec.begin_step(step)
    for kind, mb in ((ActionKind.FORWARD, 0), (ActionKind.BACKWARD, 0)):
        token = rec.start(kind, 1, mb)
        rec.stop(token)
    rec.end_window()
    rec.mark("optimizer_start")
    rec.mark("optimizer_end")
    [record] = rec.finish_step()  # on CPU a step's record is ready at once
    return record


def test_recorder_keeps_actions_in_order_inside_the_window() -> None:
    record = run_fake_step(ActionRecorder(clock_offset_ns=1_000), 3)
    assert [str(s) for s in record.spans] == ["1F0", "1B0"]
    assert record.step == 3
    m = record.marks
    assert m["window_start"] <= record.spans[0].start_ns <= record.spans[0].end_ns
    assert record.spans[-1].end_ns <= m["window_end"] <= m["optimizer_start"] <= m["optimizer_end"]


def test_recorder_applies_the_clock_offset() -> None:
    before = time.time_ns()
    record = run_fake_step(ActionRecorder(clock_offset_ns=10**12), 0)
    assert record.marks["window_start"] >= before + 10**12


def test_edges_open_and_close_every_gap_of_a_step_in_slot_order() -> None:
    edges = RecordingEdges()
    run_fake_step(ActionRecorder(edges=edges), 0)
    assert [(c[0], c[2]) for c in edges.calls] == [
        ("start", 0),
        ("end", 0),
        ("start", 1),
        ("end", 1),
        ("start", 2),
        ("end", 2),
    ]
    times = [c[3] for c in edges.calls]
    assert times == sorted(times)


def test_bubble_start_predicts_from_the_same_slot_of_earlier_steps() -> None:
    edges = RecordingEdges()
    rec = ActionRecorder(edges=edges, predictor=StandInPredictor())
    run_fake_step(rec, 0)
    assert all(c[4] is None for c in edges.calls if c[0] == "start")
    first = {c[2]: c for c in edges.calls}
    edges.calls.clear()
    run_fake_step(rec, 1)
    starts = [c for c in edges.calls if c[0] == "start"]
    assert all(c[4] is not None and c[4] >= c[3] for c in starts)
    assert {c[2] for c in starts} == set(first)
    assert [(e.step, e.slot, e.edge) for e in rec.drain_edges()][:2] == [
        (0, 0, "start"),
        (0, 0, "end"),
    ]


def test_a_carried_gap_is_the_next_steps_slot_0_from_the_optimizer_to_its_first_action() -> None:
    edges = RecordingEdges()
    rec = ActionRecorder(edges=edges, predictor=StandInPredictor())
    first = run_fake_step(rec, 0)
    rec.carry_gap(1)
    time.sleep(0.02)  # the step-boundary wait: collectives, then the first input
    second = run_fake_step(rec, 1)
    rec.carry_gap(2)
    run_fake_step(rec, 2)
    rec.close_gap()  # nothing is open after a step's last slot: no edge
    assert edges.calls[-1][:3] == ("end", 2, 2)
    step1 = [c for c in edges.calls if c[1] == 1]
    assert [(c[0], c[2]) for c in step1] == [(e, k) for k in range(3) for e in ("start", "end")]
    start, end = step1[0][3], step1[1][3]
    assert first.marks["optimizer_end"] <= start < second.marks["window_start"]
    assert end == second.spans[0].start_ns and end - start >= 20_000_000
    # step 2's slot 0 is predicted from step 1's whole boundary gap
    step2_start = next(c for c in edges.calls if c[:3] == ("start", 2, 0))
    assert step2_start[4] - step2_start[3] == end - start
    rec.carry_gap(3)  # training stops with a carried gap open: close_gap ends it
    rec.close_gap()
    assert edges.calls[-2][:3] == ("start", 3, 0) and edges.calls[-1][:3] == ("end", 3, 0)


def run_step_with_one_long_gap(rec: ActionRecorder, step: int) -> None:
    """F, 20 ms idle, B: slot 1 is long, slots 0 and 2 last microseconds."""
    rec.begin_step(step)
    rec.stop(rec.start(ActionKind.FORWARD, 1, 0))
    time.sleep(0.02)
    rec.stop(rec.start(ActionKind.BACKWARD, 1, 0))
    rec.end_window()
    rec.finish_step()


def test_only_slots_predicted_long_enough_are_announced_and_all_are_learned() -> None:
    edges = RecordingEdges()
    predictor = StandInPredictor()
    rec = ActionRecorder(edges=edges, predictor=predictor, announce_min_ns=10_000_000)
    run_step_with_one_long_gap(rec, 0)
    assert edges.calls == []  # nothing predicted yet: every slot stays quiet
    assert set(predictor.seen) == {0, 1, 2} and predictor.seen[1] >= 20_000_000
    run_step_with_one_long_gap(rec, 1)
    assert [(c[0], c[1], c[2]) for c in edges.calls] == [("start", 1, 1), ("end", 1, 1)]
    start = edges.calls[0]
    assert start[4] - start[3] >= 20_000_000  # predicted from step 0's slot 1
    assert [(e.step, e.slot, e.edge) for e in rec.drain_edges()] == [(1, 1, "start"), (1, 1, "end")]


def test_announce_min_0_announces_every_slot_even_unpredicted() -> None:
    edges = RecordingEdges()
    rec = ActionRecorder(edges=edges, predictor=StandInPredictor(), announce_min_ns=0)
    run_step_with_one_long_gap(rec, 0)
    assert [(c[0], c[2]) for c in edges.calls] == [
        (e, k) for k in range(3) for e in ("start", "end")
    ]


def test_a_timed_loss_ends_the_held_forward_and_only_then_opens_the_bubble() -> None:
    edges = RecordingEdges()
    rec = ActionRecorder(edges=edges)
    loss = rec.timed_loss(lambda: time.sleep(0.02))
    rec.begin_step(0)
    token = rec.start(ActionKind.FORWARD, 1, 0)
    rec.stop(token, loss_follows=True)  # the last stage's F: torch computes the loss next
    assert [c[0] for c in edges.calls] == ["start", "end"]  # no bubble while the loss runs
    loss()
    rec.stop(rec.start(ActionKind.BACKWARD, 1, 0))
    rec.end_window()
    forward = rec.finish_step()[0].spans[0]
    assert forward.end_ns - forward.start_ns >= 20_000_000
    assert edges.calls[2][:3] == ("start", 0, 1) and edges.calls[2][3] == forward.end_ns


def test_a_held_forward_that_no_loss_follows_ends_at_its_own_end() -> None:
    rec = ActionRecorder()
    rec.timed_loss(lambda: None)
    rec.begin_step(0)
    token = rec.start(ActionKind.FORWARD, 1, 0)
    rec.stop(token, loss_follows=True)
    stopped = time.time_ns()
    time.sleep(0.02)  # idle, not loss: the F must not grow
    rec.stop(rec.start(ActionKind.BACKWARD, 1, 0))
    rec.end_window()
    spans = rec.finish_step()[0].spans
    assert [str(s) for s in spans] == ["1F0", "1B0"]
    assert spans[0].end_ns <= stopped < spans[1].start_ns - 15_000_000


def test_failing_edges_never_raise_into_training() -> None:
    rec = ActionRecorder(edges=BrokenEdges())
    record = run_fake_step(rec, 0)
    assert len(record.spans) == 2
    assert rec.edge_errors == 6


class FakeEvent:
    def __init__(self) -> None:
        self.done = threading.Event()

    def query(self) -> bool:
        return self.done.is_set()

    def synchronize(self) -> None:
        self.done.wait()


def test_cuda_edge_watcher_announces_an_edge_only_once_its_event_completes() -> None:
    edges = RecordingEdges()
    tracker = _EdgeTracker(edges)
    watcher = _CudaEdgeWatcher(tracker, clock_offset_ns=0)
    try:
        start, end = FakeEvent(), FakeEvent()
        watcher.push("start", 4, 0, start)
        watcher.push("end", 4, 0, end)
        time.sleep(0.05)
        assert edges.calls == []
        start.done.set()
        deadline = time.monotonic() + 5
        while len(edges.calls) < 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert [c[0] for c in edges.calls] == ["start"]
        end.done.set()
        while len(edges.calls) < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert [(c[0], c[1], c[2]) for c in edges.calls] == [("start", 4, 0), ("end", 4, 0)]
    finally:
        watcher.close()


def test_sleep_stage_rejects_negative_costs() -> None:
    with pytest.raises(ValueError, match="input_grad_s=-1"):
        SleepStage(4, forward_s=0, input_grad_s=-1, weight_grad_s=0)


# -- real schedules on a one-rank group --------------------------------------------------

T_F, T_I, T_W = 10.0, 20.0, 40.0  # ms per micro-batch per rank; 2 chunks → half each


TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])


@pytest.fixture(scope="module")
def one_rank_group() -> Iterator[None]:
    if TORCH < (2, 13):  # see rank.py [Note: adjacent stages on one rank]
        pytest.skip(
            f"torch {torch.__version__} < 2.13 cannot run two adjacent stages on one gloo rank"
        )
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this test process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def run_schedule(
    name: str,
    steps: int = 3,
    *,
    loss_s: float = 0.0,
    rec: ActionRecorder | None = None,
    settle: Callable[[], None] | None = None,
) -> list[StepRecord]:
    rec = rec or ActionRecorder()
    chunks = build_sleep_chunks(4, [(T_F / 2, T_I / 2, T_W / 2)] * 2)
    example = torch.empty(2, 3, 4, requires_grad=True)  # (mb, T, D)
    stages = [
        TimedPipelineStage(
            m,
            i,
            2,
            torch.device("cpu"),
            input_args=(example,),
            output_args=(example,),
            recorder=rec,
            settle=settle,
        )
        for i, m in enumerate(chunks)
    ]

    def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        time.sleep(loss_s)
        return F.mse_loss(output, target)

    schedule = getattr(torch_schedules, name)(
        stages, n_microbatches=2, loss_fn=rec.timed_loss(loss_fn)
    )
    records = []
    for step in range(steps):
        rec.begin_step(step)
        schedule.step(torch.randn(4, 3, 4), target=torch.zeros(4, 3, 4))
        rec.end_window()
        records.extend(rec.finish_step())
    return records


def medians_ms(records: list[StepRecord], stage: int) -> dict[str, float]:
    out: dict[str, list[float]] = {}
    for r in records[1:]:
        for s in r.spans:
            if s.stage == stage:
                out.setdefault(s.kind.value, []).append((s.end_ns - s.start_ns) / 1e6)
    return {k: median(v) for k, v in out.items()}


def test_zero_bubble_input_and_weight_halves_take_their_own_sleeps(one_rank_group: None) -> None:
    got = medians_ms(run_schedule("ScheduleZBVZeroBubble"), stage=1)
    assert set(got) == {"F", "I", "W"}
    for kind, want in (("F", T_F / 2), ("I", T_I / 2), ("W", T_W / 2)):
        assert want * 0.95 <= got[kind] <= want + 8, f"{kind}: {got[kind]:.1f} ms vs {want}"


def test_first_stage_input_backward_is_empty_and_its_weight_backward_is_full(
    one_rank_group: None,
) -> None:
    # torch skips I on the first stage and runs the full backward inside W
    got = medians_ms(run_schedule("ScheduleZBVZeroBubble"), stage=0)
    assert got["I"] < 2
    want = (T_I + T_W) / 2
    assert want * 0.95 <= got["W"] <= want + 8, f"W {got['W']:.1f} ms vs {want}"


def test_full_backward_is_recorded_as_b_and_costs_both_halves(one_rank_group: None) -> None:
    got = medians_ms(run_schedule("ScheduleInterleaved1F1B"), stage=0)
    assert set(got) == {"F", "B"}
    want = (T_I + T_W) / 2
    assert want * 0.95 <= got["B"] <= want + 8, f"B {got['B']:.1f} ms vs {want}"


LOSS_MS = 30.0


@pytest.mark.parametrize("name", ["ScheduleInterleaved1F1B", "ScheduleZBVZeroBubble"])
def test_the_last_stages_loss_is_timed_inside_its_forward_not_as_a_bubble(
    one_rank_group: None, name: str
) -> None:
    edges = RecordingEdges()
    records = run_schedule(name, 2, loss_s=LOSS_MS / 1e3, rec=ActionRecorder(edges=edges))
    for record in records:
        last = [s for s in record.spans if s.stage == 1 and s.kind is ActionKind.FORWARD]
        first = [s for s in record.spans if s.stage == 0 and s.kind is ActionKind.FORWARD]
        assert len(last) == 2 and len(first) == 2
        for s in last:  # stage 1 is the last stage (2 stages): F costs T_F / 2, plus the loss
            assert (s.end_ns - s.start_ns) / 1e6 >= T_F / 2 * 0.95 + LOSS_MS, str(s)
        for s in first:
            assert (s.end_ns - s.start_ns) / 1e6 < LOSS_MS, str(s)
        spans = sorted(record.spans, key=lambda s: s.start_ns)
        gaps = [(b.start_ns - a.end_ns) / 1e6 for a, b in itertools.pairwise(spans)]
        assert max(gaps) < LOSS_MS / 2, gaps  # no gap holds the loss
    # the live bubble after the last stage's F opens once its loss is done
    starts = {c[3] for c in edges.calls if c[0] == "start"}
    assert all(s.end_ns in starts for r in records for s in r.spans)


class LoggingRecorder(ActionRecorder):
    """An ``ActionRecorder`` that also logs the order of its starts and stops."""

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    def start(self, kind: ActionKind, stage: int, microbatch: int) -> Any:
        self.log.append(f"start {kind.value}")
        return super().start(kind, stage, microbatch)

    def stop(self, token: Any, *, loss_follows: bool = False) -> None:
        self.log.append(f"stop {token[0].value}")
        super().stop(token, loss_follows=loss_follows)


def test_a_settled_w_is_timed_up_to_the_end_of_its_settle(one_rank_group: None) -> None:
    # emulate mode settles a real rank's W with a device synchronise: the W span must hold it
    log: list[str] = []
    run_schedule(
        "ScheduleZBVZeroBubble", 2, rec=LoggingRecorder(log), settle=lambda: log.append("settle")
    )
    settles = [i for i, entry in enumerate(log) if entry == "settle"]
    assert len(settles) == 2 * 2 * 2  # steps x stage chunks x micro-batches: one per W
    for i in settles:
        assert log[i - 1 : i + 2] == ["start W", "settle", "stop W"], log[i - 2 : i + 3]


def test_a_plain_stage_settles_its_w_too(one_rank_group: None) -> None:
    # so that plain and timed blocks of one emulated run differ by the recorder alone
    calls: list[int] = []
    example = torch.empty(2, 3, 4, requires_grad=True)  # (mb, T, D)
    chunks = build_sleep_chunks(4, [(0.0, 0.0, 0.0)] * 2)
    stages = [
        make_stage(m, i, 2, torch.device("cpu"), (example, example), recorder=None,
                   settle=lambda: calls.append(1))
        for i, m in enumerate(chunks)
    ]  # fmt: skip
    assert all(type(s) is SettledStage for s in stages)
    schedule = torch_schedules.ScheduleZBVZeroBubble(stages, n_microbatches=2, loss_fn=F.mse_loss)
    schedule.step(torch.randn(4, 3, 4), target=torch.zeros(4, 3, 4))
    assert len(calls) == 2 * 2
    plain = make_stage(chunks[0], 0, 2, torch.device("cpu"), (example, example), recorder=None)
    assert type(plain).__name__ == "PipelineStage"


def test_a_rank_announces_the_boundary_bubble_before_it_writes_the_steps_events() -> None:
    """The idle from the optimizer's end to the next step is announced at the optimizer's end:
    writing the step's events (a fraction of a millisecond) comes after, not before."""
    from freeride_lab.pipeline.runner import RankRunner
    from freeride_lab.pipeline.step_clock import StepClock

    edges = RecordingEdges()
    rec = ActionRecorder(edges=edges, predictor=StandInPredictor())

    class Schedule:
        def step(self, *args: Any, target: Any = None, losses: Any = None) -> None:
            rec.stop(rec.start(ActionKind.FORWARD, 1, 0))
            rec.stop(rec.start(ActionKind.BACKWARD, 1, 0))

    announced_before_writing: list[bool] = []

    def emit(records: list[StepRecord]) -> list[StepRecord]:
        starts = {c[1:3] for c in edges.calls if c[0] == "start"}
        announced_before_writing.extend((r.step + 1, 0) in starts for r in records)
        time.sleep(0.002)  # the writing takes the host a while
        return records

    runner = object.__new__(RankRunner)
    runner.recorder, runner.step_clock = rec, StepClock("cpu")
    runner._batches, runner.has_first, runner.has_last = None, False, False
    runner._schedules, runner.optimizer, runner.emulation = {True: Schedule()}, None, None
    runner._emit_steps = emit  # type: ignore[method-assign]
    for step in range(3):
        runner.run_step(step, timed=True, carry=step < 2)
    assert announced_before_writing == [True, True, False]  # the last step carries nothing
    rec.close_gap()
    # each boundary bubble opened at its step's optimizer end, not after the writing
    step1 = next(c for c in edges.calls if c[:3] == ("start", 1, 0))
    step1_end = next(c for c in edges.calls if c[:3] == ("end", 1, 0))
    assert step1_end[3] - step1[3] >= 2_000_000  # the writing lies inside the bubble


class _HostClock:
    """Stands in for the ``time`` module of ``pipeline.step_clock``: a host clock the test
    moves."""

    def __init__(self) -> None:
        self.now = 10**15

    def time_ns(self) -> int:
        return self.now

    def monotonic(self) -> float:
        return time.monotonic()


MS = 1_000_000


def fed_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, afters: list[int]
) -> tuple[RecordingEdges, Callable[[int], None]]:
    """Rank 1 of two idles before its forward until rank 0's 2 ms forward has ended, plus
    0.3 ms; per step, it begins to idle ``afters[step]`` ns after rank 0 began that forward
    (negative: before). Both predict from their peers (rank 1's hand-over learnt from one
    bubble). Rank 1's edges, and a function that opens rank 1's bubble of one more step."""
    from freeride_lab.core.peer_prediction import AwaitedPeerPredictor
    from freeride_lab.io.peer_board import AwaitedPeers
    from freeride_lab.pipeline import step_clock

    clock = _HostClock()
    monkeypatch.setattr(step_clock, "time", clock)
    stage_ranks = {0: 0, 1: 1}
    feeder = ActionRecorder(peers=AwaitedPeers(tmp_path, 0, stage_ranks))
    edges = RecordingEdges()
    rank1 = ActionRecorder(
        edges=edges,
        predictor=AwaitedPeerPredictor(min_residuals=1),
        peers=AwaitedPeers(tmp_path, 1, stage_ranks),
    )
    for step, after in enumerate(afters):
        clock.now += 10 * MS
        feeder.begin_step(step)
        if after < 0:
            rank1.begin_step(step)  # its slot 0 opens: it waits for rank 0's forward
            clock.now -= after
        token = feeder.start(ActionKind.FORWARD, 0, 0)
        if after >= 0:
            clock.now += after
            rank1.begin_step(step)
        clock.now += 2 * MS - max(after, 0)
        feeder.stop(token)
        clock.now += 3 * MS // 10
        mine = rank1.start(ActionKind.FORWARD, 1, 0)
        clock.now += MS
        rank1.stop(mine)
        for rec in (feeder, rank1):
            rec.end_window()
            rec.mark("optimizer_start")
            rec.mark("optimizer_end")
            rec.finish_step()

    def open_next(step: int) -> None:
        clock.now += 10 * MS
        feeder.begin_step(step)
        rank1.begin_step(step)

    return edges, open_next


def predicted_slot_0(edges: RecordingEdges) -> dict[object, int]:
    """step -> the length rank 1 predicted for its slot 0 (where it predicted one)."""
    starts = [c for c in edges.calls if c[0] == "start" and c[2] == 0 and c[4] is not None]
    return {c[1]: c[4] - c[3] for c in starts}  # type: ignore[operator]


def test_a_bubble_opens_with_the_end_its_awaited_peer_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1's bubbles open 0.2 to 1.5 ms after rank 0 began the forward they wait for.
    From the third step on (rank 0 has timed a forward and published one, rank 1 has learnt
    the hand-over) rank 1 predicts each exactly, where its slot's minimum would predict the
    shortest; a bubble opened before rank 0 began names on rank 1's board the forward it
    waits for, and is predicted from its slot."""
    from freeride_lab.io.peer_board import Awaiting, PeerBoards

    late = [2 * MS // 10, 15 * MS // 10, MS, 2 * MS // 10, 15 * MS // 10, MS // 2]
    edges, open_next = fed_steps(tmp_path, monkeypatch, late)
    predicted = predicted_slot_0(edges)
    assert [predicted.get(step) for step in range(2, 6)] == [23 * MS // 10 - a for a in late[2:]]
    open_next(6)
    assert predicted_slot_0(edges)[6] == 23 * MS // 10 - max(late[-5:])
    awaited = PeerBoards(tmp_path).awaiting(1)
    assert awaited == Awaiting(6, 0, 0, 0, ActionKind.FORWARD, 0, 3 * MS // 10)


def test_a_slot_whose_peer_always_starts_late_learns_its_hand_over_at_each_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1's bubbles all open 0.5 ms before rank 0 begins the forward they wait for: no
    end is published at an open, yet each bubble's close reads it, so the slot learns its
    0.3 ms hand-over and the board names the forward of the next bubble."""
    from freeride_lab.io.peer_board import Awaiting, PeerBoards

    edges, open_next = fed_steps(tmp_path, monkeypatch, [-MS // 2] * 4)
    open_next(4)
    assert predicted_slot_0(edges)[4] == 28 * MS // 10  # the slot's own: every bubble alike
    awaited = PeerBoards(tmp_path).awaiting(1)
    assert awaited == Awaiting(4, 0, 0, 0, ActionKind.FORWARD, 0, 3 * MS // 10)


def test_a_cuda_recorder_refuses_peers_whose_starts_it_cannot_see(tmp_path: Path) -> None:
    from freeride_lab.io.peer_board import AwaitedPeers

    with pytest.raises(ValueError, match="launches, not their starts"):
        ActionRecorder(device="cuda", peers=AwaitedPeers(tmp_path, 0, {0: 0}))
