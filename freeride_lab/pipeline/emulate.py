"""Single-GPU pipeline emulation: one rank computes for real, its peers replay measured costs.

NCCL refuses two ranks on one device, so one GPU cannot run an S-stage NCCL pipeline. Emulate
mode runs the same S gloo ranks on one host instead; in every step exactly one of them (the
*real* rank) computes its stage chunk(s) on the device, and the others *sleep* the F and B
durations that they measured for their own chunks on that device at start-up. The real rank
therefore sees the bubble shape of a real S-stage pipeline, and a side task beside it competes
with real training kernels. Which rank is real, whether its side tasks may take bubbles, and
whether training holds still can change between steps, so one run (one process tree) can
rotate the real stage and interleave benchmark modes::

    runtime = RuntimeOptions(
        emulate=EmulateOptions(device="cuda:0", d_model=4096, heads=32, dtype="bfloat16"),
        edges_factory="freeride_lab.pipeline.emulate:open_edges",
        timed="alternate",                    # both timed and plain schedules get built
    )
    config = RunConfig(stages=4, microbatches=4, d_model=256, layers=16, seq_len=2048,
                       microbatch_size=2, workload="text", device="cpu", runtime=runtime)
    ControlFile(run_dir).write(Control(seq=1, real_rank=2, gate=Gate.PASS))   # from anywhere

How it is built:

- **Stage chunks.** Every rank builds its real GPT chunk(s) (``core.models``, width
  ``emulate.d_model``) on the emulation device in ``emulate.dtype``, wrapped in an
  ``EmulatedChunk``. Pipeline tensors stay on the CPU and go through gloo; a real chunk copies
  its input to the device and its output back (autograd carries the gradients both ways).
- **Narrow wire** [Note: wire width]. Between stages travels a (B, T, ``config.d_model``) tensor,
  not the model's (B, T, D): the chunk tiles it up to D on entry and averages it back down on
  exit. Compute on the device is that of the full model; only the bytes on the wire shrink, so
  gloo over loopback TCP adds about what NVLink would (tens of microseconds), not tens of ms.
- **Calibration.** After the process group is up, rank by rank (one at a time on the device),
  each rank times F (host → device → host, the output copy synchronises) and B (closed by a
  synchronise, see ``_SyncOnBackward``) of each of its chunks on random inputs, and one AdamW
  step of its parameters; medians of ``calibrate_iters`` after ``calibrate_warmup``. Under a
  zero-bubble schedule B is timed as its two halves, the way a stage runs them: I (the input's
  gradient) and then W (the weights'), each closed by a synchronise. In the run, a real rank's
  W and optimizer step are closed the same way (``Emulation.settle``, [Note: settled W] in
  ``pipeline.timed_stage``): both only launch their kernels, and would otherwise end on the host
  before the kernels did.
- **Replay.** With ``EmulateOptions.costs`` (a calibration a run recorded) every rank still
  calibrates, so the device warms up alike, then puts the given costs in place of what it
  measured; its report keeps both. Two runs that replay one calibration have peers that sleep
  alike, so their bubbles are alike: five timed micro-batches left one rank's F one to three
  milliseconds apart between runs of one day on an H100, and the bubbles it sets move with it.
- **Loss.** A real last stage keeps its logits on the device and computes its loss there,
  inside its F as torch does, closed by a synchronise (``Emulation.loss``); a sleeping one
  sleeps a calibrated F that holds the loss and computes only a stand-in (the mean of its
  logits). ``loss_on="host"`` brings the logits back and computes the loss on the CPU instead,
  which makes the last stage host-bound.
- **Sleeping.** A rank that is not real runs the same chunk as a sleep (``time.sleep`` of its
  own calibrated F in forward, I and W in the backward's two halves, on tensors of the right
  shapes, gradients flowing), and before the next step it sleeps its calibrated optimizer time
  (a real rank's AdamW would have run then).
- **Control** [Note: emulation control]. ``ControlFile`` holds the newest ``Control``; before
  each step rank 0 reads it and one all-reduce shares it (and any rank's stop request). The
  rank applies it for the whole step and rank 0 appends ``{seq, step, t_ns}`` to
  ``emulate/applied.jsonl`` the first time it applies a ``seq`` (how a benchmark knows which
  steps a setting covers). ``hold`` parks training before the step (ranks re-read the control
  every 20 ms) — used to time a side task alone on the device.
- **Gating** (``EdgeGate``, the rank's ``edges``). ``Gate.PASS`` forwards the real bubble edges
  to the side-task worker (FreeRide's managed mode); ``Gate.CLOSED`` forwards none (no side-task
  step starts: the vanilla baseline with tasks parked); ``Gate.OPEN`` publishes one bubble with
  no end until the gate changes (continuous co-location: the naive control). Only the real rank
  ever passes or opens its gate.

What this models, and what not:

- Modelled: the real rank's compute on the real device and dtype, with every kernel a real
  stage runs (embedding and head on the first and last stage); the schedule's order and
  dependencies across S ranks; the resulting bubble shapes and lengths; side tasks on that same
  device (with or without MPS), their interference with training kernels, power and clock
  effects *of that device*; the optimizer step of the real rank.
- Not modelled: NCCL's communication cost and its overlap with compute (here P2P is gloo on
  small CPU tensors, synchronous with the action that needs it); the H2D/D2H copies the
  emulation adds (a few MB per action, counted in the calibrated costs, so peers replay them);
  peers' timing precision (``time.sleep`` overshoots by tens of µs, a few hundred µs per step);
  the power, thermal and clock state of the other S-1 GPUs (their kernels never run, so a
  power-capped neighbour cannot slow its stage); interference between several harvested stages
  at once (one stage harvests at a time; pipeline-wide overhead is estimated from the
  per-stage numbers); memory: all S ranks keep their chunks resident on the one device, so free
  memory per stage is not that of S separate GPUs (each rank's own peak is still reported; a
  rank that stops computing for real gives its cached blocks back, so only the real rank's
  activation peak is on the device at a time).
- Zero-bubble schedules: a sleeping chunk sleeps I and W as calibrated, so the real rank sees
  the residual idle of the schedule, not that of a zero-bubble plan whose peers hold their
  whole backward in I. On the first stage torch runs the whole backward as W (it has no input
  gradient to compute), real or sleeping. V schedules (ZBV, DualPipeV) need torch >= 2.13 on
  gloo ([Note: adjacent stages on one rank]); with older torch InterleavedZeroBubble is the
  zero-bubble schedule that runs here.

On a machine without a GPU, ``device="cpu"`` runs the same harness with the real chunk on the
CPU (float32), so it is testable anywhere; CPU timings are not GPU truth.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist

from freeride_lab.core.config import RunConfig
from freeride_lab.core.runtime_options import EmulateOptions
from freeride_lab.core.schedule import Schedule, stage_indices
from freeride_lab.core.torch_compat import backward_input, backward_weight
from freeride_lab.io.rundir import RunDir, create_file
from freeride_lab.pipeline.emulate_chunks import VOCAB, ChunkCosts, EmulatedChunk
from freeride_lab.pipeline.emulate_control import Control, ControlFile, EdgeGate, Gate
from freeride_lab.pipeline.models import StageChunk
from freeride_lab.pipeline.stage_build import gpt_chunks, text_loss

if TYPE_CHECKING:
    from freeride_lab.pipeline.stop import StopControl

log = logging.getLogger(__name__)

__all__ = [
    "ChunkCosts",
    "Control",
    "ControlFile",
    "EdgeGate",
    "EmulateOptions",
    "EmulatedChunk",
    "EmulatedRank",
    "Emulation",
    "Gate",
    "open_edges",
]

_HOLD_POLL_S = 0.02


def _torch_dtype(options: EmulateOptions) -> torch.dtype:
    return torch.bfloat16 if options.dtype == "bfloat16" else torch.float32


def open_edges(*, run_dir: RunDir | str | os.PathLike[str], rank: int) -> EdgeGate:
    """rank.py's ``edges_factory`` in emulate mode: the rank's worker (on the emulation device),
    behind an ``EdgeGate`` that starts CLOSED."""
    from freeride_lab.sidetasks.client import start_worker

    path = run_dir.path if isinstance(run_dir, RunDir) else Path(run_dir)
    config = RunConfig.from_dict(RunDir(path).read_run()["config"])
    spec = config.runtime.emulate
    device = "cpu" if spec is None else str(_device(spec.device))
    assert config.chunks is not None
    stage = min(stage_indices(Schedule.from_name(config.schedule), rank, config.stages,
                              config.chunks))  # fmt: skip
    return EdgeGate(start_worker(path, rank, device=device, stage=stage))


def _device(name: str) -> torch.device:
    d = torch.device(name)
    return torch.device("cuda", 0) if d.type == "cuda" and d.index is None else d


class EmulatedRank(Protocol):
    """What ``Emulation.before_step`` reads of its rank (``pipeline.runner.RankRunner``)."""

    timed: bool | str  # set per step from the control when both schedules exist

    @property
    def config(self) -> RunConfig: ...

    @property
    def stop(self) -> StopControl | None: ...

    @property
    def edges(self) -> object: ...

    @property
    def clock_offset_ns(self) -> int: ...


# -- the rank's side -------------------------------------------------------------------------


class Emulation:
    """A rank's emulate mode: its chunks, calibration, and the per-step control.

    ``RankRunner`` makes it in ``_build_modules`` (``Emulation.build``), calls
    ``calibrate`` once its process group is up, and ``before_step`` before every step.
    """

    def __init__(
        self,
        spec: EmulateOptions,
        config: RunConfig,
        rank: int,
        chunks: list[EmulatedChunk],
        run_dir: RunDir,
    ) -> None:
        self.spec = spec
        self.config = config
        self.rank = rank
        self.chunks = chunks
        self.device = _device(spec.device)
        self.control_file = ControlFile(run_dir)
        self.control = Control()
        self.optimizer_s = 0.0
        self._slept_last_step = False
        # whether the device may hold this rank's cached blocks (calibration computes on it)
        self._holds_blocks = True

    def __repr__(self) -> str:
        return (
            f"<Emulation(rank={self.rank}, device={self.device}, real={self.is_real}, "
            f"seq={self.control.seq})>"
        )

    @property
    def is_real(self) -> bool:
        return self.control.real_rank == self.rank

    @classmethod
    def build(
        cls, config: RunConfig, rank: int, stage_ids: Sequence[int], n_stages: int, run_dir: RunDir
    ) -> Emulation:
        """Build this rank's real chunks on the emulation device (deterministic init)."""
        spec = config.runtime.emulate
        if spec is None:
            raise ValueError(
                "config.runtime.emulate is None; pass RuntimeOptions(emulate=EmulateOptions(...))"
            )
        device = _device(spec.device)
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError(
                    f"emulate device={spec.device!r} but torch.cuda.is_available() is False; "
                    "use emulate device 'cpu' or run on a CUDA machine"
                )
            torch.cuda.set_device(device)
        built = gpt_chunks(config, stage_ids, n_stages, d_model=spec.d_model, heads=spec.heads)
        chunks = []
        for chunk in built:
            assert isinstance(chunk, StageChunk)
            chunks.append(
                EmulatedChunk(
                    chunk,
                    d_model=spec.d_model,
                    wire_d_model=config.d_model,
                    device=device,
                    dtype=_torch_dtype(spec),
                    logits_on_device=spec.loss_on == "device",
                )
            )
        return cls(spec, config, rank, chunks, run_dir)

    # -- calibration --

    def calibrate(self) -> dict[str, Any]:
        """Time this rank's chunks and optimizer step on the device, one rank at a time.

        Collective: every rank calls it. Returns (and logs) the costs in ms.
        """
        world = dist.get_world_size()
        for turn in range(world):
            if turn == self.rank:
                self._calibrate_own()
            dist.barrier()
        report = self._replay_costs() if self.spec.costs else self._costs_report()
        log.info("emulate calibration %s", report)
        path = self.control_file.dir / f"calibration-rank-{self.rank}.json"
        self.control_file.dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a recalibration replaces the last report
        with os.fdopen(create_file(path), "w") as f:
            f.write(json.dumps(report))
        return report

    def _costs_report(self) -> dict[str, Any]:
        """This rank's costs in ms, as ``calibrate`` reports them."""
        return {
            "rank": self.rank,
            "device": str(self.device),
            "forward_ms": [round(c.costs.forward_s * 1e3, 3) for c in self.chunks if c.costs],
            "backward_ms": [round(c.costs.backward_s * 1e3, 3) for c in self.chunks if c.costs],
            "weight_ms": [round(c.costs.weight_s * 1e3, 3) for c in self.chunks if c.costs],
            "optimizer_ms": round(self.optimizer_s * 1e3, 3),
        }

    def _replay_costs(self) -> dict[str, Any]:
        """Put this rank's replayed costs (``EmulateOptions.costs``) in place of the ones just
        measured; the report gives the replayed ones and keeps the measured under
        ``measured``."""
        measured = self._costs_report()
        given = self.spec.costs[self.rank]
        if len(given.forward_ms) != len(self.chunks):
            raise ValueError(
                f"emulate costs of rank {self.rank} name {len(given.forward_ms)} chunk(s); the "
                f"rank has {len(self.chunks)}: replay a run with the same schedule and chunks"
            )
        for chunk, f, b, w in zip(
            self.chunks, given.forward_ms, given.backward_ms, given.weight_ms, strict=True
        ):
            chunk.costs = ChunkCosts(f / 1e3, b / 1e3, w / 1e3)
        self.optimizer_s = given.optimizer_ms / 1e3
        keep = ("forward_ms", "backward_ms", "weight_ms", "optimizer_ms")
        return {**self._costs_report(), "measured": {k: measured[k] for k in keep}}

    def _calibrate_own(self) -> None:
        cfg, spec = self.config, self.spec
        B, T, W = cfg.microbatch_size, cfg.seq_len, cfg.d_model
        gen = torch.Generator().manual_seed(cfg.seed + 17 * self.rank)
        splits = Schedule.from_name(cfg.schedule).splits_backward
        for chunk in self.chunks:
            split = splits and not chunk.first  # the first stage's W is its whole backward
            fwd: list[float] = []
            bwd: list[float] = []
            wgt: list[float] = []
            for i in range(spec.calibrate_warmup + spec.calibrate_iters):
                if chunk.first:
                    x = torch.randint(0, VOCAB, (B, T), generator=gen)  # (B, T)
                else:
                    x = torch.randn(B, T, W, generator=gen).requires_grad_()  # (B, T, W)
                targets = torch.randint(0, VOCAB, (B, T), generator=gen)  # (B, T)
                self._sync()
                t0 = time.perf_counter()
                y = chunk.forward_real(x)
                if chunk.last:  # F holds the loss, as in the run ([Note: loss in the forward])
                    y = text_loss(y, targets)
                    self._sync()
                t1 = time.perf_counter()
                g = None if chunk.last else torch.randn(y.shape, generator=gen)
                t2 = time.perf_counter()
                t3 = t2
                if split:  # I, then W, as a zero-bubble stage runs them
                    groups = backward_input([y], [g], [x], chunk.chunk.parameters())
                    self._sync()
                    t3 = time.perf_counter()
                    backward_weight(chunk.chunk.parameters(), groups)
                else:  # B
                    torch.autograd.backward(y, g)
                self._sync()
                t4 = time.perf_counter()
                if i >= spec.calibrate_warmup:
                    fwd.append(t1 - t0)
                    bwd.append(t4 - t2)
                    wgt.append(t4 - t3 if split else 0.0)
            # each backward is at least its W, so the medians keep weight_s <= backward_s
            chunk.costs = ChunkCosts(
                statistics.median(fwd), statistics.median(bwd), statistics.median(wgt)
            )
        params = [p for c in self.chunks for p in c.parameters() if p.grad is not None]
        times: list[float] = []
        if params:
            optimizer = torch.optim.AdamW(params, lr=self.config.lr)
            for i in range(1 + spec.calibrate_iters):
                self._sync()
                t0 = time.perf_counter()
                optimizer.step()
                self._sync()
                if i:
                    times.append(time.perf_counter() - t0)
            del optimizer
        self.optimizer_s = statistics.median(times) if times else 0.0
        for c in self.chunks:
            c.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def settle(self) -> None:
        """The end of a W or of the optimizer step: wait for the device on a rank that
        computes for real this step, so the host clock sees the action end when its kernels do
        (``timed_stage.SettledStage``, [Note: settled W]); a sleeping rank has nothing queued."""
        if self.is_real:
            self._sync()

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The last stage's loss: the schedule's ``loss_fn`` in emulate mode.

        A real rank computes the mean next-byte cross-entropy where its logits are (on the
        device unless ``loss_on="host"``) and waits for the device: torch computes the loss
        inside the last stage's F ([Note: loss in the forward] in ``pipeline.timed_stage``),
        so F ends when the loss's kernels do. A sleeping rank takes the mean of its stand-in
        logits, the cheapest loss with a backward: its calibrated F already holds the loss's
        time (``_calibrate_own``), and the sleep lasts it.
        """
        if not self.is_real:
            return logits.mean()
        loss = text_loss(logits, targets)
        self._sync()
        return loss

    # -- per step --

    def before_step(self, runner: EmulatedRank, step: int) -> bool:
        """Agree on this step's control (holding while asked), then apply it; returns whether
        any rank was asked to stop (agreed by all, so every rank stops before this step).

        Collective: every rank calls it before every step.
        """
        if self._slept_last_step and self.optimizer_s > 0:
            time.sleep(self.optimizer_s)  # the optimizer step a real rank would have run
        control, stop = self._agree(runner)
        gate = self._gate(runner)
        while control.hold and not stop:
            if gate is not None:
                own = control.gate if control.real_rank == self.rank else Gate.CLOSED
                gate.set_gate(own, step=step, t_ns=self._now_ns(runner))
            self._note(control, step, runner)
            time.sleep(_HOLD_POLL_S)
            control, stop = self._agree(runner)
        self._note(control, step, runner)
        real = self._apply(control)
        if gate is not None:
            own = control.gate if real else Gate.CLOSED
            gate.set_gate(own, step=step, t_ns=self._now_ns(runner))
        if runner.config.runtime.timed == "alternate":  # both schedules exist
            runner.timed = control.timed
        return stop

    def _apply(self, control: Control) -> bool:
        """Make ``control`` this rank's for the step; whether the rank computes for real.

        A rank that stops computing (or sleeps its first step after calibrating) hands its
        cached device blocks back: the caching allocator would keep its activations' peak
        reserved otherwise, and once the real stage had rotated over every rank the one device
        would hold S peaks at once (S separate GPUs each hold only their own). Rank 0 has
        already taken ``control`` in ``_note`` when it first sees it, so whether the rank
        computed is kept apart from the control."""
        self.control = control
        real = self.is_real
        for c in self.chunks:
            c.is_real = real
        self._slept_last_step = not real
        if not real and self._holds_blocks and self.device.type == "cuda":
            self._sync()
            torch.cuda.empty_cache()
        self._holds_blocks = real
        return real

    def _agree(self, runner: EmulatedRank) -> tuple[Control, bool]:
        """Rank 0's control and whether any rank was asked to stop (one all-reduce)."""
        values = [0] * 6
        if self.rank == 0:
            control = self.control_file.read() or self.control
            values[:5] = control.to_values()
        stop = runner.stop is not None and runner.stop.requested.is_set()
        values[5] = int(stop)
        t = torch.tensor(values, dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        agreed = [int(v) for v in t.tolist()]
        return Control.from_values(agreed[:5]), bool(agreed[5])

    def _note(self, control: Control, step: int, runner: EmulatedRank) -> None:
        if self.rank == 0 and control.seq != self.control.seq:
            self.control_file.note_applied(control.seq, step, self._now_ns(runner))
            self.control = control

    @staticmethod
    def _gate(runner: EmulatedRank) -> EdgeGate | None:
        edges = runner.edges
        return edges if isinstance(edges, EdgeGate) else None

    @staticmethod
    def _now_ns(runner: EmulatedRank) -> int:
        return time.time_ns() + runner.clock_offset_ns

    def memory(self) -> tuple[int, int, str] | None:
        """(peak reserved bytes since the last call, device total, device) on CUDA, else None."""
        if self.device.type != "cuda":
            return None
        peak = torch.cuda.max_memory_reserved(self.device)
        total = torch.cuda.get_device_properties(self.device).total_memory
        torch.cuda.reset_peak_memory_stats(self.device)
        return int(peak), int(total), str(self.device)
