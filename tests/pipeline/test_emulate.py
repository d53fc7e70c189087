"""Single-GPU emulation pieces: control file, edge gate, emulated chunks (CPU; one GPU test),
and one emulated zero-bubble pipeline end to end on the CPU.

The whole harness runs end to end in ``tests/bench/test_bench.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from edge_receivers import RecordingEdges

from freeride_lab.bench.profiles import bench_profile, run_config
from freeride_lab.core.config import EmulateOptions, RunConfig
from freeride_lab.core.torch_compat import backward_input, backward_weight
from freeride_lab.io.rundir import RunDir
from freeride_lab.lab.session import Session
from freeride_lab.pipeline import emulate, emulate_chunks
from freeride_lab.pipeline.emulate import (
    ChunkCosts,
    Control,
    ControlFile,
    EdgeGate,
    EmulatedChunk,
    Emulation,
    Gate,
)
from freeride_lab.pipeline.launcher import RunState
from freeride_lab.pipeline.models import GPTConfig, StageChunk, build_stage_chunks
from freeride_lab.pipeline.runner import RankRunner
from freeride_lab.pipeline.stage_build import text_loss

B, T, W, D = 2, 8, 4, 16


def _chunks(dtype: torch.dtype = torch.float32, device: str = "cpu") -> list[EmulatedChunk]:
    built = build_stage_chunks(GPTConfig(seq_len=T, layers=3, d_model=D, heads=2), 3)
    out = []
    for c in built:
        assert isinstance(c, StageChunk)
        out.append(
            EmulatedChunk(c, d_model=D, wire_d_model=W, device=torch.device(device), dtype=dtype)
        )
    return out


def _config(**emulate: Any) -> RunConfig:
    runtime = {"emulate": {"device": "cpu", "d_model": 64, "heads": 4, **emulate}}
    return RunConfig(
        stages=2, microbatches=4, workload="text", d_model=16, heads=4, runtime=runtime
    )


def test_control_round_trips_through_its_file(tmp_path: Path) -> None:
    control = Control(seq=3, real_rank=2, gate=Gate.OPEN, hold=True, timed=False)
    ControlFile(tmp_path).write(control)
    assert ControlFile(tmp_path).read() == control


def test_control_file_reads_none_before_anything_was_written(tmp_path: Path) -> None:
    assert ControlFile(tmp_path).read() is None


def test_control_file_keeps_the_last_good_control_when_the_file_is_garbled(
    tmp_path: Path,
) -> None:
    cf = ControlFile(tmp_path)
    cf.write(Control(seq=1, real_rank=1))
    assert cf.read() == Control(seq=1, real_rank=1)
    cf.path.write_text("{not json")
    assert cf.read() == Control(seq=1, real_rank=1)


def test_applied_log_lists_each_seq_with_its_first_step(tmp_path: Path) -> None:
    cf = ControlFile(tmp_path)
    cf.note_applied(1, 0, 10)
    cf.note_applied(2, 7, 20)
    assert cf.applied() == [
        {"seq": 1, "step": 0, "t_ns": 10},
        {"seq": 2, "step": 7, "t_ns": 20},
    ]


def test_control_travels_as_integers_for_the_all_reduce() -> None:
    control = Control(seq=9, real_rank=3, gate=Gate.PASS, hold=False, timed=True)
    assert Control.from_values(control.to_values()) == control


def test_closed_gate_passes_no_edges() -> None:
    inner = RecordingEdges()
    gate = EdgeGate(inner)  # type: ignore[arg-type]
    gate.bubble_start(1, 0, 100, 200)
    gate.bubble_end(1, 0, 150)
    assert inner.calls == []


def test_passing_gate_forwards_real_edges_unchanged() -> None:
    inner = RecordingEdges()
    gate = EdgeGate(inner)  # type: ignore[arg-type]
    gate.set_gate(Gate.PASS, step=1, t_ns=0)
    gate.bubble_start(1, 2, 100, 200)
    gate.bubble_end(1, 2, 150)
    assert inner.calls == [("start", 1, 2, 100, 200), ("end", 1, 2, 150)]


def test_open_gate_publishes_one_endless_bubble_and_ends_it_on_the_next_switch() -> None:
    inner = RecordingEdges()
    gate = EdgeGate(inner)  # type: ignore[arg-type]
    gate.set_gate(Gate.OPEN, step=5, t_ns=1_000)
    gate.bubble_start(5, 0, 2_000, 3_000)  # real edges are swallowed while open
    gate.set_gate(Gate.CLOSED, step=6, t_ns=9_000)
    (kind, step, slot, t_ns, end_ns), closing = inner.calls
    assert (kind, step, t_ns) == ("start", 5, 1_000) and end_ns > 10**12
    assert closing == ("end", 5, slot, 9_000)


def test_a_switch_away_from_passing_ends_the_real_bubble_the_worker_saw_start() -> None:
    # the bubble carried across the step boundary is open while the gate switches
    inner = RecordingEdges()
    gate = EdgeGate(inner)  # type: ignore[arg-type]
    gate.set_gate(Gate.PASS, step=1, t_ns=0)
    gate.bubble_start(2, 0, 100, 900)
    gate.set_gate(Gate.CLOSED, step=2, t_ns=300)
    gate.bubble_end(2, 0, 800)  # its real end comes later and is not passed on again
    assert inner.calls == [("start", 2, 0, 100, 900), ("end", 2, 0, 300)]


def test_a_passing_gate_drops_the_end_of_a_bubble_it_did_not_pass_the_start_of() -> None:
    inner = RecordingEdges()
    gate = EdgeGate(inner)  # type: ignore[arg-type]
    gate.bubble_start(3, 0, 100, 900)  # still closed
    gate.set_gate(Gate.PASS, step=3, t_ns=200)
    gate.bubble_end(3, 0, 800)
    gate.bubble_start(3, 1, 850, 950)
    assert inner.calls == [("start", 3, 1, 850, 950)]


def test_emulated_chunk_keeps_its_device_and_dtype_when_the_rank_moves_modules() -> None:
    chunk = _chunks(dtype=torch.bfloat16)[1]
    chunk.to(device="cpu", dtype=torch.float32)  # what rank.setup does to every module
    assert {p.dtype for p in chunk.chunk.parameters()} == {torch.bfloat16}
    assert chunk.sleep_weight.dtype == torch.float32  # the sleeping W's weight: a CPU tensor


class _VirtualTime:
    """A clock that only sleeps move: action lengths in it are exact."""

    def __init__(self) -> None:
        self.t = 100.0

    def perf_counter(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.t += seconds


@pytest.fixture
def vtime(monkeypatch: pytest.MonkeyPatch) -> _VirtualTime:
    clock = _VirtualTime()
    monkeypatch.setattr(emulate_chunks, "time", clock)
    return clock


def _sleeping_middle(forward_s: float, backward_s: float, weight_s: float) -> EmulatedChunk:
    middle = _chunks()[1]
    middle.costs = ChunkCosts(forward_s=forward_s, backward_s=backward_s, weight_s=weight_s)
    middle.is_real = False
    return middle


def _timed(vtime: _VirtualTime, fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = vtime.t
    out = fn()
    return out, vtime.t - t0


def test_a_sleeping_chunk_lasts_its_forward_then_i_then_w_under_a_split_backward(
    vtime: _VirtualTime,
) -> None:
    middle = _sleeping_middle(0.5, 0.75, 0.25)
    x = torch.randn(B, T, W, requires_grad=True)  # (B, T, W)
    y, forward = _timed(vtime, lambda: middle(x))
    groups, i = _timed(
        vtime, lambda: backward_input([y], [torch.ones_like(y)], [x], middle.parameters())
    )
    _, w = _timed(vtime, lambda: backward_weight(middle.parameters(), groups))
    assert (forward, i, w) == pytest.approx((0.5, 0.5, 0.25))


def test_a_sleeping_chunks_weight_gradient_accumulates_over_micro_batches(
    vtime: _VirtualTime,
) -> None:
    middle = _sleeping_middle(0.0, 0.75, 0.25)
    for _ in range(2):  # torch adds the second micro-batch's W into the first's, in place
        x = torch.randn(B, T, W, requires_grad=True)
        y = middle(x)
        groups = backward_input([y], [torch.ones_like(y)], [x], middle.parameters())
        backward_weight(middle.parameters(), groups)
    assert middle.sleep_weight.grad is not None
    torch.testing.assert_close(middle.sleep_weight.grad, torch.full((W,), 2.0 * B * T * W))


@pytest.mark.parametrize("weight_s", [0.0, 0.25])
def test_a_sleeping_chunks_whole_backward_lasts_both_halves(
    vtime: _VirtualTime, weight_s: float
) -> None:
    middle = _sleeping_middle(0.0, 0.75, weight_s)
    y = middle(torch.randn(B, T, W, requires_grad=True))
    _, b = _timed(vtime, lambda: y.sum().backward())
    assert b == pytest.approx(0.75)


def test_work_inside_a_sleeping_chunk_does_not_lengthen_its_actions(
    vtime: _VirtualTime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Building the wire's tensors takes milliseconds on some hosts; the sleeps absorb it."""
    work_s = 0.003

    def with_work(fn: Callable[..., Any]) -> Any:
        def run(*args: Any) -> Any:
            out = fn(*args)
            vtime.t += work_s  # e.g. building the output, or the input's gradient
            return out

        return staticmethod(run)

    monkeypatch.setattr(  # work in the forward (building the output), before the deadline
        emulate_chunks._Wire, "forward", with_work(emulate_chunks._Wire.forward)
    )
    monkeypatch.setattr(  # and in the backward, after the clock started
        emulate_chunks._Wire, "backward", with_work(emulate_chunks._Wire.backward)
    )
    middle = _sleeping_middle(0.5, 0.75, 0.25)
    x = torch.randn(B, T, W, requires_grad=True)
    y, forward = _timed(vtime, lambda: middle(x))
    _, b = _timed(vtime, lambda: y.sum().backward())
    assert (forward, b) == pytest.approx((0.5, 0.75))


