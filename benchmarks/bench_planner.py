"""How fast the planner simulates pipeline schedules, and which path does it.

Cases, each timed ``--repeats`` times (median and minimum of wall seconds, one process):

- ``summary-levels``: ``simulate_summary`` for 1F1B and GPipe at 1,024 stages x 8,192
  micro-batches through the closed-form level path; the target is < 1 s (``target_ratio`` =
  median / 1 s, below 1 is good);
- ``summary-generic``: the same call with ``plan=plan_arrays(...)``, which forces the generic
  round engine, at sizes it finishes in seconds, next to the level path at the same sizes;
- ``plan``: ``plan_arrays`` (array arithmetic) versus converting ``torch_plan`` (per-action
  Python objects) for 1F1B and Interleaved1F1B;
- ``table``: ``simulate`` (actions DataFrame, 3 steps) for all seven schedules at S=4, M=8 and
  for Interleaved1F1B at S=16, M=64.

    python benchmarks/bench_planner.py                 # writes results/planner-cpu-<date>.json
    python benchmarks/bench_planner.py --repeats 1 --out /tmp/planner.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from bench_output import write_results

from freeride_lab.core.plan import Costs, PlanArrays, plan_arrays, simulate, simulate_summary
from freeride_lab.core.schedule import SCHEDULES, Schedule, torch_plan

RESULTS = Path(__file__).parent / "results"
COSTS = Costs(forward_ms=1.0, backward_ms=2.0, comm_ms=0.1, dispatch_ms=0.05)


def timed(fn: Callable[[], Any], repeats: int) -> dict[str, float]:
    """Median and minimum wall seconds of ``repeats`` calls."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(times), "min_s": min(times), "repeats": repeats}


def bench(repeats: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    def add(case: str, schedule: str, stages: int, microbatches: int, **extra: Any) -> None:
        row = {"case": case, "schedule": schedule, "stages": stages, "microbatches": microbatches}
        rows.append(row | extra)
        print(json.dumps(rows[-1]), flush=True)

    for name in ("1F1B", "GPipe"):
        t = timed(lambda n=name: simulate_summary(n, 1024, 8192, costs=COSTS), repeats)
        add("summary-levels", name, 1024, 8192, **t, target_ratio=t["median_s"] / 1.0)

    for name, s, m in (("1F1B", 64, 512), ("1F1B", 256, 1024), ("GPipe", 256, 1024)):
        plan = plan_arrays(name, s, m)
        generic = timed(lambda n=name, s=s, m=m, p=plan: simulate_summary(n, s, m, plan=p), repeats)
        levels = timed(lambda n=name, s=s, m=m: simulate_summary(n, s, m), repeats)
        add(
            "summary-generic",
            name,
            s,
            m,
            **generic,
            levels_median_s=levels["median_s"],
            generic_over_levels=generic["median_s"] / levels["median_s"],
        )

    for name, s, m in (("1F1B", 32, 128), ("Interleaved1F1B", 8, 64)):
        arrays = timed(lambda n=name, s=s, m=m: plan_arrays(n, s, m), repeats)
        converted = timed(
            lambda n=name, s=s, m=m: PlanArrays.from_plan(torch_plan(n, s, m), m), repeats
        )
        add(
            "plan",
            name,
            s,
            m,
            **arrays,
            torch_plan_median_s=converted["median_s"],
            torch_plan_over_arrays=converted["median_s"] / arrays["median_s"],
        )

    for name in SCHEDULES:
        t = timed(lambda n=name: simulate(n, 4, 8, costs=COSTS, steps=3), repeats)
        add("table", name, 4, 8, **t, chunks=Schedule.from_name(name).resolve_chunks(None))
    t = timed(lambda: simulate("Interleaved1F1B", 16, 64, costs=COSTS, steps=3), repeats)
    add("table", "Interleaved1F1B", 16, 64, **t, chunks=2)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    now = datetime.now(UTC)
    rows = bench(args.repeats)
    result = {
        "benchmark": "planner",
        "when": now.isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "numpy": np.__version__,
            "pandas": pd.__version__,
            "torch": torch.__version__,
            "note": "shared machine; other processes may run, so times are upper bounds",
        },
        "costs": {"forward_ms": 1.0, "backward_ms": 2.0, "comm_ms": 0.1, "dispatch_ms": 0.05},
        "rows": rows,
    }
    write_results(result, args.out or RESULTS / f"planner-cpu-{now.date().isoformat()}.json")


if __name__ == "__main__":
    main()
