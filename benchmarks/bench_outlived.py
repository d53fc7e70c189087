"""Past a bubble's predicted end: what planning to its slot's survivors adds, replayed offline.

Once a bubble outlives the end its rank predicted, the side task's host either stops launching
steps (``RuntimeOptions.outlived="stop"``, FreeRide's) or plans to the end that the slot's
recent longer bubbles give (``"survivors"``, ``core.bubble_survival``). Which pays depends on
how a pipeline's bubbles spread, so this benchmark replays the bubbles a real run's ranks
announced (each one's slot, predicted and real length, in order; ``--extract RUN_DIR`` writes
them from a run's events with ``bench.readout.announced_bubbles``) through ``SurvivorLengths``
as the host consults it, for each share of early survivors (``max_early``), and scores per
bubble:

- *plannable*: the part of the bubble that steps may run in: up to the predicted end under
  "stop" (none where the prediction is within the guard), plus every stretch the survivors
  open later, each up to its end;
- *overrun share*: bubbles that ended while steps were allowed to run past their end (shorter
  than the end planned for them: the rank's prediction, or the survivors' end), where a step
  runs into training's compute by up to one step.

The guard is the side task's smallest step's guard on that rank (``--guard-ms``, e.g. from the
bench result's ``tight_budget_ms`` over the task's largest step size). Bubbles longer than a
second are the bench's pauses (solo phases, block boundaries), not training's, and are left
out of the replay and the history alike. Figures are per block of consecutive training steps
(``--blocks``, at least 5); each arm's difference from "stop" is the mean of the paired
per-block differences with its 95% t-interval (``core.intervals.mean_interval``). Arithmetic
over recorded bubbles: no task runs, so no step's real length or host latency is in it.

    python benchmarks/bench_outlived.py --extract RUN_DIR [RUN_DIR ...] --ranks 0,2 --bubbles B.json
    python benchmarks/bench_outlived.py --bubbles B.json --guard-ms 0:1.68,2:0.78 --out out.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench_output import command_line, write_results

from freeride_lab.bench.readout import AnnouncedBubble as Bubble
from freeride_lab.bench.readout import announced_bubbles
from freeride_lab.core.bubble_survival import SurvivorLengths
from freeride_lab.core.intervals import mean_interval

#: the shares of early survivors replayed (0: the survivors' minimum; 0.2: the default)
SHARES = (0.0, 0.1, 0.2, 0.34)
LONGEST_MS = 1000.0  # longer bubbles are the bench's pauses, not training's
FIGURES = ("plannable_frac", "overrun_frac")


def replay_bubble(b: Bubble, survivors: SurvivorLengths | None, guard_ns: int) -> tuple[int, bool]:
    """One bubble as the host plans it: the ns steps may run in, and whether it ended while
    steps were allowed past its end. ``survivors`` None: "stop"."""
    predicted, real = round(b.predicted_ms * 1e6), round(b.real_ms * 1e6)
    covered = min(predicted, real) if predicted > guard_ns else 0
    reach = covered  # the latest moment steps may run to so far
    overrun = guard_ns < predicted and real < predicted
    elapsed = max(0, predicted - guard_ns)  # where the host stops under the prediction
    while survivors is not None and elapsed < real:
        room = survivors.room_after(b.slot, elapsed, guard_ns)
        if room is None or room[0] >= real:
            break
        start, end = room
        covered += max(0, min(end, real) - max(start, reach))
        reach = max(reach, min(end, real))
        if real < end:
            overrun = True
            break
        elapsed = end - guard_ns
    return covered, overrun


def replay_rank(
    bubbles: Sequence[Bubble], *, guard_ms: float, blocks: int, skip: int = 0
) -> dict[str, Any]:
    """Every share of ``SHARES`` and "stop" over one rank's bubbles, per block of steps."""
    kept = [b for b in bubbles if b.real_ms <= LONGEST_MS]
    steps = sorted({b.step for b in kept if b.step >= skip})
    if len(steps) < blocks:
        raise ValueError(f"{len(steps)} steps cannot make {blocks} blocks")
    block_of = {s: i * blocks // len(steps) for i, s in enumerate(steps)}
    guard_ns = round(guard_ms * 1e6)
    arms: dict[str, list[dict[str, float]]] = {}
    for name, share in (("stop", None), *((f"survivors {s:g}", s) for s in SHARES)):
        survivors = None if share is None else SurvivorLengths(max_early=share)
        sums = [[0, 0, 0, 0] for _ in range(blocks)]  # idle, covered, bubbles, overruns
        for b in kept:  # the history runs through every bubble, as on the host
            covered, overrun = replay_bubble(b, survivors, guard_ns)
            if survivors is not None:
                survivors.observe(b.slot, round(b.real_ms * 1e6))
            if b.step in block_of:
                s = sums[block_of[b.step]]
                s[0] += round(b.real_ms * 1e6)
                s[1] += covered
                s[2] += 1
                s[3] += overrun
        arms[name] = [{"plannable_frac": c / i, "overrun_frac": o / n} for i, c, n, o in sums]
    measured = sum(b.step in block_of for b in kept)
    out: dict[str, Any] = {
        "steps": len(steps), "blocks": blocks, "guard_ms": guard_ms, "bubbles": measured,
        "arms": {},
    }  # fmt: skip
    for name, figures in arms.items():
        entry: dict[str, Any] = {}
        for fig in FIGURES:
            values = [f[fig] for f in figures]
            entry[fig] = mean_interval(values).record()
            if name != "stop":
                entry[f"{fig}_vs_stop"] = mean_interval(
                    [a - f[fig] for a, f in zip(values, arms["stop"], strict=True)]
                ).record()
        out["arms"][name] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bubbles", type=Path, required=True,
                    help="bubbles JSON (written by --extract, read otherwise)")  # fmt: skip
    ap.add_argument("--extract", type=Path, nargs="*", default=None, metavar="RUN_DIR",
                    help="write --bubbles from these runs' events, then stop")  # fmt: skip
    ap.add_argument("--ranks", default="0,2", help="ranks to extract, comma list")
    ap.add_argument("--guard-ms", default="0:1.68,2:0.78",
                    help="rank:guard of the task's smallest step (ms), comma list")  # fmt: skip
    ap.add_argument("--blocks", type=int, default=8, help="blocks of steps (at least 5)")
    ap.add_argument("--skip", type=int, default=5, help="leading steps left out (warm-up)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.extract is not None:
        ranks = [int(r) for r in args.ranks.split(",")]
        data = {
            "runs": {
                path.name: {str(r): [[b.step, b.slot, b.predicted_ms, b.real_ms]
                                     for b in announced_bubbles(path, r)] for r in ranks}
                for path in args.extract
            }
        }  # fmt: skip
        args.bubbles.write_text(json.dumps(data) + "\n")
        print(f"wrote {args.bubbles}")
        return 0
    if args.blocks < 5:
        ap.error(f"--blocks {args.blocks}: the intervals need at least 5 blocks")
    guards = {int(r): float(ms) for r, ms in (p.split(":") for p in args.guard_ms.split(","))}
    source = json.loads(args.bubbles.read_text())
    results = []
    for run, per_rank in source["runs"].items():
        for rank, rows in per_rank.items():
            if int(rank) not in guards:
                continue
            bubbles = [Bubble(int(s), int(sl), float(p), float(r)) for s, sl, p, r in rows]
            res = replay_rank(
                bubbles, guard_ms=guards[int(rank)], blocks=args.blocks, skip=args.skip
            )
            results.append({"run": run, "rank": int(rank), **res})
            for name, e in res["arms"].items():
                planned, over = e["plannable_frac"]["value"], e["overrun_frac"]["value"]
                print(f"{run} rank {rank} {name}: plannable {planned:.1%}, overrun in "
                      f"{over:.1%} of bubbles", flush=True)  # fmt: skip
    record = {
        "benchmark": "outlived",
        "command": command_line(),
        "date": time.strftime("%Y-%m-%d"),
        "bubbles": args.bubbles.name,
        "results": results,
    }
    if args.out is not None:
        write_results(record, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
