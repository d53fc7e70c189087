"""A side task's first steps in a fresh process against its later ones: what a profile of its
first steps takes in.

A task host profiles a task from its first ``TaskSpec.profile_steps`` steps (5) after the
task's own ``warmup_steps`` (``sidetasks.host.accounting`` [Note: profiling in bubbles]), and
a governed task's base budget is that profile's p95 x 1.1 + 0.5 ms. A step that pays a
process's one-time costs (the device's libraries, the allocator's first blocks, a kernel's
first launch) is then most of a five-step p95. This runs each task in a fresh process, as a
host does (``setup()``, ``to_device()``), and times its first ``--steps`` steps of its largest
size one by one, each to the device's completion; per task it reports every step's time and
the p95 a profile would take: of the first five after ``warmup_steps`` (the host's), of the
five after that, and of the steps after the first ten.

    python benchmarks/first_steps.py --device cuda --tasks pagerank,image,resnet18,vgg19 \\
        --steps 30 --task-options '{"image": {"bands": 128, "step_bands": 8}}' --out first.json

Run it with ``PYTHONPATH`` naming another tree of the package to time that tree's tasks.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from bench_output import command_line, write_results

from freeride_lab.bench.results import machine, versions

PROFILE_STEPS = 5  # TaskSpec.profile_steps' default


def time_steps(task_name: str, device: str, steps: int, options: dict[str, Any]) -> dict[str, Any]:
    """In this process: ``task_name``'s first ``steps`` steps of its largest size, each timed
    to the device's completion (ms), and the task's declared warm-up."""
    import torch

    from freeride_lab.sidetasks.host.iterative import step_sizes
    from freeride_lab.tasks import registry

    preset = "gpu" if device.startswith("cuda") else "cpu"
    task = registry.load(task_name)(**{"preset": preset, **options})
    task.setup()
    task.to_device(device)
    sizes = step_sizes(task)  # type: ignore[arg-type]
    top = sizes[-1]
    times_ms: list[float] = []
    for _ in range(steps):
        t0 = time.perf_counter_ns()
        if top > 1:
            task.step(top)  # type: ignore[attr-defined]
        else:
            task.step()  # type: ignore[attr-defined]
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
        times_ms.append((time.perf_counter_ns() - t0) / 1e6)
    warmup = int(getattr(task, "warmup_steps", 0))
    task.teardown()
    return {"task": task_name, "top_size": top, "warmup_steps": warmup, "step_ms": times_ms}


def profile_p95s(step_ms: list[float], warmup: int) -> dict[str, float | None]:
    """The p95 a profile would take of three windows of ``step_ms`` (numpy's linear
    percentile, as ``core.budget.profile_from_steps``).

        >>> profile_p95s([50.0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2], 0)
        {'first_five': 40.4, 'next_five': 2.0, 'after_ten': 2.0}
    """
    rest = step_ms[warmup:]

    def p95(xs: list[float]) -> float | None:
        return round(float(np.percentile(xs, 95)), 3) if xs else None

    return {
        "first_five": p95(rest[:PROFILE_STEPS]),
        "next_five": p95(rest[PROFILE_STEPS : 2 * PROFILE_STEPS]),
        "after_ten": p95(rest[2 * PROFILE_STEPS :]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tasks", default="pagerank,image")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--task-options", default="{}", help="JSON: task name -> options")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--one", default="", help=argparse.SUPPRESS)  # the child's task
    args = parser.parse_args(argv)
    options = json.loads(args.task_options)
    if args.steps < 2 * PROFILE_STEPS + 1:
        parser.error(f"--steps {args.steps}: at least {2 * PROFILE_STEPS + 1}")
    if args.one:
        found = time_steps(args.one, args.device, args.steps, options.get(args.one, {}))
        print(json.dumps(found))
        return 0
    if args.out is None:
        parser.error("--out is required")
    rows = []
    for name in [t for t in args.tasks.split(",") if t]:
        child = [sys.executable, __file__, "--one", name, "--device", args.device,
                 "--steps", str(args.steps), "--task-options", args.task_options]  # fmt: skip
        done = subprocess.run(child, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(done.stderr[-2000:], file=sys.stderr)
            return done.returncode
        found = json.loads(done.stdout.strip().splitlines()[-1])
        found["profile_p95_ms"] = profile_p95s(found["step_ms"], found["warmup_steps"])
        rows.append(found)
        print(f"{name}: first {found['step_ms'][0]:.2f} ms, p95s {found['profile_p95_ms']}")
    result = {
        "benchmark": "first_steps",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command_line(),
        "versions": versions(),  # the package's source digest with torch's and the GPU's
        "machine": {**machine(), "device": args.device},
        "steps": args.steps,
        "task_options": options,
        "tasks": rows,
    }
    write_results(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
