"""What CUDA graphs buy a vision side task's step: eager vs graphed, whole batch vs slices.

For each task and each ``micro_batches`` k, an eager task and a graphed twin (``cuda_graphs``,
``tasks.graphed_step``) are built with the GPU preset (FreeRide's sizes: batch 64 at 224²) and
stepped in alternating blocks of one batch each, A B A B, so that clocks and temperature drift
hit both alike. A step's time is one ``step()`` call up to ``torch.cuda.synchronize()``, as the
task host measures it. The first two batches of each are left out (the graphed twin runs its
first batch eagerly and captures in its second). Reported per case: the median step time of
each, the speed in samples per second (samples over the summed step times), and the ratio
graphed / eager of the speeds with a 95% interval over the block pairs.

    python benchmarks/bench_graphed_steps.py --out /tmp/graphed.json
    python benchmarks/bench_graphed_steps.py --tasks resnet18 --micro-batches 1,4 --batches 20
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from typing import Any

import torch

from freeride_lab.bench.stats import median
from freeride_lab.core.intervals import mean_interval
from freeride_lab.tasks.vision import ResNet18Task, ResNet50Task, VGG19Task

TASKS = {"resnet18": ResNet18Task, "resnet50": ResNet50Task, "vgg19": VGG19Task}

SKIP_BATCHES = 2


def _batch_ms(task: Any, micro_batches: int) -> list[float]:
    """Step times (ms) of one whole batch: ``micro_batches`` steps, each synchronized."""
    out = []
    for _ in range(micro_batches):
        t0 = time.perf_counter()
        task.step()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def measure(name: str, micro_batches: int, batches: int) -> dict[str, Any]:
    """Alternate one batch of the eager task and one of its graphed twin, ``batches`` times."""
    tasks = {}
    for graphed in (False, True):
        task = TASKS[name](preset="gpu", micro_batches=micro_batches, cuda_graphs=graphed)
        task.setup()
        task.to_device("cuda")
        tasks[graphed] = task
    steps: dict[bool, list[list[float]]] = {False: [], True: []}
    for _ in range(batches):
        for graphed, task in tasks.items():
            steps[graphed].append(_batch_ms(task, micro_batches))
    samples = float(tasks[False].config.batch_size)  # per batch
    kept = {g: s[SKIP_BATCHES:] for g, s in steps.items()}
    speed = {g: [samples / (sum(b) / 1e3) for b in s] for g, s in kept.items()}
    ratio = mean_interval([g / e - 1.0 for e, g in zip(speed[False], speed[True], strict=True)])
    flat = {g: [x for b in s for x in b] for g, s in kept.items()}
    return {
        "task": name,
        "micro_batches": micro_batches,
        "slice_images": tasks[False].config.batch_size // micro_batches,
        "batches_measured": len(kept[False]),
        "eager_step_ms_median": median(flat[False]),
        "graphed_step_ms_median": median(flat[True]),
        "eager_samples_per_s": sum(speed[False]) / len(speed[False]),
        "graphed_samples_per_s": sum(speed[True]) / len(speed[True]),
        "speedup_frac": ratio.value,
        "speedup_low": ratio.lo,
        "speedup_high": ratio.hi,
        "graphs": tasks[True]._graphs.captured if tasks[True]._graphs is not None else 0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="resnet18,vgg19,resnet50")
    parser.add_argument("--micro-batches", default="1,2,4")
    parser.add_argument("--batches", type=int, default=12, help="blocks per mode (>= 7)")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    if args.batches < SKIP_BATCHES + 5:
        parser.error(f"--batches={args.batches} leaves fewer than 5 measured blocks")
    names = [n for n in args.tasks.split(",") if n]
    unknown = [n for n in names if n not in TASKS]
    if unknown:
        parser.error(f"unknown task(s) {unknown}; vision tasks: {', '.join(TASKS)}")
    rows = []
    print("task       k  slice  eager ms  graphed ms  eager/s  graphed/s  speed-up [95%]")
    for name in names:
        for k in (int(x) for x in args.micro_batches.split(",")):
            r = measure(name, k, args.batches)
            rows.append(r)
            print(
                f"{name:9} {k:2} {r['slice_images']:6} {r['eager_step_ms_median']:9.2f} "
                f"{r['graphed_step_ms_median']:11.2f} {r['eager_samples_per_s']:8.0f} "
                f"{r['graphed_samples_per_s']:10.0f}  {r['speedup_frac']:+.0%} "
                f"[{r['speedup_low']:+.0%}, {r['speedup_high']:+.0%}]",
                flush=True,
            )
            torch.cuda.empty_cache()
    if args.out:
        meta = {
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "python": platform.python_version(),
        }
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
