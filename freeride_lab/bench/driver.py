"""``freeride-lab bench``: vanilla, managed, governed and naive side-task co-location, side by
side, on one GPU with emulated pipeline peers (``pipeline/emulate.py``).

    result = run_bench(bench_profile("quick", "cuda"), out=Path("results/h200.json"))
    result["pipeline"]     # one row per (run, case, mode): overhead, harvest, cost, latency

One *run* is one pipeline process tree (a ``Session``) with a fixed M and MPS setting. Inside it
the benchmark steps through *segments*, one per (real stage, side task): it holds training and
lets the task run alone on the device for at least ``solo_min_s`` and ``solo_steps`` steps (its
dedicated speed, FreeRide's step budget from the median of one ``step()`` call, and the tight
budget of ``core.budget.tight_step_budget_s`` from its 95th percentile: the governed mode's
starting point; ``bench.blocks.solo_figures``), has it checkpoint once (a task's first
checkpoint pins host memory its later ones reuse: a one-time hold kept out of the blocks; the
segment's ``first_checkpoint_s``), then interleaves blocks of training steps in each mode (A B C
D A B C D A: ``bench.stats.interleave``, closed by one more vanilla block), and then measures
the task alone once more: the segment's harvest uses the mean of its two speeds, and a segment
whose two speeds differ by more than 10% is flagged. Blocks switch modes through the emulation's
control file: which rank computes for real and what its side-task worker sees of its bubbles
(``Gate``). The first ``drop_steps`` steps after every switch are left out. A segment's task is
attached when the segment begins and detached when it ends (``Session.attach``), so it is the
only side task attached while the segment measures, and no mode pays a process start. A run may
begin with an ``instrumentation`` segment: timed vs plain ``PipelineStage``, no side tasks.

The benchmark owns the MPS daemon of a run with ``mps=True`` (private pipe and log directories
in the environment of everything the run starts; stopped after the run). Every number comes
from the run's event files after the run; ``bench.stats`` turns them into tables. Results
go to ``out`` (JSON, rewritten after every run, so a cut-short benchmark still leaves data) and
``out.with_suffix(".md")``. A result cut short is continued by a later call (``resume=``, the
CLI's ``--resume``): it measures only the segments the result lacks (``bench.resume``).

This module never initialises CUDA itself (MPS must start before any CUDA process) and imports
nothing from ``freeride_lab.ui``.
"""

from __future__ import annotations

import dataclasses
import logging
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from freeride_lab.bench.blocks import Progress, RunDriver
from freeride_lab.bench.profiles import GOALS, BenchProfile
from freeride_lab.bench.results import (
    cost_model_dict,
    fill_tables,
    jsonable,
    machine,
    versions,
    write_results,
)
from freeride_lab.bench.resume import check_same_setup, completed, without_partial
from freeride_lab.core.accounting import CostModel

log = logging.getLogger(__name__)

__all__ = ["run_bench"]


def run_bench(
    profile: BenchProfile,
    *,
    out: Path,
    run_root: Path | None = None,
    progress: Progress | None = None,
    command: Sequence[str] | None = None,
    resume: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Run every run of ``profile`` in turn; write and return the results (see module doc).

    Args:
        out: the results JSON (rewritten after every run); the markdown goes beside it.
        run_root: where run directories go (default: a ``runs`` folder beside ``out``).
        progress: called with one line per milestone (the CLI prints them with a time stamp).
        command: the command line to record (default ``sys.argv``).
        resume: a result of ``profile`` cut short, to continue (``bench.resume``): its finished
            segments are kept and not measured again; this call is listed in its ``resumed``.

    Raises:
        bench.resume.OtherSetup: ``resume`` was measured by other code or hardware
            (``bench.resume.check_same_setup``).
    """
    say = progress or (lambda line: log.info("%s", line))
    started = time.monotonic()
    deadline = started + profile.time_budget_s
    run_root = run_root or out.parent / "runs"
    line = shlex.join(command if command is not None else [sys.executable, *sys.argv])
    now = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "command": line}
    if resume is not None:
        check_same_setup(resume, versions(), machine())
        result = without_partial(resume)
        result.setdefault("resumed", []).append(now)
    else:
        result = {
            "benchmark": "bench",
            "profile": profile.name,
            **now,
            "versions": versions(),
            "machine": machine(),
            "config": jsonable(dataclasses.asdict(profile)),
            "cost_model": cost_model_dict(CostModel()),
            "goals": GOALS,
            "runs": [],
            "blocks": [],
        }
    done = completed(result)
    for plan in profile.runs:
        driver = RunDriver(profile, plan, run_root, deadline, say, done.get(plan.name, frozenset()))
        if not driver.pending():
            say(f"run {plan.name}: every segment measured by an earlier call")
            continue
        left = deadline - time.monotonic()
        if left < profile.startup_estimate_s + 20:
            say(f"skip run {plan.name}: {left:.0f} s of the time budget left")
            result["runs"].append({"name": plan.name, "skipped": f"time budget ({left:.0f} s)"})
            continue
        todo = ", ".join(f"{s.case}@{s.stage}" for s in driver.segments())
        say(f"run {plan.name}: M={plan.microbatches}, mps={plan.mps}, segments: {todo or '-'}")
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
    # a continuing call's time goes with its entry in "resumed", the first call's at the top
    call = result["resumed"][-1] if resume is not None else result
    call["elapsed_s"] = round(time.monotonic() - started, 1)
    fill_tables(result, stages=profile.stages)
    write_results(result, out)
    return result