def test_chunk_costs_refuse_a_weight_half_larger_than_the_backward() -> None:
    with pytest.raises(ValueError, match=r"weight_s=0.5 must lie in \[0, backward_s=0.25\]"):
        ChunkCosts(forward_s=0.0, backward_s=0.25, weight_s=0.5)


@pytest.mark.parametrize(("schedule", "split"), [("1F1B", False), ("InterleavedZeroBubble", True)])
def test_calibration_times_w_apart_under_a_zero_bubble_schedule_except_on_the_first_stage(
    tmp_path: Path, schedule: str, split: bool
) -> None:
    runtime = {"emulate": {"device": "cpu", "d_model": 64, "heads": 4, "calibrate_iters": 2}}
    config = RunConfig(
        stages=2, microbatches=4, schedule=schedule, workload="text", d_model=16, heads=4,
        seq_len=T, microbatch_size=B, layers=4, runtime=runtime,
    )  # fmt: skip
    stage_ids = [0, 2] if split else [0]  # rank 0's stage chunks
    n_stages = 4 if split else 2
    emulation = Emulation.build(config, 0, stage_ids, n_stages, RunDir(tmp_path))
    emulation._calibrate_own()
    costs = [c.costs for c in emulation.chunks]
    assert all(c is not None and c.backward_s > 0 for c in costs)
    assert costs[0] is not None and costs[0].weight_s == 0.0  # the first stage: B in W
    if split:
        assert costs[1] is not None and 0.0 < costs[1].weight_s < costs[1].backward_s


