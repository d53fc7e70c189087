"""``freeride-lab bench``: vanilla, managed, governed and naive side-task co-location, side by
side, on one GPU with emulated pipeline peers (``pipeline/emulate.py``).

    result = run_bench(bench_profile("quick", "cuda"), out=Path("results/h200.json"))
    result["pipeline"]     # one row per (run, case, mode): overhead, harvest, cost, latency

One *run* is one pipeline process tree (a ``Session``) with a fixed M and MPS setting. Inside
it the benchmark steps through *segments*, one per (real stage, side task): it holds training
and lets the task run alone on the device for at least ``solo_min_s`` and ``solo_steps`` steps
(its dedicated speed, FreeRide's step budget from its median step, and the tight budget of
``core.budget.tight_step_budget_s`` from its 95th percentile: the governed mode's starting
point), then interleaves blocks of training steps in each mode (A B C D A B C D A:
``bench.stats.interleave``, closed by one more vanilla block), and then measures the task
alone once more: the segment's harvest uses the mean of its two speeds, and a segment whose
two speeds differ by more than 10% is flagged. Blocks switch modes through the emulation's
control file: which rank computes for real and what its side-task worker sees of its bubbles
(``Gate``). The first ``drop_steps`` steps after every switch are left out. The side tasks
stay attached all run long (``Session.attach``; one active per stage, FIFO), so no mode pays
a process start. A run may begin with an ``instrumentation`` segment: timed vs plain
``PipelineStage``, no side tasks, once the tasks' set-up is over.

The benchmark owns the MPS daemon of a run with ``mps=True`` (private pipe and log directories
in the environment of everything the run starts; stopped after the run). Every number comes
from the run's event files after the run; ``bench.stats`` turns them into tables. Results
go to ``out`` (JSON, rewritten after every run, so a cut-short benchmark still leaves data) and
``out.with_suffix(".md")``.

This module never initialises CUDA itself (MPS must start before any CUDA process) and imports
nothing from ``freeride_lab.ui``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from freeride_lab.bench import stats as bs
from freeride_lab.bench.results import (
    block_row,
    cost_model_dict,
    fill_tables,
    jsonable,
    machine,
    versions,
    write_results,
)
from freeride_lab.core.accounting import CostModel
from freeride_lab.core.bubbles import extract_bubbles
from freeride_lab.core.budget import OverrunStats, step_budget_s, tight_step_budget_s
from freeride_lab.core.config import RunConfig
from freeride_lab.core.governor import OverheadGovernor, StepObservation
from freeride_lab.core.runtime_options import EmulateOptions, RuntimeOptions
from freeride_lab.lab.tables import (
    actions_frame,
    read_events,
    run_start_ns,
    side_task_steps_frame,
    steps_frame,
)
from freeride_lab.pipeline.emulate import Control, ControlFile, Gate

log = logging.getLogger(__name__)

__all__ = ["MIX", "PROFILES", "BenchProfile", "RunPlan", "bench_profile", "run_bench"]

#: FreeRide's mix (paper notes §12): one task per stage, in stage order.
MIX: tuple[str, ...] = ("pagerank", "resnet18", "image", "vgg19")
PROFILES: tuple[str, ...] = ("quick", "full", "tiny")
_GATE_OF_MODE = {
    "vanilla": Gate.CLOSED,
    "plain": Gate.CLOSED,
    "managed": Gate.PASS,
    "governed": Gate.PASS,
    "naive": Gate.OPEN,
}
_ON_DEVICE = ("PAUSED", "RUNNING")
_ENDED = ("FINISHED", "STOPPED", "FAILED")
_OPEN_ENDED = {"tol": 0.0, "max_iterations": None}  # PageRank's cpu preset would converge
#: CPU runs: side-task steps small enough for a CPU pipeline's bubbles (tens of ms).
_CPU_TASK_OPTIONS: dict[str, dict[str, Any]] = {
    "pagerank": {"n_nodes": 20_000, "n_edges": 100_000, **_OPEN_ENDED},
    "resnet18": {"batch_size": 2, "image_size": 32},
    "resnet50": {"batch_size": 1, "image_size": 32},
    "vgg19": {"batch_size": 1, "image_size": 32},
    "sgd_mf": {"batch_edges": 4096},
}
_SHORT = ("vanilla", "managed", "naive")  # the later runs of --quick: no governor blocks
_POLL_S = 0.05
Progress = Callable[[str], None]

#: The benchmark's goals, with FreeRide's published numbers (paper notes §14) beside them.
GOALS: dict[str, Any] = {
    "overhead_mean_frac_max": 0.003,
    "overhead_worst_frac_max": 0.006,
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
    task_preset: str = "gpu"
    task_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    governor_target_frac: float = 0.005
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
        return base
    return base.replace(
        runs=tuple(r for r in base.runs if not r.mps),  # no MPS without a GPU
        layers=base.stages * 2, d_model=256, heads=4, seq_len=128, microbatch_size=4,
        wire_d_model=32, dtype="float32", task_preset="cpu", startup_estimate_s=30.0,
        task_options=_CPU_TASK_OPTIONS,
        time_budget_s=base.time_budget_s * 3,
    )  # fmt: skip


# -- the benchmark ----------------------------------------------------------------------------


def run_bench(
    profile: BenchProfile,
    *,
    out: Path,
    run_root: Path | None = None,
    progress: Progress | None = None,
    command: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Run every run of ``profile`` in turn; write and return the results (see module doc).

    Args:
        out: the results JSON (rewritten after every run); the markdown goes beside it.
        run_root: where run directories go (default: a ``runs`` folder beside ``out``).
        progress: called with one line per milestone (the CLI prints them with a time stamp).
        command: the command line to record (default ``sys.argv``).
    """
    say = progress or (lambda line: log.info("%s", line))
    started = time.monotonic()
    deadline = started + profile.time_budget_s
    run_root = run_root or out.parent / "runs"
    result: dict[str, Any] = {
        "benchmark": "bench",
        "profile": profile.name,
        "command": shlex.join(command if command is not None else [sys.executable, *sys.argv]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "versions": versions(),
        "machine": machine(),
        "config": jsonable(dataclasses.asdict(profile)),
        "cost_model": cost_model_dict(CostModel()),
        "goals": GOALS,
        "runs": [],
        "blocks": [],
    }
    for plan in profile.runs:
        left = deadline - time.monotonic()
        if left < profile.startup_estimate_s + 20:
            say(f"skip run {plan.name}: {left:.0f} s of the time budget left")
            result["runs"].append({"name": plan.name, "skipped": f"time budget ({left:.0f} s)"})
            continue
        say(f"run {plan.name}: M={plan.microbatches}, mps={plan.mps}, cases={list(plan.cases)}")
        driver = _RunDriver(profile, plan, run_root, deadline, say)
        record = driver.execute()
        result["runs"].append(record)
        result["blocks"].extend(record.pop("blocks_rows", []))
        fill_tables(result, stages=profile.stages)
        write_results(result, out)
        say(f"run {plan.name} done: {len(record.get('segments', []))} segment(s); wrote {out}")
        startup = record.get("startup_s")
        if isinstance(startup, float):
            profile = profile.replace(startup_estimate_s=max(startup + 15.0, 20.0))
        if record.get("interrupted"):
            result["interrupted"] = True
            break
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    fill_tables(result, stages=profile.stages)
    write_results(result, out)
    return result


# -- one run ----------------------------------------------------------------------------------


@dataclass
class _Segment:
    case: str
    stage: int
    task: str
    task_id: str = ""


class _RunDriver:
    """Launches one run, drives its segments through the control file, collects its blocks."""

    def __init__(
        self,
        profile: BenchProfile,
        plan: RunPlan,
        run_root: Path,
        deadline: float,
        say: Progress,
    ) -> None:
        self.profile = profile
        self.plan = plan
        self.modes = plan.modes or profile.modes
        self.deadline = deadline
        self.say = say
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        self.run_dir = (run_root / f"{stamp}-{plan.name}").absolute()
        self.control = ControlFile(self.run_dir)
        self.seq = 0
        self.blocks: list[dict[str, Any]] = []
        self.record: dict[str, Any] = {
            "name": plan.name,
            "microbatches": plan.microbatches,
            "mps": plan.mps,
            "run_dir": str(self.run_dir),
            "segments": [],
            "skipped": [],
            "errors": [],
            "governor": [],
        }
        self.session: Any = None
        self.sampler: Any = None
        self._settled_at = 0
        self.hard_deadline = deadline + 20.0  # waits give up here: the budget is spent
        self.step_ms_estimate = 1000.0

    # -- plan --

    def config(self) -> RunConfig:
        p = self.profile
        emulate = EmulateOptions(
            device="cuda:0" if p.device == "cuda" else "cpu",
            d_model=p.d_model,
            heads=p.heads,
            dtype=p.dtype,
        )
        return RunConfig(
            schedule=p.schedule, stages=p.stages, microbatches=self.plan.microbatches,
            steps=10**7, workload="text", layers=p.layers, d_model=p.wire_d_model, heads=1,
            seq_len=p.seq_len, microbatch_size=p.microbatch_size, dtype="float32",
            device="cpu", run_dir=str(self.run_dir), mps=False,
            runtime=RuntimeOptions(
                emulate=emulate,
                edges_factory="freeride_lab.pipeline.emulate:open_edges",
                timed="alternate",
                pg_timeout_s=1800,
            ),
        )  # fmt: skip

    def segments(self) -> list[_Segment]:
        stages = self.plan.real_stages or tuple(range(self.profile.stages))
        out = []
        for case in self.plan.cases:
            for s in stages:
                task = MIX[s % len(MIX)] if case == "mix" else case
                out.append(_Segment(case=case, stage=s, task=task))
        return out

    # -- lifetime --

    def execute(self) -> dict[str, Any]:
        """Run it; never raises for a failed run (the record says what went wrong)."""
        try:
            with self._mps(), self._nvml() as sampler:
                self.sampler = sampler
                self._launch_and_drive()
        except KeyboardInterrupt:
            self.record["errors"].append("interrupted")
            self.record["interrupted"] = True
            self.say(f"run {self.plan.name} interrupted; stopping it and keeping its blocks")
        except Exception as exc:  # a failed run must not lose the runs before it
            log.exception("bench run %s failed", self.plan.name)
            self.record["errors"].append(f"{type(exc).__name__}: {exc}")
            self.say(f"run {self.plan.name} FAILED: {type(exc).__name__}: {exc}")
        finally:
            if self.session is not None:
                with contextlib.suppress(Exception):
                    self.session.stop()
                failure = self.session.failure
                self.record["state"] = str(self.session.state)
                self.record["failure"] = None if failure is None else str(failure)
        try:
            self.record["blocks_rows"] = self._collect()
        except Exception as exc:
            log.exception("collecting run %s failed", self.plan.name)
            self.record["errors"].append(f"collect: {type(exc).__name__}: {exc}")
        return self.record

    @contextlib.contextmanager
    def _mps(self) -> Iterator[None]:
        if not self.plan.mps:
            yield
            return
        from freeride_lab.gpu.mps import MpsDaemon

        root = Path(tempfile.mkdtemp(prefix="frl-mps-"))  # short: a socket path lives here
        daemon = MpsDaemon(root / "pipe", root / "log")
        daemon.start()
        saved = {k: os.environ.get(k) for k in daemon.client_env()}
        os.environ.update(daemon.client_env())  # inherited by everything the run starts
        self.say(f"MPS daemon up (pipe {daemon.pipe_dir})")
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            if self.session is not None:
                with contextlib.suppress(Exception):
                    self.session.stop()
            daemon.stop()

    @contextlib.contextmanager
    def _nvml(self) -> Iterator[Any]:
        from freeride_lab.gpu.nvml import NvmlSampler

        sampler = NvmlSampler(interval_s=0.1, capacity=100_000)
        sampler.start()
        try:
            yield sampler
        finally:
            sampler.stop()

    def _launch_and_drive(self) -> None:
        from freeride_lab.lab.session import Session

        config = self.config()
        t0 = time.monotonic()
        self.session = Session.launch(config, grace_s=20.0)
        segments = self.segments()
        self._write_control(real_rank=segments[0].stage if segments else 0, gate=Gate.CLOSED)
        self._wait(lambda: self.session.steps_done >= 2, 600.0, "the first training steps")
        self.record["startup_s"] = round(time.monotonic() - t0, 1)
        self.record["calibration"] = self._calibration()
        self.say(f"  training up after {self.record['startup_s']} s; "
                 f"calibration {self._calibration_line()}")  # fmt: skip
        self._attach(segments)
        if self.plan.instrumentation:
            self._wait_ready(segments)  # their set-up and first copy to the device are noise
            self._instrumentation(segments[0].stage if segments else 0)
        for seg in segments:
            need = self._segment_estimate_s()
            left = self.deadline - time.monotonic()
            if left < need:
                note = f"{seg.case}@{seg.stage} ({seg.task}): ~{need:.0f} s, {left:.0f} s left"
                self.record["skipped"].append(note)
                self.say(f"  skip segment {note}")
                continue
            self._segment(seg)
        self._settle()
        self._write_control(real_rank=0, gate=Gate.CLOSED)

    # -- side tasks --

    def _attach(self, segments: list[_Segment]) -> None:
        for seg in segments:
            options = {"preset": self.profile.task_preset,
                       **self.profile.task_options.get(seg.task, {})}  # fmt: skip
            task = self.session.attach(
                seg.task, stage=seg.stage, options=options, budget_ms=1.0, policy="WARN",
                gating="bubbles",
            )  # fmt: skip
            seg.task_id = str(task["id"])
        self.say(f"  attached {len(segments)} side task(s): "
                 + ", ".join(f"{s.task}@{s.stage}" for s in segments))  # fmt: skip

    def _wait_ready(self, segments: list[_Segment]) -> None:
        """Wait (up to ``attach_timeout_s``) until every attached task is on the device or
        has ended; a task that is late is only noted."""
        ids = {s.task_id for s in segments if s.task_id}

        def ready() -> bool:
            states = {str(t.get("id")): t.get("state") for t in self.session.tasks}
            return all(states.get(i) in (*_ON_DEVICE, *_ENDED) for i in ids)

        try:
            self._wait(ready, self.profile.attach_timeout_s, "the side tasks' set-up", poll_s=0.2)
        except TimeoutError as exc:
            self.record["errors"].append(str(exc))

    def _task(self, task_id: str) -> dict[str, Any]:
        for t in self.session.tasks:
            if str(t.get("id")) == task_id:
                return dict(t)
        return {}

    # -- segments --

    def _segment_estimate_s(self) -> float:
        p = self.profile
        blocks = len(self.modes) * p.repeats + 1
        steps = blocks * (p.drop_steps + p.block_steps + 2)
        solo_s = 2 * (p.solo_min_s + 2 * self.step_ms_estimate / 1e3)  # before and after
        return steps * self.step_ms_estimate / 1e3 + solo_s + 10.0

    def _instrumentation(self, stage: int) -> None:
        p = self.profile
        self.say(f"  instrumentation: timed vs plain, real stage {stage}")
        seg = _Segment(case="instrumentation", stage=stage, task="")
        order = bs.interleave(("vanilla", "plain"), p.instrumentation_repeats, closed=True)
        for repeat, mode in order:
            self._block(seg, repeat, mode)
        self.record["segments"].append({"case": seg.case, "stage": stage, "task": ""})

    def _segment(self, seg: _Segment) -> None:
        p = self.profile
        t0 = time.monotonic()
        rec: dict[str, Any] = {"case": seg.case, "stage": seg.stage, "task": seg.task,
                               "task_id": seg.task_id}  # fmt: skip
        self.record["segments"].append(rec)
        self._wait(
            lambda: self._task(seg.task_id).get("state") in _ON_DEVICE,
            p.attach_timeout_s,
            f"side task {seg.task} ({seg.task_id}) on stage {seg.stage} to be ready",
            fail_on=lambda: self._task(seg.task_id).get("state") in _ENDED,
            poll_s=0.2,
        )
        solo = self._solo(seg)
        rec.update(solo)
        rec["dedicated_before_per_s"] = rec.pop("dedicated_per_s", None)
        budget_ms = solo.get("budget_ms")
        if budget_ms is None:  # no speed, no budget: its blocks would mean nothing
            self.say(f"  segment {seg.case}@{seg.stage} ({seg.task}): too few solo steps; skipped")
            with contextlib.suppress(Exception):
                self.session.detach(seg.task_id)
            return
        self.session.tune(seg.task_id, budget_ms=budget_ms)
        governor = OverheadGovernor(
            target_frac=p.governor_target_frac, sm_min_pct=100, sm_max_pct=100, window=3,
            settle_steps=1,
        )  # fmt: skip
        governor.add_task(seg.task_id)
        # Governed blocks start from the tight budget (no 10 ms rounding) and let the
        # governor widen it when training slows; managed blocks keep FreeRide's rule.
        governed_base_ms = solo.get("tight_budget_ms", budget_ms)
        state = {"budget_ms": budget_ms}
        for repeat, mode in bs.interleave(self.modes, p.repeats, closed=True):
            want = budget_ms
            if mode == "governed":
                want = governed_base_ms * governor.limits(seg.task_id)[1]
            if want != state["budget_ms"]:
                self.session.tune(seg.task_id, budget_ms=want)
                state["budget_ms"] = want
            on_step = None
            if mode == "governed":
                on_step = self._governor_hook(seg, governor, governed_base_ms, state)
            self._block(seg, repeat, mode, on_step=on_step)
        after = self._solo(seg)  # the same measurement after the blocks: did the speed move?
        rec.update(
            solo_after_steps=after["solo_steps"],
            solo_after_s=after["solo_s"],
            dedicated_after_per_s=after.get("dedicated_per_s"),
        )
        rec.update(bs.dedicated_speed(rec["dedicated_before_per_s"], rec["dedicated_after_per_s"]))
        with contextlib.suppress(Exception):
            self.session.detach(seg.task_id)
        rec["elapsed_s"] = round(time.monotonic() - t0, 1)
        unit = f"{rec.get('unit', '')}/s"
        spread = rec.get("dedicated_spread_frac")
        flag = (
            f"; FLAGGED: before and after differ by {spread:.0%} (> {bs.SPREAD_FLAG_FRAC:.0%})"
            if rec.get("dedicated_unstable")
            else ""
        )
        self.say(
            f"  segment {seg.case}@{seg.stage} ({seg.task}) done in {rec['elapsed_s']} s; "
            f"dedicated {_g(rec['dedicated_before_per_s'])} {unit} before, "
            f"{_g(rec['dedicated_after_per_s'])} {unit} after{flag}"
        )

    def _solo(self, seg: _Segment) -> dict[str, Any]:
        """Hold training, let the task run alone, release: its dedicated speed and budget.

        The phase lasts at least ``solo_min_s`` and ``solo_steps`` measured steps (a
        fraction of a second measured speeds that moved by half between runs), at most
        ``solo_max_s``.
        """
        p = self.profile
        self._settle()
        seq = self._write_control(real_rank=seg.stage, gate=Gate.OPEN, hold=True)
        start_ns = self._wait_applied(seq)["t_ns"]
        path = self.run_dir / "events" / f"task-{seg.task_id}.jsonl"
        t_min = time.monotonic() + p.solo_min_s
        t_end = time.monotonic() + p.solo_max_s
        while time.monotonic() < t_end:
            steps = _task_steps(path, start_ns)[2:]
            # long enough, enough steps, and (for a task whose progress comes every few
            # steps, like the image task's bands) three completed units to measure whole cycles
            if (
                time.monotonic() >= t_min
                and len(steps) >= p.solo_steps
                and sum(float(e["progress"]) > 0 for e in steps) >= 3
            ):
                break
            time.sleep(_POLL_S)
        seq = self._write_control(real_rank=seg.stage, gate=Gate.CLOSED)
        end_ns = self._wait_applied(seq)["t_ns"]
        steps = [e for e in _task_steps(path, start_ns) if e["start_ns"] < end_ns]
        progress = [float(e["progress"]) for e in steps]
        durations = [(e["end_ns"] - e["start_ns"]) / 1e6 for e in steps]
        out: dict[str, Any] = {"solo_steps": len(steps), "solo_s": (end_ns - start_ns) / 1e9}
        out["unit"] = steps[0].get("unit", "") if steps else ""
        if len(steps) > 2:
            out["dedicated_per_s"] = bs.dedicated_throughput_per_s(progress, durations, skip=2)
            median_ms = bs.median(durations[2:])
            out["solo_step_ms_median"] = median_ms
            out["budget_ms"] = step_budget_s(median_ms / 1e3) * 1e3
            out["solo_step_ms_p95"] = bs.percentile(durations[2:], 95)
            out["tight_budget_ms"] = tight_step_budget_s(out["solo_step_ms_p95"] / 1e3) * 1e3
        else:
            self.record["errors"].append(f"{seg.task}@{seg.stage}: only {len(steps)} solo steps")
        return out

    def _governor_hook(
        self,
        seg: _Segment,
        governor: OverheadGovernor,
        budget_ms: float,
        state: dict[str, float],
    ) -> Callable[[float, float], None]:
        def on_step(step_ms: float, baseline_ms: float) -> None:
            obs = StepObservation(
                step_s=step_ms / 1e3,
                baseline_step_s=baseline_ms / 1e3 if baseline_ms > 0 else None,
                active_task_ids=(seg.task_id,),
            )
            for d in governor.observe(obs):
                want = budget_ms * d.budget_scale
                self.session.tune(seg.task_id, budget_ms=want)
                state["budget_ms"] = want
                self.record["governor"].append(
                    {"stage": seg.stage, "task": seg.task, "budget_ms": want, "reason": d.reason}
                )

        return on_step

    def _block(
        self,
        seg: _Segment,
        repeat: int,
        mode: str,
        *,
        on_step: Callable[[float, float], None] | None = None,
    ) -> None:
        """Switch to ``mode``, then wait out ``drop_steps`` + ``block_steps`` steps.

        The block's last period ends where step ``first + block_steps`` starts, under the next
        block's control; that is harmless unless the next control holds training, so
        ``_settle`` waits for that start first.
        """
        p = self.profile
        seq = self._write_control(
            real_rank=seg.stage, gate=_GATE_OF_MODE[mode], timed=mode != "plain"
        )
        first = self._wait_applied(seq)["step"] + p.drop_steps
        need = first + p.block_steps  # steps first .. first+block_steps-1 complete
        self._settled_at = need + 1  # ... and the start of the next one recorded
        baseline = self._baseline_ms(seg) if on_step is not None else 0.0
        fed = first
        timeout_s = 60.0 + 3 * (p.drop_steps + p.block_steps) * self.step_ms_estimate / 1e3

        def done() -> bool:
            nonlocal fed
            if on_step is not None:
                fed = self._feed(on_step, seg.stage, fed, baseline)
            return bool(self.session.steps_done >= need)

        self._wait(done, timeout_s, f"block {mode} of {seg.case}@{seg.stage}")
        self.blocks.append(
            {"order": len(self.blocks), "repeat": repeat, "mode": mode, "case": seg.case,
             "stage": seg.stage, "task": seg.task, "task_id": seg.task_id,
             "first_step": first, "steps": p.block_steps}
        )  # fmt: skip
        self._update_step_estimate()

    def _settle(self) -> None:
        """Wait until the last block's closing step start is on record (see ``_block``)."""
        need = self._settled_at
        self._wait(lambda: self.session.steps_done >= need, 120.0, "the last block to close")

    def _feed(
        self, on_step: Callable[[float, float], None], rank: int, fed: int, baseline: float
    ) -> int:
        """Hand the step periods of ``rank`` from step ``fed`` on to ``on_step``; the next
        step to hand over."""
        steps = self.session.steps
        mine = steps[(steps["rank"] == rank) & (steps["step"] >= fed)]
        starts = dict(zip(mine["step"], mine["start_ms"], strict=True))
        while fed in starts and fed + 1 in starts:
            on_step(float(starts[fed + 1] - starts[fed]), baseline)
            fed += 1
        return fed

    def _baseline_ms(self, seg: _Segment) -> float:
        """Median step period of this segment's vanilla blocks so far (0 if none)."""
        steps = self.session.steps
        mine = steps[steps["rank"] == seg.stage].set_index("step")["start_ms"]
        periods: list[float] = []
        for b in self.blocks:
            if b["task_id"] == seg.task_id and b["mode"] == "vanilla":
                for s in range(b["first_step"], b["first_step"] + b["steps"]):
                    if s in mine.index and s + 1 in mine.index:
                        periods.append(float(mine[s + 1] - mine[s]))
        return bs.median(periods) if periods else 0.0

    def _update_step_estimate(self) -> None:
        steps = self.session.steps
        if len(steps) > 4:
            last = steps[steps["rank"] == 0].tail(6)["start_ms"].diff().dropna()
            if len(last):
                self.step_ms_estimate = float(last.median())

    # -- control --

    def _write_control(
        self, *, real_rank: int, gate: Gate, hold: bool = False, timed: bool = True
    ) -> int:
        self.seq += 1
        self.control.write(
            Control(seq=self.seq, real_rank=real_rank, gate=gate, hold=hold, timed=timed)
        )
        return self.seq

    def _wait_applied(self, seq: int) -> dict[str, int]:
        found: dict[str, int] = {}

        def applied() -> bool:
            for a in reversed(self.control.applied()):
                if a["seq"] == seq:
                    found.update(a)
                    return True
            return False

        self._wait(applied, 120.0, f"control #{seq} to take effect")
        return found

    def _wait(
        self,
        condition: Callable[[], bool],
        timeout_s: float,
        what: str,
        *,
        fail_on: Callable[[], bool] | None = None,
        poll_s: float = _POLL_S,
    ) -> None:
        deadline = min(time.monotonic() + timeout_s, self.hard_deadline)
        while not condition():
            state = self.session.state
            if state.done:
                raise RuntimeError(
                    f"the run ended ({state}) while waiting for {what}: {self.session.failure}"
                )
            if fail_on is not None and fail_on():
                raise RuntimeError(f"gave up waiting for {what}: it failed or stopped")
            if time.monotonic() >= deadline:
                if deadline == self.hard_deadline:
                    raise TimeoutError(f"the time budget ran out while waiting for {what}")
                raise TimeoutError(f"waited {timeout_s:.0f} s for {what}")
            time.sleep(poll_s)

    # -- reports --

    def _calibration(self) -> list[dict[str, Any]]:
        out = []
        for r in range(self.profile.stages):
            path = self.control.dir / f"calibration-rank-{r}.json"
            with contextlib.suppress(OSError, ValueError):
                out.append(json.loads(path.read_text()))
        return out

    def _calibration_line(self) -> str:
        parts = [
            f"r{c['rank']} F {'/'.join(f'{x:.1f}' for x in c['forward_ms'])} "
            f"B {'/'.join(f'{x:.1f}' for x in c['backward_ms'])} opt {c['optimizer_ms']:.1f} ms"
            for c in self.record.get("calibration", [])
        ]
        return "; ".join(parts) or "(none)"

    def _collect(self) -> list[dict[str, Any]]:
        """The blocks table of this run, from its event files (``benchstats.BLOCK_COLUMNS``)."""
        if not self.blocks or not self.run_dir.exists():
            return []
        events = read_events(self.run_dir)
        t0 = run_start_ns(events) or 0
        cfg = self.config()
        actions = actions_frame(events, t0)
        bubbles = extract_bubbles(  # with the idle between steps (core.bubbles)
            actions, schedule=cfg.schedule, stages=cfg.stages, microbatches=cfg.microbatches,
            chunks=cfg.chunks, min_ms=1.0, steps=steps_frame(events, t0),
        )  # fmt: skip
        side = side_task_steps_frame(events, t0)
        starts = {
            (int(e["rank"]), int(e["step"])): int(e["start_ns"])
            for e in events
            if e.get("kind") == "step"
        }
        edges = [e for e in events if e.get("kind") == "bubble_edge"]
        self.record["stage_memory"] = _stage_memory(events)
        samples = list(self.sampler.samples()) if self.sampler is not None else []
        for rec in self.record["segments"]:
            if rec.get("task_id"):  # every step of the task in this run, as its host counts
                mine = side[side["task_id"] == rec["task_id"]]
                stats = OverrunStats.of(mine["overrun_ms"] * 1e6)
                rec.update(task_steps_total=stats.steps, task_overruns_total=stats.overruns)
        rows = []
        for b in self.blocks:
            row = block_row(b, self.plan.name, starts, bubbles, side, edges, samples, t0)
            if row is not None:
                rows.append(row)
        return rows


def _g(v: float | None) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:.4g}"


def _stage_memory(events: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per rank: its highest peak reserved memory of the run and the device's capacity (on CUDA
    the rank's own chunks, activations and allocator cache; the GPU is shared by all ranks)."""
    peak: dict[int, tuple[int, int, str]] = {}
    for e in events:
        if e.get("kind") != "memory":
            continue
        r = int(e["rank"])
        value = (int(e["peak_reserved_bytes"]), int(e["capacity_bytes"]), str(e["device"]))
        if r not in peak or value[0] > peak[r][0]:
            peak[r] = value
    return [
        {"rank": r, "peak_reserved_bytes": p, "capacity_bytes": c, "device": d}
        for r, (p, c, d) in sorted(peak.items())
    ]


def _task_steps(path: Path, since_ns: int) -> list[dict[str, Any]]:
    """``side_task_step`` events in one task's event file that started at or after ``since_ns``."""
    out = []
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                e = json.loads(line)
                if e.get("kind") == "side_task_step" and int(e["start_ns"]) >= since_ns:
                    out.append(e)
    return out
