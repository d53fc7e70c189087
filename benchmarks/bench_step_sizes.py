"""Step sizes against one slice a step, replayed over a real pipeline's bubbles (the host's policy).

A vision task whose batch is cut in slices can step one slice at a time (the bench's GPU default)
or, with ``fit_slices``, take 1, 2 or 4 slices at once, the largest whose guard still fits the
bubble (``host.iterative`` [Note: step sizes]). Which fills a pipeline's bubbles better depends on
the bubbles and on the step times, not on the GPU itself, so this benchmark replays both with a
real task host process, on the CPU:

- the bubbles are a real run's: each one's predicted and real length as its rank announced them
  (``--bubbles``, extracted from a run's events with ``--extract RUN_DIR``), written to an edge
  file as a training rank would write them, in their order, with a short gap between them;
- the task sleeps each step for the time a step of that many slices took on a GPU
  (``--step-ms``: by default ResNet-18's graphed steps on the H200, 16, 32 and 64 images);
- each arm's budget is FreeRide's rule (median rounded up to 10 ms x 1.2) on the step it takes
  alone: one slice for a fixed arm, the whole batch with ``fit_slices`` (as the bench's solo
  phase sets it).

The bubbles are cut into ``--blocks`` blocks (at least 5) and the arms alternate block by block
(A B A B ...), so each block gives a paired difference; figures per block: images per second
of bubble time, and the share of bubble time under steps. Intervals: 95% t over the blocks'
paired differences (``core.intervals.mean_interval``). A CPU result: the sleeps stand for GPU
work, the host's own path is this machine's.

    python benchmarks/bench_step_sizes.py --bubbles BUBBLES.json --ranks 1 --out sizes.json
    python benchmarks/bench_step_sizes.py --extract RUN_DIR --ranks 1,3 --bubbles bubbles.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from freeride_lab.core.budget import step_budget_s
from freeride_lab.core.intervals import mean_interval
from freeride_lab.sidetasks.api import IterativeSideTask

HERE = Path(__file__).resolve()
#: ResNet-18's graphed step on the H200 by slices of a 64-image batch in 4 (16, 32, 64 images;
#: BENCHMARKS.md, table ``h200-12-04f-graphed-steps``).
RESNET18_MS = {1: 5.07, 2: 8.31, 4: 14.06}
IMAGES_PER_SLICE = 16
SLICES = 4
GAP_S = 0.004  # between two replayed bubbles: the rank computes


class ReplayedSlices(IterativeSideTask):
    """A batch of ``SLICES`` slices; a step of n slices sleeps ``step_ms[n]`` and trains on
    n x ``IMAGES_PER_SLICE`` images. ``fixed`` > 0: every step takes that many slices (and the
    task offers no sizes); 0: it offers 1, 2, 4, ... slices, never past the batch's end."""

    unit = "images"

    def __init__(self, step_ms: dict[str, float], fixed: int = 0) -> None:
        super().__init__(step_ms=step_ms, fixed=fixed)
        self.step_ms = {int(k): float(v) for k, v in step_ms.items()}
        self.fixed = fixed
        self.done = 0

    @property
    def step_sizes(self) -> tuple[int, ...]:
        if self.fixed:
            return (1,)
        left = SLICES - self.done
        return tuple(2**j for j in range(left.bit_length()))

    def step(self, size: int = 1) -> float:
        n = self.fixed or size
        time.sleep(self.step_ms[n] / 1e3)
        self.done = (self.done + n) % SLICES
        return float(n * IMAGES_PER_SLICE)


def extract(run_dir: Path, rank: int) -> list[tuple[float, float]]:
    """(predicted, real) length in ms of every bubble ``rank`` announced in ``run_dir``."""
    from freeride_lab.bench.readout import announced_bubbles  # not in the task's process

    return [(b.predicted_ms, b.real_ms) for b in announced_bubbles(run_dir, rank)]


