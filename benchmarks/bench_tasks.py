"""Step time and memory of the built-in side tasks, next to FreeRide's profiled steps (§9).

For each task: host ``setup()`` and ``to_device()`` seconds, ``--warmup`` untimed steps, then
``--steps`` timed steps (median and minimum ms; on CUDA each step is closed by a synchronise,
as a side-task worker times it), the FreeRide step budget rule applied to the median
(ceil to 10 ms x 1.2), and on CUDA the peak allocated bytes. FreeRide's own medians (RTX 6000
Ada, paper §9) are listed beside them for the "gpu" preset.

    python benchmarks/bench_tasks.py                           # cpu preset, one thread
    python benchmarks/bench_tasks.py --preset gpu --device cuda --out results/tasks-h200.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from bench_output import write_results

from freeride_lab.tasks import BUILTIN_TASKS, load_task_class

RESULTS = Path(__file__).parent / "results"
#: FreeRide's profiled median step, s (paper §9; RTX 6000 Ada, batch 64 at 224², com-Orkut).
FREERIDE_MEDIAN_S = {
    "resnet18": 0.0306,
    "resnet50": 0.0889,
    "vgg19": 0.1748,
    "pagerank": 0.0035,
    "sgd_mf": 0.145,
    "image": 0.047,
}


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def bench_task(name: str, preset: str, device: str, warmup: int, steps: int) -> dict[str, Any]:
    """One row: timings of ``name`` at ``preset`` on ``device``."""
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    task = load_task_class(name)(preset=preset)
    t0 = time.perf_counter()
    task.setup()
    setup_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    task.to_device(device)
    _sync(device)
    to_device_s = time.perf_counter() - t0
    for _ in range(warmup):
        task.step()
    _sync(device)
    times, done = [], 0.0
    for _ in range(steps):
        t0 = time.perf_counter()
        done += task.step()
        _sync(device)
        times.append(time.perf_counter() - t0)
    median_s = statistics.median(times)
    row: dict[str, Any] = {
        "task": name,
        "preset": preset,
        "device": device,
        "unit": task.unit,
        "options": {k: v for k, v in vars(task.config).items()},  # type: ignore[attr-defined]
        "setup_s": round(setup_s, 3),
        "to_device_s": round(to_device_s, 3),
        "step_median_ms": round(median_s * 1e3, 2),
        "step_min_ms": round(min(times) * 1e3, 2),
        "budget_ms": round(math.ceil(median_s * 100 - 1e-9) / 100 * 1.2 * 1e3, 1),
        "steps": steps,
        "units_per_s": round(done / sum(times), 1),
        "freeride_median_ms": (
            FREERIDE_MEDIAN_S[name] * 1e3 if preset == "gpu" and name in FREERIDE_MEDIAN_S else None
        ),
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
    }
    task.teardown()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu", choices=["cpu", "gpu"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tasks", nargs="*", default=list(BUILTIN_TASKS))
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads on CPU")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for name in args.tasks:
        rows.append(bench_task(name, args.preset, args.device, args.warmup, args.steps))
        print(json.dumps(rows[-1]), flush=True)
    gpu = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else None
    result = {
        "benchmark": "tasks",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "gpu": gpu,
        "threads": args.threads,
        "rows": rows,
    }
    tag = "cuda" if gpu else "cpu"
    out = args.out or RESULTS / f"tasks-{args.preset}-{tag}-{datetime.now(UTC):%Y-%m-%d}.json"
    write_results(result, out, indent=1)


if __name__ == "__main__":
    main()
