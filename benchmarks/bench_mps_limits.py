"""Do MPS client priority and SM share reach the GPU? Training step time beside a co-running task.

One CUDA training rank (a bf16 GPT stage, no pipeline peers) under the run's own MPS daemon,
with a side task attached through the Session *without gating* (``gating="none"``), so it
computes right through training and only the GPU limits stand between the two. The modes
cycle A B C D A B C D … in one run, each held for ``--window-s`` after its task process is
running again:

- ``alone``: no side task (detached; the baseline);
- ``p0``: the task at MPS client priority 0 (same as training), all SMs;
- ``p1``: priority 1 (below training), all SMs;
- ``p1-sm25``: priority 1 and 25% of the SMs (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``).

Reported per mode: median training step time, its ratio to ``alone``, and the task's
throughput. If priority is in effect, ``p1`` slows training less than ``p0``; if the SM share
is, ``p1-sm25`` less again and the task's throughput drops. A changed priority or share
restarts the task process from its checkpoint (MPS reads both at process start).

    python benchmarks/bench_mps_limits.py --out benchmarks/results/mps-limits-h200-<date>.json
"""

from __future__ import annotations

import argparse
import platform
import shlex
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from bench_output import write_results

from freeride_lab.core.config import RunConfig
from freeride_lab.lab.session import Session

MODES: dict[str, dict[str, Any]] = {
    "alone": {},
    "p0": {"priority": 0, "sm_pct": 100.0},
    "p1": {"priority": 1, "sm_pct": 100.0},
    "p1-sm25": {"priority": 1, "sm_pct": 25.0},
}


def wait(what: str, cond: Any, timeout_s: float, run: Session) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return
        if run.failure is not None:
            raise RuntimeError(f"run failed while waiting for {what}: {run.failure}")
        time.sleep(0.2)
    raise TimeoutError(f"no {what} within {timeout_s:.0f} s")


def task_view(run: Session, task_id: str) -> dict[str, Any]:
    return next(t for t in run.tasks if t["id"] == task_id)


def step_times_ms(run: Session, after_step: int, upto_step: int) -> list[float]:
    steps = run.steps
    window = steps[(steps["step"] > after_step) & (steps["step"] <= upto_step)]
    return [float(v) for v in window["duration_ms"]]


def set_mode(run: Session, task_id: str | None, mode: str, args: argparse.Namespace) -> str | None:
    """Put the side task into ``mode``; its id (None before the first attach)."""
    limits = MODES[mode]
    if not limits:
        if task_id is not None and not task_view(run, task_id)["detached"]:
            run.detach(task_id)
        return task_id
    if task_id is None:
        task_id = run.attach(
            args.task,
            stage=0,
            budget_ms=args.budget_ms,
            gating="none",
            options={"preset": args.preset},
            **limits,
        )["id"]
    elif task_view(run, task_id)["detached"]:
        run.attach(task_id, **limits)  # resumes from its checkpoint under these limits
    else:
        run.tune(task_id, **limits)
    start = task_view(run, task_id)["progress"]
    # Running again under the new limits: progress moves past where the change left it.
    wait(
        f"the task to run in mode {mode}",
        lambda: (
            task_view(run, task_id)["state"] == "RUNNING"
            and task_view(run, task_id)["progress"] > start
        ),
        180,
        run,
    )
    return task_id


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="resnet18")
    parser.add_argument("--window-s", type=float, default=8.0)
    parser.add_argument("--settle-s", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--budget-ms", type=float, default=50.0)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=4096)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--dry-run-cpu",
        action="store_true",
        help="check the bookkeeping on CPU with a tiny model (numbers mean nothing)",
    )
    args = parser.parse_args(argv)
    # one training rank, as the GPU bench's stage; the CPU dry run only shrinks it
    config = RunConfig(
        schedule="1F1B",
        stages=1,
        microbatches=4,
        steps=10**7,
        workload="text",
        layers=args.layers,
        d_model=args.d_model,
        heads=32,
        seq_len=2048,
        microbatch_size=3,
        dtype="bfloat16",
        device="cuda",
        mps=True,
    )
    if args.dry_run_cpu:
        config = config.replace(
            microbatches=2, layers=2, d_model=64, heads=2, seq_len=32, microbatch_size=2,
            dtype="float32", device="cpu", backend=None, mps=None,
        )  # fmt: skip
        args.preset = "cpu"
    elif not torch.cuda.is_available():
        print("bench_mps_limits: needs a CUDA GPU (MPS limits do not exist on CPU)")
        return 2
    else:
        args.preset = "gpu"
    root = Path(tempfile.mkdtemp(prefix="frl-mps-limits-"))
    samples: dict[str, list[float]] = {m: [] for m in MODES}
    throughput: dict[str, list[float]] = {m: [] for m in MODES}
    run = Session.launch(config, run_dir=root / "run", grace_s=10)
    try:
        if not run.mps_active and not args.dry_run_cpu:
            print("bench_mps_limits: the run has no MPS daemon; priority and SM share cannot apply")
            return 2
        wait("three training steps", lambda: run.steps_done >= 3, 300, run)
        task_id: str | None = None
        for r in range(args.rounds):
            for mode in MODES:
                task_id = set_mode(run, task_id, mode, args)
                time.sleep(args.settle_s)
                first = run.steps_done
                p0 = task_view(run, task_id)["progress"] if (task_id and MODES[mode]) else 0.0
                time.sleep(args.window_s)
                last = run.steps_done
                p1 = task_view(run, task_id)["progress"] if (task_id and MODES[mode]) else 0.0
                times = step_times_ms(run, first, last)
                samples[mode].extend(times)
                throughput[mode].append((p1 - p0) / args.window_s)
                print(
                    f"round {r} {mode:8s}: {len(times)} steps, median "
                    f"{statistics.median(times) if times else float('nan'):.1f} ms, "
                    f"task {throughput[mode][-1]:.1f}/s",
                    flush=True,
                )
        base = statistics.median(samples["alone"])
        rows = {
            mode: {
                "steps": len(v),
                "median_step_ms": statistics.median(v),
                "ratio_to_alone": statistics.median(v) / base,
                "task_throughput_per_s": statistics.median(throughput[mode]),
                **MODES[mode],
            }
            for mode, v in samples.items()
        }
        unit = task_view(run, task_id)["unit"] if task_id else ""
    finally:
        run.stop()

    print(f"\n{'mode':10s} {'steps':>5s} {'step ms':>8s} {'vs alone':>9s} {unit + '/s':>12s}")
    for mode, row in rows.items():
        print(
            f"{mode:10s} {row['steps']:5d} {row['median_step_ms']:8.1f} "
            f"{row['ratio_to_alone']:9.3f} {row['task_throughput_per_s']:12.1f}"
        )
    result = {
        "bench": "mps_limits",
        "command": shlex.join([sys.executable.rsplit("/", 1)[-1], *sys.argv]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (CPU)",
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "python": platform.python_version(),
        },
        "config": {
            "task": args.task,
            "window_s": args.window_s,
            "rounds": args.rounds,
            "layers": args.layers,
            "d_model": args.d_model,
        },
        "unit": unit,
        "modes": rows,
    }
    if args.out:
        write_results(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
