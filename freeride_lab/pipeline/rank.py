"""The training rank: ``python -m freeride_lab.pipeline.rank --run-dir DIR`` under torchrun.

One process per pipeline rank, started by ``python -m torch.distributed.run`` (which sets
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``). It reads the
``RunConfig`` from ``DIR/run.json``, joins the process group (gloo on CPU, NCCL on CUDA), builds
its stage chunk(s), wraps each in a ``TimedPipelineStage`` and trains for ``config.steps`` steps
with the configured ``torch.distributed.pipelining`` schedule, writing events to
``DIR/events/rank-<r>.jsonl``:

    RankStarted                        first, after the process group and clock sync are up
                                       (clock offset, its uncertainty and round trip)
    per step: ActionTimed x actions    one per F/B/I/W this rank ran, in start order
              StepTimed                schedule window, optimizer span, loss (last stage), tokens
              MemoryReport             CUDA: peak reserved / device total; CPU: RSS / RAM
              BubbleEdge x edges       only when a live edges receiver is configured
    RankFinished                       last, after a normal end or a graceful stop
    RankFailed                         instead, on an exception or an aborted stop (exit code 1)

Signals: SIGINT is ignored (a notebook Interrupt must not kill training). SIGTERM asks for a
graceful stop: all ranks agree at the next step boundary and finish; if the current step does
not end within ``extra["stop_grace_s"]`` (default 10 s, e.g. because a peer died), the rank
writes RankFailed and exits. A parent-death watchdog turns the launcher's death into SIGTERM.

``config.extra`` keys read here:
    timed: True (default) | False (plain ``PipelineStage``, no ActionTimed) | "alternate"
        (blocks of ``alternate_every`` steps, default 1, alternately timed and plain, timed
        first, in the same processes; for the overhead benchmark)
    stop_grace_s: float, default 10
    pg_timeout_s: float, default 600 (collective timeout)
    edges_factory: "module:callable" called as ``f(run_dir=RunDir, rank=int)`` → BubbleEdges
    emulate: dict of ``pipeline.emulate.EmulateSpec`` fields: single-GPU emulation (every rank
        builds its real chunk on one device, one rank computes per step, the others sleep its
        calibrated costs; see that module)
"""

from __future__ import annotations

import argparse
import gc
import importlib
import logging
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from datetime import timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import schedules as torch_schedules

from freeride_lab.core.config import RunConfig
from freeride_lab.core.events import (
    ActionTimed,
    BubbleEdge,
    Event,
    MemoryReport,
    RankFailed,
    RankFinished,
    RankStarted,
    StepTimed,
)
from freeride_lab.core.schedule import Schedule, stage_indices
from freeride_lab.io.rundir import RunDir
from freeride_lab.io.sink import EventSink
from freeride_lab.pipeline.clock import ClockSync, sync_clock
from freeride_lab.pipeline.data import SyntheticBatches, TextBatches
from freeride_lab.pipeline.emulate import EMULATE_KEY, Emulation
from freeride_lab.pipeline.models import GPTConfig, build_stage_chunks
from freeride_lab.pipeline.step_clock import StepClock
from freeride_lab.pipeline.stop import StopAgreement, StopControl
from freeride_lab.pipeline.synthetic import build_sleep_chunks
from freeride_lab.pipeline.timed_stage import (
    ActionRecorder,
    BubbleEdges,
    SlotPredictorLike,
    StepRecord,
    TimedPipelineStage,
)

log = logging.getLogger(__name__)

__all__ = ["RankEnv", "RankRunner", "main"]

# Once a rank has recorded how it ended, closing (watcher, edges receiver, process group) gets
# this long before the process leaves anyway: a dead launcher took the rendezvous store along.
_CLOSE_LIMIT_S = 10.0