class _CudaWaits:
    """Rank 1's emulation on "cuda:0", real or sleeping this step, and the device waits it
    asks for (``torch.cuda.synchronize`` recorded instead of run)."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real_rank: int) -> None:
        self.waited: list[torch.device] = []
        monkeypatch.setattr(torch.cuda, "synchronize", self.waited.append)
        spec = EmulateOptions(device="cuda:0", d_model=64, heads=4)
        self.emulation = Emulation(spec, _config(), 1, [], RunDir(tmp_path))
        self.emulation.control = Control(seq=1, real_rank=real_rank)


REAL_OR_SLEEPING = pytest.mark.parametrize(
    ("real_rank", "syncs"), [(1, 1), (0, 0)], ids=["real", "sleeping"]
)


@REAL_OR_SLEEPING
def test_a_real_rank_settles_its_w_on_the_device_and_a_sleeping_one_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real_rank: int, syncs: int
) -> None:
    # the stage calls settle() at the end of every W ([Note: settled W])
    cuda = _CudaWaits(tmp_path, monkeypatch, real_rank)
    cuda.emulation.settle()
    assert cuda.waited == [torch.device("cuda:0")] * syncs


@REAL_OR_SLEEPING
def test_a_real_ranks_optimizer_step_ends_on_the_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real_rank: int, syncs: int
) -> None:
    # run_step stamps the optimizer's end right after _optimizer_step returns
    cuda = _CudaWaits(tmp_path, monkeypatch, real_rank)
    runner = object.__new__(RankRunner)  # the two attributes the optimizer step uses
    weight = torch.nn.Parameter(torch.ones(2))
    weight.grad = torch.ones(2)
    runner.optimizer = torch.optim.SGD([weight], lr=0.5)
    runner.emulation = cuda.emulation
    runner._optimizer_step()
    assert weight.tolist() == [0.5, 0.5] and weight.grad is None
    assert cuda.waited == [torch.device("cuda:0")] * syncs


def test_a_rank_that_stops_computing_gives_its_cached_device_memory_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # with the real stage rotating over S ranks on one device, every rank's activation peak
    # stayed reserved: S peaks at once ran a training rank out of memory
    cuda = _CudaWaits(tmp_path, monkeypatch, real_rank=1)
    emptied: list[int] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    apply = cuda.emulation._apply
    assert apply(Control(seq=2, real_rank=1)) is True and emptied == []  # stays real: keeps it
    assert apply(Control(seq=3, real_rank=0)) is False and len(emptied) == 1  # real -> sleeping
    assert cuda.waited == [torch.device("cuda:0")]  # its queued kernels end first
    apply(Control(seq=4, real_rank=2))  # sleeping -> sleeping: nothing to give back
    assert len(emptied) == 1


def test_rank_0_gives_its_cache_back_though_it_noted_the_control_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # rank 0 takes a new control when it notes it as applied, before the step applies it
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device: None)
    emptied: list[int] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    spec = EmulateOptions(device="cuda:0", d_model=64, heads=4)
    emulation = Emulation(spec, _config(), 0, [], RunDir(tmp_path))
    runner = object.__new__(RankRunner)
    runner.clock_offset_ns = 0
    assert emulation._apply(Control(seq=1, real_rank=0)) is True
    moved = Control(seq=2, real_rank=1)
    emulation._note(moved, 5, runner)
    assert emulation._apply(moved) is False and emptied == [1]


def test_a_rank_that_sleeps_its_first_step_gives_back_its_calibrations_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cuda = _CudaWaits(tmp_path, monkeypatch, real_rank=0)  # rank 1, calibrated, then sleeping
    emptied: list[int] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    cuda.emulation._apply(Control(seq=1, real_rank=0))
    assert emptied == [1]


def test_a_cpu_rank_that_stops_computing_touches_no_cuda(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: pytest.fail("CUDA touched"))
    emulation = Emulation(_config().runtime.emulate, _config(), 1, [], RunDir(tmp_path))
    emulation.control = Control(seq=1, real_rank=1)
    assert emulation._apply(Control(seq=2, real_rank=0)) is False


@pytest.mark.gpu
def test_a_cuda_rank_that_stops_computing_shrinks_its_reserved_memory(tmp_path: Path) -> None:
    spec = EmulateOptions(device="cuda:0", d_model=64, heads=4)
    emulation = Emulation(spec, _config(), 1, [], RunDir(tmp_path))
    emulation.control = Control(seq=1, real_rank=1)
    peak = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda:0")  # a 256 MiB "peak"
    del peak
    held = torch.cuda.memory_reserved(0)
    assert held >= 256 * 2**20
    emulation._apply(Control(seq=2, real_rank=0))
    assert torch.cuda.memory_reserved(0) <= held - 256 * 2**20


def test_a_real_rank_computes_the_cross_entropy_and_a_sleeping_one_a_stand_in(
    tmp_path: Path,
) -> None:
    emulation = Emulation(_config().runtime.emulate, _config(), 1, [], RunDir(tmp_path))
    logits = torch.randn(B, T, 256, requires_grad=True)  # (B, T, V)
    targets = torch.randint(0, 256, (B, T))
    emulation.control = Control(seq=1, real_rank=1)
    want = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1))
    assert emulation.loss(logits, targets).item() == pytest.approx(want.item())
    emulation.control = Control(seq=2, real_rank=0)
    stand_in = emulation.loss(logits, targets)
    stand_in.backward()  # a sleeping last chunk's backward still runs from it
    assert stand_in.item() == pytest.approx(logits.mean().item()) and logits.grad is not None


def _last_of_two_ranks(tmp_path: Path, **emulate: Any) -> Emulation:
    """Rank 1's emulation of a two-stage text run on the CPU, with ``emulate`` options."""
    runtime = {"emulate": {"device": "cpu", "d_model": 64, "heads": 4, **emulate}}
    config = RunConfig(
        stages=2, microbatches=4, workload="text", d_model=16, heads=4, seq_len=T,
        microbatch_size=B, layers=4, runtime=runtime,
    )  # fmt: skip
    return Emulation.build(config, 1, [1], 2, RunDir(tmp_path))


