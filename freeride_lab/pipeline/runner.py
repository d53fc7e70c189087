"""``RankRunner``: builds and trains one pipeline rank and turns its steps into events.

``pipeline.rank`` (the torchrun entry point) owns the process: signals, the event sink, how the
rank ends. This module owns what happens in between: ``setup`` joins the process group, syncs
the clock and builds stages, schedule and optimizer (``pipeline.stage_build``); ``run`` trains
step by step and emits each step's ActionTimed, StepTimed, MemoryReport and BubbleEdge events.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from freeride_lab.core.config import RunConfig
from freeride_lab.core.events import (
    ActionTimed,
    BubbleEdge,
    Event,
    MemoryReport,
    RankStarted,
    StepTimed,
)
from freeride_lab.core.schedule import Schedule, stage_indices
from freeride_lab.io.peer_board import AwaitedPeers
from freeride_lab.io.rundir import RunDir
from freeride_lab.pipeline import stage_build
from freeride_lab.pipeline.clock import ClockSync, sync_clock
from freeride_lab.pipeline.emulate import Emulation
from freeride_lab.pipeline.rank_env import RankEnv
from freeride_lab.pipeline.step_clock import StepClock
from freeride_lab.pipeline.stop import StopAgreement, StopControl
from freeride_lab.pipeline.timed_stage import ActionRecorder, BubbleEdges, StepRecord

log = logging.getLogger(__name__)

__all__ = ["RankRunner"]


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
        self.timed: bool | str = config.runtime.timed if timed is None else timed
        if self.timed not in (True, False, "alternate"):
            raise ValueError(f"timed={self.timed!r}; valid: True, False, 'alternate'")
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
        self._batches: stage_build.Batches | None = None
        self._schedules: dict[bool, Any] = {}
        self.recorder: ActionRecorder | None = None
        self.step_clock: StepClock | None = None  # stamps of timed and untimed steps alike
        self.stop_agreement: StopAgreement | None = None
        # step -> its mean loss: a host tensor, and on CUDA the event its copy ends with
        self._losses: dict[int, tuple[torch.Tensor, torch.cuda.Event | None]] = {}
        self.optimizer: torch.optim.Optimizer | None = None
        self.edges: BubbleEdges | None = None
        self.emulation: Emulation | None = None  # emulate mode only (pipeline/emulate.py)
        self._host_memory: tuple[Any, int] | None = None  # (psutil.Process, RAM bytes) on CPU

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
        stage_build.check_torch_supports_layout(
            self.stage_ids, rank=self.env.rank, schedule=self.spec.name, backend=cfg.backend
        )
        timeout = timedelta(seconds=cfg.runtime.pg_timeout_s)
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
        edges = self.edges = stage_build.make_edges(
            cfg.runtime.edges_factory,
            run_dir=self.run_dir,
            rank=self.env.rank,
            clock_offset_ns=self.clock_offset_ns,
        )
        self.step_clock = StepClock(self.device, self.clock_offset_ns)
        self.recorder = ActionRecorder(
            peers=self._awaited_peers(),
            device=self.device,
            clock_offset_ns=self.clock_offset_ns,
            edges=edges,
            predictor=(
                stage_build.make_predictor(cfg.runtime.predictor) if edges is not None else None
            ),
            clock=self.step_clock,
            announce_min_ns=round(cfg.runtime.announce_min_ms * 1e6),
        )
        modules = self._build_modules()
        for m in modules:
            m.to(device=self.device, dtype=self.dtype)  # casts floating tensors only
        params = [p for m in modules for p in m.parameters()]
        self.optimizer = torch.optim.AdamW(params, lr=cfg.lr) if params else None
        plain_loss = (  # emulate mode: real ranks' loss on the device, sleeping ones' stand-in
            self.emulation.loss if self.emulation is not None else stage_build.loss_function(cfg)
        )
        modes = {"alternate": (True, False), True: (True,), False: (False,)}[self.timed]
        # emulate mode: a real rank's W ends when its kernels do ([Note: settled W])
        settle = self.emulation.settle if self.emulation is not None else None
        for timed in modes:
            recorder = self.recorder if timed else None
            stages = [
                stage_build.make_stage(
                    m,
                    i,
                    self.n_stages,
                    self.device,
                    stage_build.example_io(cfg, i, self.n_stages, self.device, self.dtype),
                    recorder=recorder,
                    settle=settle,
                )
                for m, i in zip(modules, self.stage_ids, strict=True)
            ]
            # timed: the loss is part of the last stage's F ([Note: loss in the forward])
            loss_fn = self.recorder.timed_loss(plain_loss) if timed else plain_loss
            self._schedules[timed] = stage_build.make_schedule(
                self.spec, stages, microbatches=cfg.microbatches, loss_fn=loss_fn
            )
        self._batches = stage_build.make_batches(
            cfg, has_first=self.has_first, has_last=self.has_last, dtype=self.dtype
        )
        # [Note: frozen heap] Everything built so far (torch's modules, the model, the schedule)
        # lives for the whole run; moving it out of the collector's reach keeps a full
        # collection (tens of ms with torch loaded) from landing inside a step as a fake bubble.
        gc.collect()
        gc.freeze()

    def _build_modules(self) -> list[nn.Module]:
        cfg = self.config
        if cfg.runtime.emulate is not None:  # emulate mode: real chunks on one device, calibrated
            self.emulation = Emulation.build(
                cfg, self.env.rank, self.stage_ids, self.n_stages, self.run_dir
            )
            self.emulation.calibrate()  # collective; the process group is up by now
            return list(self.emulation.chunks)
        return stage_build.build_modules(cfg, self.stage_ids, self.n_stages)

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
            self.run_step(step, timed=timed, carry=timed and step + 1 < self.config.steps)
            self.steps_done = step + 1
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
            every = self.config.runtime.alternate_every
            return (step // max(1, every)) % 2 == 0
        return bool(self.timed)

    def _agree_stop(self) -> bool:
        """Whether every rank stops before this step: a request reaches all ranks one step
        later, through a host all-reduce that runs behind the step (``StopAgreement``)."""
        requested = self.stop is not None and self.stop.requested.is_set()
        if self.stop_agreement is None:
            return requested
        return self.stop_agreement.poll(requested)

    def run_step(self, step: int, *, timed: bool = True, carry: bool = False) -> list[StepRecord]:
        """One training step: schedule window, optimizer, then the events of every step whose
        times are ready (this one on CPU; on CUDA usually the one before, read off the device
        without waiting: timed_stage [Note: CUDA event timing]).

        ``carry`` (a timed step with another after it): the rank idles from its optimizer's
        end to its next action, one bubble (timed_stage [Note: bubble slots]), opened right
        after the optimizer, before the step's events are written: writing them takes the host
        a fraction of a millisecond, by which the bubble's announcement would lag the device.

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
            records = rec.finish_step()  # the predictor learns the step's slots here (CPU)
            if carry:
                rec.carry_gap(step + 1)
            return self._emit_steps(records)
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
            if self.emulation is not None:  # a real rank's step ends when its kernels do
                self.emulation.settle()

    def _keep_loss(self, step: int, losses: list[torch.Tensor]) -> None:
        """The step's mean loss, copied to the host without waiting. It is read when the
        step's times are, usually a step later and long after the copy; an emulated rank's
        times are ready at once, so the read waits for the copy's event."""
        if not losses:
            return
        mean = torch.stack([x.detach().float() for x in losses]).mean().reshape(1)
        if mean.device.type == "cuda":
            host = torch.empty(1, dtype=mean.dtype, pin_memory=True)
            host.copy_(mean, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record()
            self._losses[step] = (host, copied)
        else:
            self._losses[step] = (mean, None)

    def _emit_steps(self, records: list[StepRecord]) -> list[StepRecord]:
        cfg = self.config
        tokens = cfg.microbatches * cfg.microbatch_size * cfg.seq_len
        for record in records:
            kept = self._losses.pop(record.step, None)
            loss = None
            if kept is not None:
                host, copied = kept
                if copied is not None:
                    copied.synchronize()  # done long ago unless the times came at once
                loss = float(host)
            self._emit_step(record, loss, tokens=tokens)
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

    def _awaited_peers(self) -> AwaitedPeers | None:
        """The run's action boards, where the rank predicts bubbles from its awaited peers'
        ends (``RuntimeOptions.predictor`` "peers"); None otherwise, and on CUDA, whose
        host sees launches, not starts (the rank then predicts from its slots alone)."""
        cfg = self.config
        if cfg.runtime.predictor != "peers":
            return None
        if self.device.type == "cuda":
            log.info("rank %d: predictor 'peers' publishes no starts from a CUDA rank; its "
                     "bubbles are predicted from their slots alone", self.env.rank)  # fmt: skip
            return None
        stage_ranks = {
            stage: rank
            for rank in range(cfg.stages)
            for stage in stage_indices(self.spec, rank, cfg.stages, self.chunks)
        }
        try:
            return AwaitedPeers(self.run_dir.path, self.env.rank, stage_ranks)
        except OSError:  # a prediction aid: training goes on without it
            log.warning("rank %d: no action board; its bubbles are predicted from their "
                        "slots alone", self.env.rank, exc_info=True)  # fmt: skip
            return None

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
        else:  # the process handle and the machine's RAM are read once, not every step
            if self._host_memory is None:
                import psutil

                self._host_memory = (psutil.Process(), psutil.virtual_memory().total)
            process, total = self._host_memory
            peak = process.memory_info().rss
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
