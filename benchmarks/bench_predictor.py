"""How well each bubble predictor plans for the bubbles a real pipeline leaves, replayed offline.

A rank predicts each bubble's length when the bubble starts (``RuntimeOptions.predictor``); a
side task plans its steps to that prediction. This benchmark takes the bubbles that runs
really measured (``Session.bubbles``: every rank's idle gaps, slot by slot, step by step),
replays each predictor over them in the order the rank met them, and scores every prediction
against the length it was made for (``core.bubble_prediction``):

- *planned*: min(prediction, length) over the idle time: what a task could plan steps for;
- *over*: max(0, prediction - length) over the idle time: how far predictions promised more
  than the bubbles held (a step planned to the prediction runs that far into compute);
- *missed*: the share of bubbles shorter than their prediction.

Each figure is computed per block of consecutive steps (``--blocks``, at least 5), and the
difference of each predictor from FreeRide's minimum of five is the mean of the paired
per-block differences with its 95% t-interval (``core.intervals.mean_interval``). The same
predictor instance runs through all blocks, as on a rank.

Runs: the text workload (a small byte-level GPT, every action computed) on the CPU, one run
per schedule; or the runs in ``--run-dirs`` (a GPU run's directory, say).

    python benchmarks/bench_predictor.py --steps 80 --out predictor.json
    python benchmarks/bench_predictor.py --run-dirs RUN_DIR [RUN_DIR ...] --out predictor.json
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from bench_output import command_line, cpu_model, write_results

from freeride_lab.core.bubble_prediction import FeedbackSlotPredictor, Predictor, predictions
from freeride_lab.core.bubble_prediction import score as score_of
from freeride_lab.core.bubbles import SlotPredictor
from freeride_lab.core.config import RunConfig
from freeride_lab.core.intervals import mean_interval
from freeride_lab.lab.session import Session

#: The predictors compared; "min-of-5" is the reference (FreeRide's, the runtime's default).
PREDICTORS: dict[str, Callable[[], Predictor]] = {
    "min-of-5": lambda: SlotPredictor(k=5, method="min"),
    "p10-of-16": lambda: SlotPredictor(k=16, method="percentile", q=10.0),
    "feedback": lambda: FeedbackSlotPredictor(),
}
REFERENCE = "min-of-5"
#: one shape per schedule: (S, M, V)
SHAPES: dict[str, tuple[int, int, int]] = {
    "1F1B": (4, 8, 1),
    "Interleaved1F1B": (4, 8, 2),
    "InterleavedZeroBubble": (4, 8, 2),
}
FIGURES = ("planned_frac", "over_frac", "miss_frac")


def cpu_run(schedule: str, *, steps: int, root: Path) -> Path:
    """One CPU run of the text workload; its run directory."""
    stages, microbatches, chunks = SHAPES[schedule]
    config = RunConfig(
        schedule=schedule, stages=stages, microbatches=microbatches, chunks=chunks, steps=steps,
        workload="text", layers=2 * stages * chunks, d_model=64, heads=2, seq_len=64,
        microbatch_size=4, side_tasks=False,
        run_dir=str(root / f"{schedule}-{int(time.time())}"),
    )  # fmt: skip
    session = Session.launch(config, grace_s=20.0)
    try:
        session.wait(timeout_s=900)
    finally:
        session.stop()  # a run that hung or failed leaves nothing running
    return Path(config.run_dir)


def replay_run(bubbles: pd.DataFrame, *, skip: int, blocks: int) -> dict[str, Any]:
    """Every predictor over one run's bubbles, rank by rank; figures per block of steps and
    each predictor's paired difference from the reference."""
    steps = sorted(int(s) for s in bubbles["step"].unique() if s >= skip)
    if len(steps) < blocks:
        raise ValueError(f"{len(steps)} measured steps cannot make {blocks} blocks")
    block_of = {s: i * blocks // len(steps) for i, s in enumerate(steps)}
    per_block: dict[str, list[dict[str, float]]] = {}
    for name, make in PREDICTORS.items():
        rows: list[tuple[int, int | None, int]] = []  # (block, prediction, length)
        for _, mine in bubbles.sort_values(["rank", "step", "start_ms"]).groupby("rank"):
            lengths = zip(mine["slot"], mine["duration_ms"], strict=True)
            trace = [(int(slot), round(ms * 1e6)) for slot, ms in lengths]
            predicted = predictions(make(), trace)  # one predictor per rank, as on a rank
            for step, p, (_, length) in zip(mine["step"], predicted, trace, strict=True):
                if int(step) in block_of:
                    rows.append((block_of[int(step)], p, length))
        per_block[name] = [
            _figures([(p, n) for b, p, n in rows if b == block]) for block in range(blocks)
        ]
    out: dict[str, Any] = {"steps_measured": len(steps), "blocks": blocks, "predictors": {}}
    for name, figures in per_block.items():
        entry: dict[str, Any] = {}
        for fig in FIGURES:
            values = [f[fig] for f in figures]
            entry[fig] = mean_interval(values).record()
            if name != REFERENCE:
                ref = [f[fig] for f in per_block[REFERENCE]]
                entry[f"{fig}_vs_{REFERENCE}"] = mean_interval(
                    [a - b for a, b in zip(values, ref, strict=True)]
                ).record()
        entry["bubbles"] = sum(f["bubbles"] for f in figures)
        out["predictors"][name] = entry
    return out


def _figures(pairs: Sequence[tuple[int | None, int]]) -> dict[str, float]:
    s = score_of([p for p, _ in pairs], [n for _, n in pairs])
    return {"planned_frac": s.planned_frac, "over_frac": s.over_frac,
            "miss_frac": s.miss_frac, "bubbles": s.bubbles}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--schedules", default=",".join(SHAPES),
                    help=f"CPU runs, comma list of {', '.join(SHAPES)}")  # fmt: skip
    ap.add_argument("--run-dirs", type=Path, nargs="*", default=None,
                    help="replay these runs instead of running the CPU ones")  # fmt: skip
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--skip", type=int, default=5, help="leading steps left out (warm-up)")
    ap.add_argument("--blocks", type=int, default=8, help="blocks of steps (at least 5)")
    ap.add_argument("--run-root", type=Path, default=None)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.blocks < 5:
        ap.error(f"--blocks {args.blocks}: the intervals need at least 5 blocks")
    if args.run_dirs:
        runs = [(path.name, path) for path in args.run_dirs]
    else:
        unknown = [s for s in args.schedules.split(",") if s not in SHAPES]
        if unknown:
            ap.error(f"--schedules: unknown {unknown}; valid: {', '.join(SHAPES)}")
        root = args.run_root or Path(tempfile.mkdtemp(prefix="predictor-"))
        runs = [(s, cpu_run(s, steps=args.steps, root=root)) for s in args.schedules.split(",")]
    results = []
    for label, path in runs:
        bubbles = Session.open(path).bubbles
        r = {"run": label, **replay_run(bubbles, skip=args.skip, blocks=args.blocks)}
        results.append(r)
        for name, e in r["predictors"].items():
            print(f"{label} {name}: planned {e['planned_frac']['value']:.1%}, over "
                  f"{e['over_frac']['value']:.2%}, missed {e['miss_frac']['value']:.1%}",
                  flush=True)  # fmt: skip
    record = {
        "benchmark": "predictor",
        "command": command_line(),
        "date": time.strftime("%Y-%m-%d"),
        "machine": {
            "platform": platform.platform(),
            "cpu": cpu_model(),
            "device": "cpu" if not args.run_dirs else "as recorded",
        },
        "reference": REFERENCE,
        "runs": results,
    }
    write_results(record, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
