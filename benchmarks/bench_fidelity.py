"""How far above theory a real pipeline's measured bubbles sit, by action length, and why.

For each schedule (one shape each) and each action length, one run of sleep-timed synthetic
stages (every F, I and W of a stage chunk sleeps the same time), run alone on the machine with
no side task. Per rank: the measured idle share of each step's window (the median over the
measured steps, as ``tests/acceptance/test_fidelity.py`` measures it) beside theory, and the
bubble time per step split by ``Session.summary`` into schedule idle (what the plan leaves idle
at the run's own action costs), peer wait (inputs late beyond that, and transfers) and host
time (the rank's own dispatch between actions). Host plus peer time divided by the rank's
actions per step is what each action costs the run beyond its sleep: a fixed cost, so the
shorter the action, the further the measured share sits above theory.

    python benchmarks/bench_fidelity.py --action-ms 2,10,50 --out fidelity.json
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from bench_output import command_line, write_results

from freeride_lab.core.bubbles import bubble_fraction
from freeride_lab.core.config import RunConfig
from freeride_lab.core.theory import theory_bubble_fraction
from freeride_lab.lab.session import Session

#: one shape per schedule: (S, M, V), as the fidelity test's larger shapes
SHAPES: dict[str, tuple[int, int, int]] = {
    "GPipe": (4, 8, 1),
    "1F1B": (4, 8, 1),
    "Interleaved1F1B": (4, 8, 2),
    "LoopedBFS": (4, 8, 2),
    "InterleavedZeroBubble": (4, 8, 2),
    "ZBVZeroBubble": (4, 8, 2),
    "DualPipeV": (4, 16, 2),
}


def one_run(
    schedule: str, action_ms: float, *, steps: int, skip: int, root: Path
) -> dict[str, Any]:
    stages, microbatches, chunks = SHAPES[schedule]
    per_rank = action_ms * chunks  # a scalar cost is one rank's, split over its chunks
    config = RunConfig(
        schedule=schedule, stages=stages, microbatches=microbatches, chunks=chunks, steps=steps,
        workload="synthetic", t_forward_ms=per_rank, t_backward_input_ms=per_rank,
        t_backward_weight_ms=per_rank, d_model=16, seq_len=8, microbatch_size=2,
        side_tasks=False, run_dir=str(root / f"{schedule}-{action_ms:g}ms-{int(time.time())}"),
    )  # fmt: skip
    session = Session.launch(config, grace_s=20.0)
    try:
        state = session.wait(timeout_s=600)
    finally:
        session.stop()  # a run that hung or failed leaves nothing running
    actions = session.actions
    measured = actions[actions["step"] >= skip]
    frac = bubble_fraction(measured).groupby("rank")["idle_frac"].median()
    split = session.summary(skip_steps=skip).set_index("rank")
    per_step = measured.groupby(["rank", "step"]).size().groupby("rank").median()
    theory = theory_bubble_fraction(schedule, stages, microbatches, chunks)
    ranks = []
    for rank, share in frac.items():
        row = split.loc[rank]
        overhead = row["peer_ms_per_step"] + row["host_ms_per_step"]
        ranks.append({
            "rank": int(rank),
            "measured_frac": round(float(share), 4),
            "points_above_theory": round(100 * (float(share) - theory), 2),
            "schedule_ms_per_step": round(float(row["schedule_ms_per_step"]), 2),
            "peer_ms_per_step": round(float(row["peer_ms_per_step"]), 2),
            "host_ms_per_step": round(float(row["host_ms_per_step"]), 2),
            "actions_per_step": int(per_step[rank]),
            "overhead_ms_per_action": round(float(overhead) / float(per_step[rank]), 3),
        })  # fmt: skip
    return {
        "schedule": schedule,
        "stages": stages,
        "microbatches": microbatches,
        "chunks": chunks,
        "action_ms": action_ms,
        "state": str(state),
        "steps_measured": int(measured["step"].nunique()),
        "theory_frac": round(theory, 4),
        "per_rank": ranks,
    }


def _lengths(text: str) -> list[float]:
    """``--action-ms``: positive numbers, comma separated."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive numbers of ms, e.g. 2,10,50")
    return values


def _schedules(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in SHAPES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"{text!r}: valid schedules are {', '.join(SHAPES)}")
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--schedules", type=_schedules, default=list(SHAPES))
    ap.add_argument("--action-ms", type=_lengths, default=[2.0, 10.0, 50.0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--skip", type=int, default=3, help="leading steps left out (warm-up)")
    ap.add_argument("--run-root", type=Path, default=None)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if not 0 <= args.skip < args.steps:
        ap.error(f"--skip {args.skip} must lie in [0, --steps {args.steps})")
    root = args.run_root or Path(tempfile.mkdtemp(prefix="fidelity-"))
    results = []
    for schedule in args.schedules:
        for action_ms in args.action_ms:
            r = one_run(schedule, action_ms, steps=args.steps, skip=args.skip, root=root)
            results.append(r)
            worst = max(row["points_above_theory"] for row in r["per_rank"])
            cost = [row["overhead_ms_per_action"] for row in r["per_rank"]]
            print(f"{schedule} {action_ms:g} ms: theory {100 * r['theory_frac']:.1f}%, worst "
                  f"rank {worst:+.1f} points, overhead ms/action {cost}", flush=True)  # fmt: skip
    record = {
        "benchmark": "fidelity",
        "command": command_line(),
        "date": time.strftime("%Y-%m-%d"),
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "torch": torch.__version__, "cpus": len(os.sched_getaffinity(0))},
        "results": results,
    }  # fmt: skip
    write_results(record, args.out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