def run_arm(
    bubbles: Sequence[tuple[float, float]], *, fixed: int, step_ms: dict[int, float], root: Path
) -> list[dict[str, Any]]:
    """One arm over ``bubbles`` in a fresh task host; its steps as (start, end, images, bubble)."""
    from freeride_lab.core import events as ev
    from freeride_lab.core.sidetask_state import SideTaskState
    from freeride_lab.io.rundir import RunDir
    from freeride_lab.sidetasks.edges import EdgeWriter, edge_path
    from freeride_lab.sidetasks.process import TaskProcess
    from freeride_lab.sidetasks.spec import HostSpec, TaskSpec

    run = RunDir(root / f"arm-{fixed}-{time.time_ns()}")
    run.create()
    edges = EdgeWriter.create(edge_path(run.path, 0))
    budget_s = step_budget_s(step_ms[fixed or max(step_ms)] / 1e3)
    spec = TaskSpec.from_dict({
        "task": f"{HERE}:ReplayedSlices", "task_id": "t",
        "options": {"step_ms": {str(k): v for k, v in step_ms.items()}, "fixed": fixed},
        "limits": {"budget_s": budget_s},
    })  # fmt: skip
    proc = TaskProcess(spec)
    proc.start(HostSpec(task=spec, run_dir=str(run.path), rank=0, stage=0),
               log_path=run.logs_dir / "task-t.log")  # fmt: skip
    try:
        _serve_until(proc, SideTaskState.CREATED)
        proc.request({"cmd": "activate"})
        _serve_until(proc, SideTaskState.PAUSED)
        spans = []
        for i, (predicted_ms, real_ms) in enumerate(bubbles):
            start = time.time_ns()
            edges.bubble_start(i, 0, start, start + round(predicted_ms * 1e6))
            time.sleep(real_ms / 1e3)
            end = time.time_ns()
            edges.bubble_end(i, 0, end)
            spans.append((start, end))
            time.sleep(GAP_S)
        proc.request({"cmd": "stop", "reason": "replay over"})
        proc.wait_exit(30)
    finally:
        if proc.alive:
            proc.kill("replay over")
            proc.wait_exit(10)
        proc.close()
        edges.close()
    lines = (run.events_dir / "task-t.jsonl").read_text().splitlines()
    steps = [e for e in map(ev.from_json, lines) if isinstance(e, ev.SideTaskStep)]
    return [{"bubble_ns": spans, "steps": [(s.start_ns, s.end_ns, s.progress) for s in steps]}]