def test_calibration_counts_the_loss_in_the_last_stages_forward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the run computes the loss inside the last stage's F, so its sleeping peer must sleep it
    clock = _VirtualTime()
    monkeypatch.setattr(emulate, "time", clock)

    def slow_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        clock.sleep(0.25)
        return text_loss(logits, targets)

    monkeypatch.setattr(emulate, "text_loss", slow_loss)
    emulation = _last_of_two_ranks(tmp_path, calibrate_iters=2)
    emulation._calibrate_own()
    (last,) = emulation.chunks
    assert last.costs is not None and last.costs.forward_s == pytest.approx(0.25)


def test_emulate_loss_on_names_its_valid_values() -> None:
    with pytest.raises(ValueError, match="loss_on='gpu'; valid: device, host"):
        EmulateOptions(device="cpu", loss_on="gpu")


@pytest.mark.parametrize("real", [True, False], ids=["real", "sleeping"])
def test_emulated_chunks_map_pipeline_tensors_of_the_right_shapes(real: bool) -> None:
    first, middle, last = _chunks()
    for c in (first, middle, last):
        c.costs = ChunkCosts(forward_s=0.0, backward_s=0.0)
        c.is_real = real
    tokens = torch.randint(0, 256, (B, T))
    h1 = first(tokens)
    h2 = middle(h1)
    logits = last(h2)
    assert h1.shape == h2.shape == (B, T, W) and logits.shape == (B, T, 256)
    assert logits.dtype == torch.float32 and logits.device.type == "cpu"