class RankEnv:
    """This process's place in the job, from torchrun's environment variables."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        missing = [k for k in ("RANK", "WORLD_SIZE") if k not in env]
        if missing:
            raise RuntimeError(
                f"environment variables {missing} are not set; start ranks with "
                "`python -m torch.distributed.run ... -m freeride_lab.pipeline.rank --run-dir DIR`"
            )
        self.rank = int(env["RANK"])
        self.world_size = int(env["WORLD_SIZE"])
        self.local_rank = int(env.get("LOCAL_RANK", "0"))

    def __repr__(self) -> str:
        return (
            f"RankEnv(rank={self.rank}, world_size={self.world_size}, local_rank={self.local_rank})"
        )


class RankRunner:
    """Builds and trains one pipeline rank; emits its events through one ``emit``.

    ``setup()`` joins the process group and builds stages and schedule; ``run()`` trains and
    returns the number of steps completed. The caller owns error handling and ``close()``.
    """

    def __init__(
        self,
        config: RunConfig,
        env: RankEnv,
        run_dir: RunDir,
        *,
        emit: Callable[[Event], bool],
        stop: StopControl | None = None,
        timed: bool | str | None = None,
    ) -> None:
        self.config = config
        self.env = env
        self.run_dir = run_dir
        self.emit = emit
        self.stop = stop
        self.spec = Schedule.from_name(config.schedule)
        extra = config.extra
        self.timed: bool | str = extra.get("timed", True) if timed is None else timed
        if self.timed not in (True, False, "alternate"):
            raise ValueError(f"extra['timed']={self.timed!r}; valid: True, False, 'alternate'")
        if config.stages != env.world_size:
            raise ValueError(
                f"config.stages={config.stages} but WORLD_SIZE={env.world_size}: run one "
                "process per stage (torchrun --nnodes x --nproc-per-node = stages)"
            )
        assert config.chunks is not None  # resolved by RunConfig
        self.chunks: int = config.chunks
        self.n_stages = config.stages * self.chunks
        self.stage_ids = stage_indices(self.spec, env.rank, config.stages, self.chunks)
        self.has_first = 0 in self.stage_ids
        self.has_last = self.n_stages - 1 in self.stage_ids
        self.device = (
            torch.device("cuda", env.local_rank) if config.device == "cuda" else torch.device("cpu")
        )
        self.dtype = torch.bfloat16 if config.dtype == "bfloat16" else torch.float32
        self.clock_offset_ns = 0
        self.clock: ClockSync | None = None
        self.steps_done = 0
        self._batches: Iterator[tuple[torch.Tensor, torch.Tensor]] | None = None
        self._schedules: dict[bool, Any] = {}
        self.recorder: ActionRecorder | None = None
        self.step_clock: StepClock | None = None  # stamps of timed and untimed steps alike
        self.stop_agreement: StopAgreement | None = None
        self._losses: dict[int, Any] = {}  # step -> its mean loss (a host tensor on CUDA)
        self.optimizer: torch.optim.Optimizer | None = None
        self.edges: BubbleEdges | None = None
        self.emulation: Emulation | None = None  # emulate mode only (pipeline/emulate.py)

    def __repr__(self) -> str:
        return (
            f"RankRunner(rank={self.env.rank}, stages={self.stage_ids}, "
            f"schedule={self.spec.name!r}, steps_done={self.steps_done})"
        )

    # -- setup -----------------------------------------------------------------------------

    def setup(self) -> None:
        """Join the process group, sync clocks, build stages, schedule and optimizer."""
        cfg = self.config
        if self.device.type == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError(
                    "config.device='cuda' but torch.cuda.is_available() is False; "
                    "use device='cpu' or run on a CUDA machine"
                )
            torch.cuda.set_device(self.device)
        self._check_torch_supports_layout()
        timeout = timedelta(seconds=float(cfg.extra.get("pg_timeout_s", 600)))
        dist.init_process_group(backend=cfg.backend, timeout=timeout)
        clock = self.clock = sync_clock()
        self.clock_offset_ns = clock.offset_ns
        log.info(
            "rank %d clock offset %d ns ± %d ns (rtt %d ns, measured %d ns, same host %s)",
            self.env.rank,
            clock.offset_ns,
            clock.uncertainty_ns,
            clock.rtt_ns,
            clock.measured_offset_ns,
            clock.same_host,
        )
        if clock.same_host and abs(clock.measured_offset_ns) > clock.rtt_ns // 2 + 1_000:
            log.warning(  # one clock, so the exchange must find ~0: its transport misbehaves
                "rank %d shares rank 0's clock but the exchange measured %d ns (rtt %d ns)",
                self.env.rank,
                clock.measured_offset_ns,
                clock.rtt_ns,
            )
        # stop requests travel on the host: a gloo group of its own on NCCL runs
        group = None if cfg.backend == "gloo" else dist.new_group(backend="gloo")
        self.stop_agreement = StopAgreement(group)
        edges = self.edges = self._make_edges()
        self.step_clock = StepClock(self.device, self.clock_offset_ns)
        self.recorder = ActionRecorder(
            device=self.device,
            clock_offset_ns=self.clock_offset_ns,
            edges=edges,
            predictor=self._make_predictor() if edges is not None else None,
            clock=self.step_clock,
        )
        modules = self._build_modules()
        for m in modules:
            m.to(device=self.device, dtype=self.dtype)  # casts floating tensors only
        params = [p for m in modules for p in m.parameters()]
        self.optimizer = torch.optim.AdamW(params, lr=cfg.lr) if params else None
        plain_loss = _text_loss if cfg.workload == "text" else _synthetic_loss
        modes = {"alternate": (True, False), True: (True,), False: (False,)}[self.timed]
        for timed in modes:
            pairs = zip(modules, self.stage_ids, strict=True)
            stages = [self._make_stage(m, i, timed) for m, i in pairs]
            # timed: the loss is part of the last stage's F ([Note: loss in the forward])
            loss_fn = self.recorder.timed_loss(plain_loss) if timed else plain_loss
            cls = getattr(torch_schedules, self.spec.torch_class, None)
            if cls is None:
                raise RuntimeError(
                    f"schedule {self.spec.name} ({self.spec.torch_class}) is not in torch "
                    f"{torch.__version__}; pick another schedule or upgrade torch"
                )
            if self.spec.multi:
                self._schedules[timed] = cls(
                    stages, n_microbatches=cfg.microbatches, loss_fn=loss_fn
                )
            else:
                self._schedules[timed] = cls(
                    stages[0], n_microbatches=cfg.microbatches, loss_fn=loss_fn
                )
        self._batches = self._make_batches()
        # [Note: frozen heap] Everything built so far (torch's modules, the model, the schedule)
        # lives for the whole run; moving it out of the collector's reach keeps a full
        # collection (tens of ms with torch loaded) from landing inside a step as a fake bubble.
        gc.collect()
        gc.freeze()

    def _check_torch_supports_layout(self) -> None:
        """Refuse a layout that older torch cannot run on gloo, before any process group.

        [Note: adjacent stages on one rank]
        When a rank holds two adjacent stages (V schedules; or any multi-stage schedule on one
        rank), torch 2.13 hands the activation over locally. Torch 2.11 sent it to the same
        rank through gloo instead, which fails with "Pair is not connected" (seen with ZBV,
        DualPipeV and a one-rank Interleaved1F1B); 2.13 runs all seven schedules on gloo.
        """
        ids = self.stage_ids
        adjacent = any(b - a == 1 for a, b in pairwise(ids))
        version = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
        if adjacent and self.config.backend == "gloo" and version < (2, 13):
            raise RuntimeError(
                f"rank {self.env.rank} holds adjacent stages {ids} ({self.spec.name}); torch "
                f"{torch.__version__} on gloo sends between them through itself and fails "
                "('Pair is not connected'): use torch >= 2.13, NCCL, or a loop-style schedule "
                "with more ranks"
            )

    def _build_modules(self) -> list[nn.Module]:
        cfg = self.config
        if cfg.extra.get(EMULATE_KEY):  # emulate mode: real chunks on one device, calibrated
            self.emulation = Emulation.build(
                cfg, self.env.rank, self.stage_ids, self.n_stages, self.run_dir
            )
            self.emulation.calibrate()  # collective; the process group is up by now
            return list(self.emulation.chunks)
        if cfg.workload == "synthetic":
            costs = cfg.stage_costs_ms()  # per global stage: each chunk its own costs
            return list(build_sleep_chunks(cfg.d_model, [costs[s] for s in self.stage_ids]))
        gpt = GPTConfig(
            seq_len=cfg.seq_len,
            layers=cfg.layers,
            d_model=cfg.d_model,
            heads=cfg.heads,
            seed=cfg.seed,
        )
        chunks = build_stage_chunks(gpt, self.n_stages, only=self.stage_ids)
        return [chunks[i] for i in self.stage_ids]

    def _example_io(self, stage: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Static example input/output of a stage for one micro-batch.

        [Note: static stage metadata]
        Given these, torch skips shape inference (which hangs with backward on gloo in torch
        2.13). In static mode torch copies each example's ``requires_grad`` into the metadata:
        an activation example without ``requires_grad=True`` makes the received activation a
        non-grad tensor and drops the output-gradient receive, so the previous stage backs
        up with a ``None`` gradient. Float activations and outputs therefore require grad.
        """
        cfg = self.config
        mb, T, D = cfg.microbatch_size, cfg.seq_len, cfg.d_model
        hidden = torch.empty(
            mb, T, D, dtype=self.dtype, device=self.device, requires_grad=True
        )  # (mb, T, D)
        if cfg.workload == "synthetic":
            return hidden, hidden
        tokens = torch.empty(mb, T, dtype=torch.int64, device=self.device)  # (mb, T)
        logits = torch.empty(
            mb, T, 256, dtype=self.dtype, device=self.device, requires_grad=True
        )  # (mb, T, V)
        return (
            tokens if stage == 0 else hidden,
            logits if stage == self.n_stages - 1 else hidden,
        )

    def _make_stage(self, module: nn.Module, stage: int, timed: bool) -> PipelineStage:
        inp, out = self._example_io(stage)
        if timed:
            assert self.recorder is not None
            return TimedPipelineStage(
                module,
                stage,
                self.n_stages,
                self.device,
                input_args=(inp,),
                output_args=(out,),
                recorder=self.recorder,
            )
        return PipelineStage(
            module, stage, self.n_stages, self.device, input_args=(inp,), output_args=(out,)
        )

    def _make_batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]] | None:
        cfg = self.config
        if not (self.has_first or self.has_last):
            return None  # middle ranks get activations, not data
        batch = cfg.microbatch_size * cfg.microbatches
        if cfg.workload == "synthetic":
            return SyntheticBatches(
                seq_len=cfg.seq_len,
                batch=batch,
                d_model=cfg.d_model,
                seed=cfg.seed,
                dtype=self.dtype,
            )
        return TextBatches(seq_len=cfg.seq_len, batch=batch, seed=cfg.seed, text_path=cfg.text_path)

    def _make_edges(self) -> BubbleEdges | None:
        spec = self.config.extra.get("edges_factory")
        if not spec:
            return None
        module_name, _, attr = str(spec).partition(":")
        if not attr:
            raise ValueError(
                f"extra['edges_factory']={spec!r} is not 'module:callable'; "
                "e.g. 'freeride_lab.sidetasks.client:open_edges'"
            )
        factory = getattr(importlib.import_module(module_name), attr)
        edges: BubbleEdges = factory(run_dir=self.run_dir, rank=self.env.rank)
        set_offset = getattr(edges, "set_clock_offset", None)
        if callable(set_offset):  # edges carry run-clock times, like the events
            set_offset(self.clock_offset_ns)
        return edges

    def _make_predictor(self) -> SlotPredictorLike | None:
        try:
            from freeride_lab.core.bubbles import SlotPredictor
        except ImportError:
            log.warning(
                "freeride_lab.core.bubbles.SlotPredictor unavailable; "
                "bubble edges carry no predicted end"
            )
            return None
        predictor: SlotPredictorLike = SlotPredictor(k=5, method="min")
        return predictor

    # -- training --------------------------------------------------------------------------

    def started_event(self) -> RankStarted:
        return RankStarted(
            rank=self.env.rank,
            world_size=self.env.world_size,
            stages=tuple(self.stage_ids),
            pid=os.getpid(),
            host=socket.gethostname(),
            device=str(self.device),
            t_ns=time.time_ns() + self.clock_offset_ns,
            clock_offset_ns=self.clock_offset_ns,
            clock_uncertainty_ns=self.clock.uncertainty_ns if self.clock is not None else 0,
            clock_rtt_ns=self.clock.rtt_ns if self.clock is not None else 0,
        )

    def run(self) -> int:
        """Train ``config.steps`` steps (fewer after an agreed stop); returns steps done."""
        assert self.recorder is not None and self.step_clock is not None
        for step in range(self.config.steps):
            if self.emulation is not None:  # emulate mode: who computes this step, gates, hold
                stop = self.emulation.before_step(self, step)  # its agreement carries stops
            else:
                stop = self._agree_stop()
            if stop:
                log.warning("rank %d stopping after %d steps", self.env.rank, self.steps_done)
                break
            timed = self.is_timed_step(step)
            self.run_step(step, timed=timed)
            self.steps_done = step + 1
            if timed and self.steps_done < self.config.steps:
                # idle from here to the next action: one bubble (timed_stage [Note: bubble slots])
                self.recorder.carry_gap(self.steps_done)
        else:
            if self.stop_agreement is not None:
                self.stop_agreement.finish()
            dist.barrier()  # nobody leaves while a peer still needs it
        self.recorder.close_gap()
        self._emit_steps(self.step_clock.flush())
        return self.steps_done

    def is_timed_step(self, step: int) -> bool:
        """Whether ``step`` runs the timed stages (always, never, or by alternating blocks)."""
        if self.timed == "alternate":
            every = int(self.config.extra.get("alternate_every", 1))
            return (step // max(1, every)) % 2 == 0
        return bool(self.timed)

    def _agree_stop(self) -> bool:
        """Whether every rank stops before this step: a request reaches all ranks one step
        later, through a host all-reduce that runs behind the step (``StopAgreement``)."""
        requested = self.stop is not None and self.stop.requested.is_set()
        if self.stop_agreement is None:
            return requested
        return self.stop_agreement.poll(requested)

    def run_step(self, step: int, *, timed: bool = True) -> list[StepRecord]:
        """One training step: schedule window, optimizer, then the events of every step whose
        times are ready (this one on CPU; on CUDA usually the one before, read off the device
        without waiting: timed_stage [Note: CUDA event timing]).

        An untimed step (the plain ``PipelineStage``, the baseline that instrumentation is
        measured against) does not touch the recorder: it takes four stamps of the step clock,
        as a timed step does for its window and optimizer, and nothing per action.
        """
        assert self.recorder is not None and self.step_clock is not None
        args: tuple[torch.Tensor, ...] = ()
        target = None
        if self._batches is not None:
            inputs, targets = next(self._batches)
            if self.has_first:
                args = (self._to_device(inputs),)
            if self.has_last:
                target = self._to_device(targets)
        losses: list[torch.Tensor] = []
        schedule = self._schedules[timed]
        if timed:
            rec = self.recorder
            rec.begin_step(step)
            schedule.step(*args, target=target, losses=losses if self.has_last else None)
            rec.end_window()
            self._keep_loss(step, losses)
            rec.mark("optimizer_start")
            self._optimizer_step()
            rec.mark("optimizer_end")
            return self._emit_steps(rec.finish_step())
        self.recorder.close_gap()  # a bubble carried from a timed step ends here
        clock = self.step_clock
        marks = {"window_start": clock.begin_step()}
        schedule.step(*args, target=target, losses=losses if self.has_last else None)
        marks["window_end"] = clock.stamp()
        self._keep_loss(step, losses)
        marks["optimizer_start"] = clock.stamp()
        self._optimizer_step()
        marks["optimizer_end"] = last = clock.stamp()
        clock.defer(
            last,
            lambda resolve: StepRecord(step, [], {k: resolve(v) for k, v in marks.items()}),
        )
        return self._emit_steps(clock.ready())

    def _to_device(self, batch: torch.Tensor) -> torch.Tensor:
        """A host batch on the rank's device; on CUDA through pinned memory, so the copy is
        queued on the stream instead of making the host wait for it."""
        if self.device.type != "cuda":
            return batch
        return batch.pin_memory().to(self.device, non_blocking=True)

    def _optimizer_step(self) -> None:
        if self.optimizer is not None:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    def _keep_loss(self, step: int, losses: list[torch.Tensor]) -> None:
        """The step's mean loss, copied to the host without waiting (read when the step's
        times are: by then the copy is done)."""
        if not losses:
            return
        mean = torch.stack([x.detach().float() for x in losses]).mean().reshape(1)
        if mean.device.type == "cuda":
            host = torch.empty(1, dtype=mean.dtype, pin_memory=True)
            host.copy_(mean, non_blocking=True)
            self._losses[step] = host
        else:
            self._losses[step] = mean

    def _emit_steps(self, records: list[StepRecord]) -> list[StepRecord]:
        cfg = self.config
        tokens = cfg.microbatches * cfg.microbatch_size * cfg.seq_len
        for record in records:
            loss = self._losses.pop(record.step, None)
            self._emit_step(record, None if loss is None else float(loss), tokens=tokens)
        return records

    def _emit_step(self, record: StepRecord, loss: float | None, *, tokens: int) -> None:
        rank = self.env.rank
        for span in record.spans:
            self.emit(
                ActionTimed(
                    rank=rank,
                    stage=span.stage,
                    step=record.step,
                    action=span.kind.value,
                    microbatch=span.microbatch,
                    start_ns=span.start_ns,
                    end_ns=span.end_ns,
                )
            )
        m = record.marks
        self.emit(
            StepTimed(
                rank=rank,
                step=record.step,
                start_ns=m["window_start"],
                end_ns=m["window_end"],
                optimizer_start_ns=m["optimizer_start"],
                optimizer_end_ns=m["optimizer_end"],
                loss=loss,
                tokens=tokens,
            )
        )
        self.emit(self._memory(record.step))
        assert self.recorder is not None
        low = min(self.stage_ids)
        for e in self.recorder.drain_edges():
            self.emit(
                BubbleEdge(
                    rank=rank,
                    stage=low,
                    step=e.step,
                    slot=e.slot,
                    edge=e.edge,
                    t_ns=e.t_ns,
                    predicted_end_ns=e.predicted_end_ns,
                )
            )

    def _memory(self, step: int) -> MemoryReport:
        emulated = self.emulation.memory() if self.emulation is not None else None
        if emulated is not None:  # emulate mode on CUDA: this rank's chunks on the device
            peak, total, device = emulated
            return MemoryReport(
                rank=self.env.rank,
                step=step,
                peak_reserved_bytes=peak,
                capacity_bytes=total,
                device=device,
            )
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_reserved(self.device)
            total = torch.cuda.get_device_properties(self.device).total_memory
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            import psutil

            peak = psutil.Process().memory_info().rss
            total = psutil.virtual_memory().total
        return MemoryReport(
            rank=self.env.rank,
            step=step,
            peak_reserved_bytes=int(peak),
            capacity_bytes=int(total),
            device=str(self.device),
        )

    def close(self, *, destroy_group: bool = True) -> None:
        """Release the recorder's watcher, close the edges receiver (its side-task worker
        checkpoints and stops) and, unless ``destroy_group`` is False, the process group.
        Idempotent; never raises."""
        if self.recorder is not None:
            self.recorder.close()
        edges, self.edges = self.edges, None
        close_edges = getattr(edges, "close", None)
        if callable(close_edges):
            try:
                close_edges()
            except Exception:  # the worker's trouble must not hide how training ended
                log.warning("closing the bubble-edge receiver failed", exc_info=True)
        if destroy_group and dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # training has ended and been recorded; exit regardless
                log.warning("destroying the process group failed", exc_info=True)


def _text_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-byte cross-entropy: logits (B, T, V), targets (B, T) int64."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _synthetic_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error on (B, T, D) tensors (its value is meaningless; its backward is not)."""
    return F.mse_loss(output.float(), target.float())


def _error_line(exc: BaseException) -> str:
    """One line naming the error and its causes: ``Type: first line <- Cause: first line``."""
    parts: list[str] = []
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen and len(parts) < 4:
        seen.add(id(e))
        first = next((x.strip() for x in str(e).splitlines() if x.strip()), "")
        parts.append(f"{type(e).__name__}: {first}" if first else type(e).__name__)
        e = e.__cause__ or e.__context__
    return " <- ".join(parts)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code (0 ok, 1 failed or aborted)."""
    parser = argparse.ArgumentParser(
        prog="python -m freeride_lab.pipeline.rank",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    parser.add_argument("--run-dir", required=True, type=Path, help="run directory with run.json")
    parser.add_argument(
        "--plain",
        action="store_true",
        help="use plain PipelineStage (no action timing), for benchmarks",
    )
    parser.add_argument("--log-level", default=os.environ.get("FREERIDE_LOG_LEVEL", "INFO"))
    ns = parser.parse_args(argv)
    env = RankEnv()
    logging.basicConfig(
        level=ns.log_level.upper(),
        format=f"%(asctime)s rank{env.rank} %(levelname)s %(name)s: %(message)s",
    )
    run_dir = RunDir(ns.run_dir)
    stop = StopControl()
    stop.install()
    sink = (
        EventSink.for_rank(run_dir, env.rank)  # also forwards to the live bus, when one is set
        if hasattr(EventSink, "for_rank")
        else EventSink(run_dir.rank_events(env.rank))
    )

    runner: RankRunner | None = None

    def fail(message: str, tb: str = "") -> None:
        offset = runner.clock_offset_ns if runner is not None else 0
        sink.emit(
            RankFailed(rank=env.rank, t_ns=time.time_ns() + offset, error=message, traceback=tb)
        )
        sink.close()

    stop.on_abort = fail
    try:
        config = RunConfig.from_dict(run_dir.read_run()["config"])
        stop.grace_s = float(config.extra.get("stop_grace_s", stop.grace_s))
        runner = RankRunner(
            config, env, run_dir, emit=sink.emit, stop=stop, timed=False if ns.plain else None
        )
        runner.setup()
        sink.emit(runner.started_event())
        steps = runner.run()
        stop.done()
        offset = runner.clock_offset_ns
        sink.emit(
            RankFinished(
                rank=env.rank,
                steps=steps,
                t_ns=time.time_ns() + offset,
                dropped_events=sink.dropped,
            )
        )
        sink.close()
        stop.exit_within(_CLOSE_LIMIT_S, code=0)  # the end is recorded; closing may not hang us
        runner.close()
        return 0
    except BaseException as exc:
        stop.done()
        line = _error_line(exc)
        log.exception("rank %d failed", env.rank)
        fail(line, traceback.format_exc())
        stop.exit_within(_CLOSE_LIMIT_S, code=1)
        if runner is not None:
            # The process group is left to process exit: destroying it can hang when a peer died.
            runner.close(destroy_group=False)
        return 1


if __name__ == "__main__":
    # [Note: fast exit] Events are closed and the process group destroyed by now; skipping the
    # interpreter's teardown of torch's modules saves seconds per rank on a small CPU box.
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