def _serve_until(proc: Any, state: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while proc.state is not state:
        if proc.conn is None or time.monotonic() > deadline:
            raise RuntimeError(f"the task process is {proc.state}, waited for {state}")
        if proc.conn.poll(0.05):
            proc.receive()


def block_figures(record: dict[str, Any]) -> dict[str, float]:
    """Images per second of bubble time, and the share of bubble time under steps (a step
    counts up to its bubble's end)."""
    spans, steps = record["bubble_ns"], record["steps"]
    bubble_ns = sum(e - s for s, e in spans)
    images, under = 0.0, 0
    for start, end, progress in steps:
        inside = [(s, e) for s, e in spans if s <= start < e]
        if not inside:
            continue
        _, e = inside[0]
        images += progress
        under += min(end, e) - start
    return {"images_per_s": images / (bubble_ns / 1e9), "under_steps_frac": under / bubble_ns}


def replay(
    bubbles: Sequence[tuple[float, float]], *, blocks: int, fixed: int, step_ms: dict[int, float]
) -> dict[str, Any]:
    """Both arms over ``bubbles`` in ``blocks`` blocks, alternating; figures and differences."""
    n = len(bubbles) // blocks
    root = Path(tempfile.mkdtemp(prefix="step-sizes-"))
    per: dict[str, list[dict[str, float]]] = {"fixed": [], "fit": []}
    for b in range(blocks):
        part = bubbles[b * n : (b + 1) * n]
        order = ("fixed", "fit") if b % 2 == 0 else ("fit", "fixed")
        for arm in order:
            rec = run_arm(part, fixed=fixed if arm == "fixed" else 0, step_ms=step_ms, root=root)
            per[arm].append(block_figures(rec[0]))
            print(f"block {b} {arm}: {per[arm][-1]}", flush=True)
    out: dict[str, Any] = {"bubbles_per_block": n, "blocks": blocks, "arms": {}}
    for arm, figs in per.items():
        out["arms"][arm] = {k: mean_interval([f[k] for f in figs]).record() for k in figs[0]}
    out["fit_minus_fixed"] = {
        k: mean_interval(
            [a[k] - b[k] for a, b in zip(per["fit"], per["fixed"], strict=True)]
        ).record()
        for k in per["fit"][0]
    }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bubbles", type=Path, required=True,
                    help="bubbles JSON (written by --extract, read otherwise)")  # fmt: skip
    ap.add_argument("--extract", type=Path, default=None, metavar="RUN_DIR",
                    help="write --bubbles from this run's events, then stop")  # fmt: skip
    ap.add_argument("--ranks", default="1", help="ranks to extract or replay, comma list")
    ap.add_argument("--first", type=int, default=0, help="leading bubbles left out")
    ap.add_argument("--count", type=int, default=600, help="bubbles replayed per rank")
    ap.add_argument("--blocks", type=int, default=6, help="blocks (at least 5)")
    ap.add_argument("--fixed", type=int, default=2, help="slices a step in the fixed arm")
    ap.add_argument("--step-ms", default=",".join(f"{k}:{v}" for k, v in RESNET18_MS.items()),
                    help="ms of a step by slices, e.g. 1:5.07,2:8.31,4:14.06")  # fmt: skip
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    ranks = [int(r) for r in args.ranks.split(",")]
    if args.extract is not None:
        data = {"source": args.extract.name,
                "ranks": {str(r): extract(args.extract, r) for r in ranks}}  # fmt: skip
        args.bubbles.write_text(json.dumps(data) + "\n")
        print(f"wrote {args.bubbles}: " + ", ".join(
            f"rank {r} {len(v)} bubbles" for r, v in data["ranks"].items()))  # fmt: skip
        return 0
    if args.blocks < 5:
        ap.error(f"--blocks {args.blocks}: the intervals need at least 5 blocks")
    step_ms = {int(k): float(v) for k, v in (p.split(":") for p in args.step_ms.split(","))}
    if sorted(step_ms) != [1, 2, 4] or not all(
        math.isfinite(v) and v > 0 for v in step_ms.values()
    ):
        ap.error(f"--step-ms {args.step_ms!r}: give 1, 2 and 4 slices, each > 0 ms")
    if args.fixed not in step_ms:
        ap.error(f"--fixed {args.fixed}: one of {sorted(step_ms)}")
    source = json.loads(args.bubbles.read_text())
    results = []
    for r in ranks:
        bubbles = [tuple(b) for b in source["ranks"][str(r)]][args.first : args.first + args.count]
        res = replay(bubbles, blocks=args.blocks, fixed=args.fixed, step_ms=step_ms)
        results.append({"rank": r, **res})
        d = res["fit_minus_fixed"]["images_per_s"]
        print(f"rank {r}: fit - fixed {d['value']:.0f} images/s [{d['lo']:.0f}, {d['hi']:.0f}]")
    if args.out is not None:
        from bench_output import command_line, cpu_model, write_results

        write_results({
            "benchmark": "step-sizes", "command": command_line(),
            "date": time.strftime("%Y-%m-%d"),
            "machine": {"platform": platform.platform(), "cpu": cpu_model(), "device": "cpu"},
            "bubbles": {"file": args.bubbles.name, "source": source.get("source")},
            "step_ms": {str(k): v for k, v in step_ms.items()}, "fixed": args.fixed,
            "images_per_slice": IMAGES_PER_SLICE, "runs": results,
        }, args.out)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