@pytest.mark.parametrize("real", [True, False], ids=["real", "sleeping"])
def test_gradients_flow_back_through_an_emulated_chunk(real: bool) -> None:
    middle = _chunks()[1]
    middle.costs = ChunkCosts(forward_s=0.0, backward_s=0.0)
    middle.is_real = real
    x = torch.randn(B, T, W, requires_grad=True)
    middle(x).sum().backward()
    assert x.grad is not None and x.grad.shape == (B, T, W)


def test_emulate_options_name_the_valid_keys_for_an_unknown_one() -> None:
    with pytest.raises(ValueError, match=r"\['width'\].*d_model"):
        _config(width=3)


def test_emulate_options_need_a_model_width_that_the_wire_divides() -> None:
    with pytest.raises(ValueError, match="multiple of the wire width"):
        _config(d_model=40, heads=4)


def test_emulate_mode_needs_the_text_workload() -> None:
    with pytest.raises(ValueError, match="workload='text'"):
        _config().replace(workload="synthetic")


def test_emulate_mode_is_off_without_emulate_options() -> None:
    assert RunConfig(stages=2, microbatches=4).runtime.emulate is None
    assert _config().runtime.emulate == EmulateOptions(device="cpu", d_model=64, heads=4)


@pytest.mark.gpu
def test_emulated_chunk_computes_on_cuda_and_hands_back_cpu_tensors() -> None:
    first, middle, last = _chunks(dtype=torch.bfloat16, device="cuda")
    x = torch.randn(B, T, W, requires_grad=True)
    logits = last(middle(first(torch.randint(0, 256, (B, T)))) + x)
    logits.float().sum().backward()
    assert logits.device.type == "cpu" and x.grad is not None
    assert next(middle.chunk.parameters()).device.type == "cuda"


@pytest.mark.gpu
def test_a_real_last_chunk_keeps_its_logits_on_cuda_for_the_loss(tmp_path: Path) -> None:
    built = build_stage_chunks(GPTConfig(seq_len=T, layers=2, d_model=D, heads=2), 2)
    last = EmulatedChunk(
        built[1], d_model=D, wire_d_model=W, device=torch.device("cuda"), dtype=torch.bfloat16,
        logits_on_device=True,
    )  # fmt: skip
    x = torch.randn(B, T, W, requires_grad=True)  # (B, T, W) from the wire, on the CPU
    logits = last(x)
    assert logits.device.type == "cuda" and logits.dtype == torch.float32
    emulation = Emulation(EmulateOptions(device="cuda", d_model=D, heads=2), _config(), 0,
                          [last], RunDir(tmp_path))  # fmt: skip
    loss = emulation.loss(logits, torch.randint(0, 256, (B, T)))  # CPU targets
    loss.backward()
    assert loss.device.type == "cuda" and x.grad is not None and x.grad.device.type == "cpu"


