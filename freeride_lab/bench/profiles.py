"""The benchmark's profiles: which runs, cases, modes and sizes ``freeride-lab bench`` covers.

``bench_profile(name, device)`` gives a ``BenchProfile`` (quick, full or tiny on cuda or cpu);
each ``RunPlan`` in it is one pipeline run. ``GOALS`` holds the targets the results are
checked against.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from freeride_lab.bench import stats as bs
from freeride_lab.core.budget import tight_step_budget_s
from freeride_lab.core.config import RunConfig
from freeride_lab.core.runtime_options import (
    EmulateOptions,
    ReplayCosts,
    RuntimeOptions,
    replay_costs,
)

__all__ = [
    "GOALS",
    "MIX",
    "PROFILES",
    "BenchProfile",
    "RunPlan",
    "Segment",
    "bench_profile",
    "instrumentation_stage",
    "run_config",
    "run_segments",
]

#: FreeRide's mix (paper notes §12): one task per stage, in stage order.
MIX: tuple[str, ...] = ("pagerank", "resnet18", "image", "vgg19")
PROFILES: tuple[str, ...] = ("quick", "full", "tiny")
_OPEN_ENDED = {"tol": 0.0, "max_iterations": None}  # PageRank's cpu preset would converge
#: CPU runs: side-task steps small enough for a CPU pipeline's bubbles (tens of ms).
_CPU_TASK_OPTIONS: dict[str, dict[str, Any]] = {
    "pagerank": {"n_nodes": 20_000, "n_edges": 100_000, **_OPEN_ENDED},
    "resnet18": {"batch_size": 2, "image_size": 32},
    "resnet50": {"batch_size": 1, "image_size": 32},
    "vgg19": {"batch_size": 1, "image_size": 32},
    "sgd_mf": {"batch_edges": 4096},
}
#: GPU runs: the vision tasks step in slices of a batch replayed as CUDA graphs, which filled
#: more of the bubbles on the H200 than whole eager batches (BENCHMARKS.md, "steps as CUDA
#: graphs"); ``{"cuda_graphs": false, "micro_batches": 1}`` gives FreeRide's whole batches.
#: The image task's band steps are replayed as graphs too, which on the H100 took 14 points
#: more of the measured idle on the stages whose short bubbles it filled (BENCHMARKS.md, "the
#: image task's band step, in blocks and graphed").
_GPU_TASK_OPTIONS: dict[str, dict[str, Any]] = {
    "resnet18": {"cuda_graphs": True, "micro_batches": 2},
    "vgg19": {"cuda_graphs": True, "micro_batches": 4},
    "image": {"cuda_graphs": True},
}
_SHORT = ("vanilla", "managed", "naive")  # the later runs of --quick: no governor blocks

#: The benchmark's goals, with FreeRide's published numbers (paper notes §14) beside them.
GOALS: dict[str, Any] = {
    "overhead_mean_frac_max": 0.003,  # one stage harvesting at a time, mean over stages
    "overhead_worst_frac_max": 0.006,
    "overhead_all_stages_frac_max": 0.01,  # the estimate with every stage harvesting
    "harvest_of_limit_frac_min": 0.9,
    "saving_corrected_frac_min": 0.10,
    "freeride_published": {
        "overhead_mean": 0.0091,
        "overhead_worst": 0.021,
        "saving_published": 0.0785,
        "saving_corrected": 0.0694,
    },
}


@dataclass(frozen=True, kw_only=True)
class RunPlan:
    """One pipeline run: M, MPS or time-slicing, which cases and real stages it covers.

    Args:
        cases: "mix" (``MIX[stage]`` on each stage) and/or built-in task names (that task on
            every real stage); segments go case by case, stage by stage.
        real_stages: ranks that take turns computing for real; None = all.
        instrumentation: start with timed-vs-plain blocks (no side tasks).
        modes: this run's modes; None = the profile's.
    """

    name: str
    microbatches: int
    mps: bool = False
    cases: tuple[str, ...] = ("mix",)
    real_stages: tuple[int, ...] | None = None
    instrumentation: bool = False
    modes: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.modes is not None:
            bs.interleave(self.modes, 1)  # validates the names
            if self.modes[0] != "vanilla":
                raise ValueError(f"modes={self.modes} must start with 'vanilla' (the baseline)")


@dataclass(frozen=True, kw_only=True)
class BenchProfile:
    """Everything a benchmark does; ``bench_profile`` makes the named ones.

    Model sizes are those of the *real* GPT (``d_model``, ``heads``, ``layers`` over all S·v
    chunks); ``wire_d_model`` is the width of the tensors between stages (see
    ``pipeline.emulate`` [Note: wire width]). ``time_budget_s`` bounds the whole benchmark: a
    segment that would not finish in time is skipped (and listed as skipped).
    """

    name: str
    device: str
    runs: tuple[RunPlan, ...]
    schedule: str = "1F1B"
    chunks: int | None = None  # stage chunks per rank; None: the schedule's default
    stages: int = 4
    modes: tuple[str, ...] = ("vanilla", "managed", "governed", "naive")
    repeats: int = 5  # blocks per mode: the 95% intervals need at least five
    block_steps: int = 4
    drop_steps: int = 1
    instrumentation_repeats: int = 5
    solo_steps: int = 20  # a solo phase lasts at least solo_steps measured steps ...
    solo_min_s: float = 2.0  # ... and solo_min_s seconds (both), at most solo_max_s
    solo_max_s: float = 8.0
    layers: int = 16
    d_model: int = 4096
    heads: int = 32
    seq_len: int = 2048
    microbatch_size: int = 3  # FreeRide's micro-batch (paper notes §12)
    wire_d_model: int = 256
    dtype: str = "bfloat16"
    loss_on: str = "device"  # where a real last stage's loss runs (``EmulateOptions``)
    task_preset: str = "gpu"
    task_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    governor_target_frac: float = 0.005
    #: the governors of governed and trickle blocks back off on board power near its cap and
    #: SM clock drops too (``core.governor``); False: on step time alone
    governor_device_signals: bool = True
    #: the confidence a governor decision needs (``OverheadGovernor.evidence``): 0.95 acts on
    #: a 95% one-sided bound of the overhead since its last change; 0.5 on the mean alone
    governor_evidence: float = 0.95
    #: the guard governed blocks start from: the solo step's p95 x factor + slack
    #: (``core.budget.tight_step_budget_s``); a sized step's guard keeps it in proportion
    governed_guard_factor: float = 1.1
    governed_guard_slack_ms: float = 0.5
    #: every rank's costs for the emulated peers to replay instead of this run's calibration
    #: (``EmulateOptions.costs``; ``--peer-costs`` reads them from a result): the arms of an
    #: A/B in separate invocations then sleep alike; () calibrates anew
    peer_costs: tuple[ReplayCosts, ...] = ()
    #: the real rank announces bubbles predicted at least this long (``RuntimeOptions``)
    announce_min_ms: float = 1.0
    #: side-task steps shorter than this run in groups of about this length (``RuntimeOptions``)
    step_group_ms: float = 1.0
    #: how the real rank predicts bubble lengths (``RuntimeOptions.predictor``)
    predictor: str = "min"
    #: what the side task's host does once a bubble outlives its prediction
    #: (``RuntimeOptions.outlived``)
    outlived: str = "stop"
    #: a built-in task attached beside every segment's task on its stage with gating
    #: "leftovers" (``host.iterative`` [Note: leftovers]): the segment's side work is then
    #: both tasks', each valued at its own dedicated speed; "" = none. Not beside itself: a
    #: task's leftovers are what its own steps and guard cannot use
    leftovers: str = ""
    time_budget_s: float = 330.0
    startup_estimate_s: float = 60.0
    attach_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        bs.interleave(self.modes, self.repeats)  # validates the modes
        if self.modes[0] != "vanilla":
            raise ValueError(f"modes={self.modes} must start with 'vanilla' (the baseline)")
        for name in ("block_steps", "stages", "solo_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.drop_steps < 0:
            raise ValueError(f"drop_steps={self.drop_steps} must be >= 0")
        if not 0 <= self.solo_min_s <= self.solo_max_s:
            raise ValueError(
                f"solo_min_s={self.solo_min_s}, solo_max_s={self.solo_max_s}: need "
                "0 <= solo_min_s <= solo_max_s"
            )
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device={self.device!r}; valid: cpu, cuda")
        if not 0.5 <= self.governor_evidence < 1:
            raise ValueError(
                f"governor_evidence={self.governor_evidence} must be in [0.5, 1) (0.95: a 95% "
                "one-sided bound; 0.5: the mean alone)"
            )
        peer_costs = replay_costs(self.peer_costs)
        object.__setattr__(self, "peer_costs", peer_costs)
        if peer_costs and len(peer_costs) != self.stages:
            raise ValueError(
                f"peer_costs for {len(peer_costs)} ranks; the profile has {self.stages} stages"
            )
        tight_step_budget_s(
            0.001, factor=self.governed_guard_factor, slack_s=self.governed_guard_slack_ms / 1e3
        )
        # their one check, before any run
        RuntimeOptions(
            announce_min_ms=self.announce_min_ms,
            step_group_ms=self.step_group_ms,
            predictor=self.predictor,
            outlived=self.outlived,
        )
        for plan in self.runs:  # an unknown schedule or chunk count, before any run
            RunConfig(
                schedule=self.schedule, stages=self.stages, microbatches=plan.microbatches,
                chunks=self.chunks, steps=1,
            )  # fmt: skip

    def replace(self, **changes: Any) -> BenchProfile:
        return dataclasses.replace(self, **changes)


def bench_profile(name: str, device: str) -> BenchProfile:
    """The named profile for ``device`` ("cuda" or "cpu").

    - quick: the ≤ 7-minute GPU budget: FreeRide's mix at M=4, time-sliced, on every stage
      (instrumentation blocks first); then stage 1 (ResNet-18) again under MPS, and at M=8,
      as far as the time budget goes.
    - full: every built-in task and the mix, M=4 and M=8, with and without MPS, more repeats.
    - tiny: a CPU smoke test (S=2, tiny GPT, a small PageRank).

    On "cpu", quick and full keep their plan but shrink the model and use the tasks' cpu preset.

    Raises:
        ValueError: an unknown name (the message lists ``PROFILES``) or device.
    """
    if name not in PROFILES:
        raise ValueError(f"unknown bench profile {name!r}; valid: {', '.join(PROFILES)}")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r}; valid: cpu, cuda")
    if name == "tiny":
        return BenchProfile(
            name="tiny", device="cpu", stages=2, layers=4, d_model=128, heads=4, seq_len=64,
            microbatch_size=4, wire_d_model=32, dtype="float32", task_preset="cpu",
            task_options={"pagerank": {"n_nodes": 2000, "n_edges": 10000, **_OPEN_ENDED}},
            runs=(RunPlan(name="m4", microbatches=4, cases=("pagerank",), instrumentation=True),),
            block_steps=2, drop_steps=1, solo_max_s=4.0, time_budget_s=600.0,
            startup_estimate_s=20.0,
        )  # fmt: skip
    gpu = device == "cuda"
    runs: tuple[RunPlan, ...]
    if name == "quick":
        runs = (
            RunPlan(name="m4-timeslice", microbatches=4, instrumentation=True),
            RunPlan(name="m4-mps", microbatches=4, mps=True, real_stages=(1,), modes=_SHORT),
            RunPlan(name="m8-timeslice", microbatches=8, real_stages=(1,), modes=_SHORT),
        )
        base = BenchProfile(name="quick", device=device, runs=runs)
    else:
        every = ("mix", "resnet18", "resnet50", "vgg19", "pagerank", "sgd_mf", "image")
        runs = tuple(
            RunPlan(name=f"m{m}-{'mps' if mps else 'timeslice'}", microbatches=m, mps=mps,
                    cases=every, instrumentation=(m == 4 and not mps))
            for m in (4, 8) for mps in ((False, True) if gpu else (False,))
        )  # fmt: skip
        base = BenchProfile(
            name="full", device=device, runs=runs, repeats=6, block_steps=8, solo_steps=30,
            instrumentation_repeats=6, time_budget_s=6 * 3600.0,
        )  # fmt: skip
    if gpu:
        return base.replace(task_options=_GPU_TASK_OPTIONS)
    return base.replace(
        runs=tuple(r for r in base.runs if not r.mps),  # no MPS without a GPU
        layers=base.stages * 2, d_model=256, heads=4, seq_len=128, microbatch_size=4,
        wire_d_model=32, dtype="float32", task_preset="cpu", startup_estimate_s=30.0,
        task_options=_CPU_TASK_OPTIONS,
        time_budget_s=base.time_budget_s * 3,
    )  # fmt: skip


@dataclass
class Segment:
    """One segment of a run: a side task on a real stage (``task_id`` once attached)."""

    case: str
    stage: int
    task: str
    task_id: str = ""
    leftovers: str = ""  # the task beside it with gating "leftovers" ("" = none)
    leftovers_id: str = ""


def run_segments(
    p: BenchProfile, plan: RunPlan, done: frozenset[tuple[str, int]] = frozenset()
) -> list[Segment]:
    """The run's segments, case by case and stage by stage, less the (case, stage) pairs in
    ``done`` (measured by an earlier call: ``bench.resume``)."""
    out = []
    for case in plan.cases:
        for s in plan.real_stages or range(p.stages):
            if (case, s) not in done:
                task = MIX[s % len(MIX)] if case == "mix" else case
                beside = p.leftovers if p.leftovers != task else ""
                out.append(Segment(case=case, stage=s, task=task, leftovers=beside))
    return out


def instrumentation_stage(
    p: BenchProfile, plan: RunPlan, done: frozenset[tuple[str, int]] = frozenset()
) -> int | None:
    """The stage of the run's timed-vs-plain blocks (its first real stage), or None when the
    plan has none or ``done`` holds them."""
    stage = (plan.real_stages or (0,))[0]
    return stage if plan.instrumentation and ("instrumentation", stage) not in done else None


def run_config(p: BenchProfile, plan: RunPlan, run_dir: Path) -> RunConfig:
    """The config of one benchmark run: emulated peers (``pipeline.emulate``), a run that
    steps until the benchmark stops it, alternating timed and plain stages."""
    emulate = EmulateOptions(
        device="cuda:0" if p.device == "cuda" else "cpu",
        d_model=p.d_model,
        heads=p.heads,
        dtype=p.dtype,
        loss_on=p.loss_on,
        costs=p.peer_costs,
    )
    return RunConfig(
        schedule=p.schedule, stages=p.stages, microbatches=plan.microbatches, chunks=p.chunks,
        steps=10**7, workload="text", layers=p.layers, d_model=p.wire_d_model, heads=1,
        seq_len=p.seq_len, microbatch_size=p.microbatch_size, dtype="float32",
        device="cpu", run_dir=str(run_dir), mps=False,
        runtime=RuntimeOptions(
            emulate=emulate,
            edges_factory="freeride_lab.pipeline.emulate:open_edges",
            timed="alternate",
            pg_timeout_s=1800,
            announce_min_ms=p.announce_min_ms,
            step_group_ms=p.step_group_ms,
            predictor=p.predictor,
            outlived=p.outlived,
        ),
    )  # fmt: skip