def _three_steps_with_rank_1_real(
    profile: Any, tmp_path: Path
) -> tuple[Session, list[dict[str, Any]]]:
    """Three steps of ``profile``'s first run on the CPU, rank 1 computing; the finished
    session and each rank's calibration report."""
    run_dir = tmp_path / "run"
    config = run_config(profile, profile.runs[0], run_dir).replace(steps=3)
    session = Session.launch(config, grace_s=20.0)
    try:
        ControlFile(run_dir).write(Control(seq=1, real_rank=1))
        assert session.wait(timeout_s=240) is RunState.FINISHED
    finally:
        session.stop()
    paths = sorted((run_dir / "emulate").glob("calibration-*"))
    return session, [json.loads(p.read_text()) for p in paths]


@pytest.mark.slow
def test_an_emulated_zero_bubble_pipeline_trains_with_peers_sleeping_i_and_w_apart(
    tmp_path: Path,
) -> None:
    profile = bench_profile("tiny", "cpu").replace(schedule="InterleavedZeroBubble", chunks=2)
    session, calibrations = _three_steps_with_rank_1_real(profile, tmp_path)
    # rank 0 holds stages 0 and 2, rank 1 stages 1 and 3: only stage 0 has no W of its own
    assert [c["weight_ms"][0] > 0 for c in calibrations] == [False, True]
    assert all(w > 0 for c in calibrations for w in c["weight_ms"][1:])
    actions = session.actions
    kinds = actions.groupby(["step", "rank"])["action"].agg(lambda a: "".join(sorted(set(a))))
    assert set(kinds) == {"FIW"} and len(kinds) == 3 * 2


def _replayed(rank: int, forward_ms: float) -> dict[str, Any]:
    return {"rank": rank, "device": "cuda:0", "forward_ms": [forward_ms], "backward_ms": [60.0],
            "weight_ms": [0.0], "optimizer_ms": 5.0}  # fmt: skip


def test_a_rank_replays_the_given_costs_and_reports_what_it_measured(tmp_path: Path) -> None:
    costs = [_replayed(0, 30.0), _replayed(1, 40.0)]
    emulation = _last_of_two_ranks(tmp_path, calibrate_iters=1, costs=costs)
    emulation._calibrate_own()
    measured_f = emulation.chunks[0].costs.forward_s  # type: ignore[union-attr]
    report = emulation._replay_costs()
    (chunk,) = emulation.chunks
    assert chunk.costs == emulate_chunks.ChunkCosts(0.040, 0.060, 0.0)
    assert emulation.optimizer_s == pytest.approx(0.005)
    assert report["forward_ms"] == [40.0] and report["optimizer_ms"] == 5.0
    assert report["measured"]["forward_ms"] == [round(measured_f * 1e3, 3)]


def test_replayed_costs_for_fewer_chunks_than_the_rank_has_are_refused(tmp_path: Path) -> None:
    runtime = {"emulate": {"device": "cpu", "d_model": 64, "heads": 4, "calibrate_iters": 1,
                           "costs": [_replayed(0, 30.0), _replayed(1, 40.0)]}}  # fmt: skip
    config = RunConfig(
        stages=2, microbatches=4, schedule="Interleaved1F1B", chunks=2, workload="text",
        d_model=16, heads=4, seq_len=T, microbatch_size=B, layers=4, runtime=runtime,
    )  # fmt: skip
    emulation = Emulation.build(config, 0, [0, 2], 4, RunDir(tmp_path))
    with pytest.raises(ValueError, match="name 1 chunk\\(s\\); the rank has 2"):
        emulation._replay_costs()


@pytest.mark.slow
def test_peers_replaying_one_calibration_sleep_its_costs_in_the_run(tmp_path: Path) -> None:
    from freeride_lab.core.runtime_options import ReplayCosts

    costs = tuple(ReplayCosts.from_report(_replayed(r, f)) for r, f in ((0, 30.0), (1, 40.0)))
    profile = bench_profile("tiny", "cpu").replace(peer_costs=costs)
    session, reports = _three_steps_with_rank_1_real(profile, tmp_path)
    assert [c["forward_ms"] for c in reports] == [[30.0], [40.0]]
    assert all(c["measured"]["forward_ms"][0] != c["forward_ms"][0] for c in reports)
    actions = session.actions
    sleeping_f = actions[(actions["rank"] == 0) & (actions["action"] == "F")]
    assert (sleeping_f["duration_ms"] >= 30.0).all()  # rank 0 sleeps the replayed F
