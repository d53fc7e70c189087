"""What timing every pipeline action costs training: TimedPipelineStage vs plain PipelineStage.

One torchrun job per case runs ``RuntimeOptions(timed="alternate", alternate_every=k)``: blocks
of k steps alternate between ``TimedPipelineStage`` (A) and plain ``PipelineStage`` (B) in the
same processes with the same model, A B A B, so drift and machine load hit both alike. Per step
the global window (earliest window start to latest window end over ranks) is compared. The
first ``--warmup`` steps are dropped, and so is the first step of every block: the event sink
writes a step's events in the background during the *next* step, so that step carries the
previous block's telemetry cost (with k = 1 the timed steps' writing lands in the plain steps
and timed looks faster than plain). Each timed block and the plain block after it form a pair;
the overhead is the mean over pairs of (timed / plain - 1), with its 95% t-interval, and so is
the cost per action (the step-time difference over the rank's actions per step).

The plain steps do not touch the action recorder at all: they take the four step-clock stamps
a timed step also takes (window and optimizer), so the difference is what timing each action
and announcing its bubbles costs.

It also times the recorder's own ``start``/``stop`` pair in this process (no torch call), with
and without a live-edges receiver: the instrumentation cost per action (min and median of
repeats, since a shared box preempts single runs).

Cases: "text" (byte-level GPT, real compute) and "synthetic" (sleep-timed stages: fixed
compute, so the overhead is not buried in compute noise).

Run from the repository root with the package importable (``pip install -e .`` or
``PYTHONPATH=.``)::

    python benchmarks/bench_timing_overhead.py                         # CPU, gloo, 2 ranks
    python benchmarks/bench_timing_overhead.py --device cuda --stages 1  # one GPU
    python benchmarks/bench_timing_overhead.py --case synthetic --steps 30 --out /tmp/t.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from statistics import median, quantiles
from typing import Any

import numpy as np
import torch
from bench_output import command_line, write_results

from freeride_lab.core.config import RunConfig, RuntimeOptions
from freeride_lab.core.intervals import Interval, mean_interval
from freeride_lab.core.schedule import ActionKind
from freeride_lab.io.rundir import RunDir
from freeride_lab.pipeline.stage_build import make_predictor
from freeride_lab.pipeline.timed_stage import ActionRecorder

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results"


def case_config(case: str, args: argparse.Namespace) -> RunConfig:
    common: dict[str, Any] = dict(
        schedule=args.schedule,
        stages=args.stages,
        microbatches=args.microbatches,
        steps=args.steps,
        device=args.device,
        runtime=RuntimeOptions(
            timed="alternate",
            alternate_every=args.block,
            **({} if args.announce_min_ms is None else {"announce_min_ms": args.announce_min_ms}),
        ),
    )
    if case == "text":
        return RunConfig(
            workload="text",
            layers=max(args.layers, args.stages),
            d_model=args.d_model,
            heads=4,
            seq_len=args.seq_len,
            microbatch_size=args.microbatch_size,
            **common,
        )
    return RunConfig(
        workload="synthetic",
        t_forward_ms=5,
        t_backward_input_ms=5,
        t_backward_weight_ms=5,
        d_model=64,
        seq_len=64,
        microbatch_size=4,
        **common,
    )


def run_case(case: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    cfg = case_config(case, args)
    run_dir = RunDir(root / case)
    run_dir.create()
    run_dir.write_json(run_dir.run_json, {"config": cfg.to_dict(), "run_id": f"bench-{case}"})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={args.stages}",
        "--nnodes=1",
        "--master-addr=127.0.0.1",
        f"--master-port={port}",
        "-m",
        "freeride_lab.pipeline.rank",
        "--run-dir",
        str(run_dir.path),
    ]
    env = dict(os.environ, PYTHONPATH=str(REPO), FREERIDE_LOG_LEVEL="WARNING")
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout_s)
    if proc.returncode != 0:
        raise SystemExit(
            f"case {case}: torchrun exited {proc.returncode}\n{proc.stdout[-3000:]}"
            f"\n{proc.stderr[-3000:]}"
        )
    windows: dict[int, list[int]] = {}
    actions_per_step: dict[int, int] = {}
    for path in run_dir.events_dir.glob("rank-*.jsonl"):
        for line in path.read_text().splitlines():
            ev = json.loads(line)
            if ev["kind"] == "step":
                w = windows.setdefault(ev["step"], [ev["start_ns"], ev["end_ns"]])
                w[0], w[1] = min(w[0], ev["start_ns"]), max(w[1], ev["end_ns"])
            elif ev["kind"] == "action":
                actions_per_step[ev["step"]] = actions_per_step.get(ev["step"], 0) + 1
    ms = {step: (end - start) / 1e6 for step, (start, end) in windows.items()}
    k = args.block
    kept = {s: v for s, v in ms.items() if s >= args.warmup and s % k != 0}
    timed = [v for s, v in kept.items() if (s // k) % 2 == 0]
    plain = [v for s, v in kept.items() if (s // k) % 2 == 1]
    n_actions = median(actions_per_step.values())
    per_rank = n_actions / args.stages
    blocks: dict[int, list[float]] = {}
    for step, v in kept.items():
        blocks.setdefault(step // k, []).append(v)
    pairs = [
        (float(np.mean(blocks[b])), float(np.mean(blocks[b + 1])))
        for b in sorted(blocks)
        if b % 2 == 0 and b + 1 in blocks
    ]
    ratio = mean_interval([t / p - 1 for t, p in pairs])
    per_action = mean_interval([(t - p) * 1e3 / per_rank for t, p in pairs])
    a, b = median(timed), median(plain)
    return {
        "case": case,
        "config": cfg.to_dict(),
        "steps_compared": {"timed": len(timed), "plain": len(plain)},
        "block_pairs": len(pairs),
        "median_step_ms": {"timed": round(a, 3), "plain": round(b, 3)},
        "iqr_step_ms": {"timed": _iqr(timed), "plain": _iqr(plain)},
        "overhead_frac": _iv(ratio, 5),
        "actions_per_step_per_rank": per_rank,
        "overhead_us_per_action": _iv(per_action, 1),
        "wall_s": round(time.monotonic() - t0, 1),
    }


def _iv(iv: Interval, digits: int) -> dict[str, float | int]:
    return {
        "value": round(iv.value, digits),
        "lo": round(iv.lo, digits),
        "hi": round(iv.hi, digits),
        "blocks": iv.n,
    }


def _iqr(values: list[float]) -> list[float]:
    """25th and 75th percentile (ms): how noisy the machine was."""
    q = quantiles(values, n=4)
    return [round(q[0], 3), round(q[2], 3)]


class _NullEdges:
    def bubble_start(self, step: int, slot: int, t_ns: int, predicted_end_ns: int | None) -> None:
        pass

    def bubble_end(self, step: int, slot: int, t_ns: int) -> None:
        pass


def recorder_cost_ns(
    edges: bool, device: str, n: int = 2_000, repeats: int = 9, announce_min_ns: int = 0
) -> dict[str, int]:
    """Cost of one recorder start+stop pair (ns) in this process: min and median of repeats.

    With edges the recorder carries the predictor a rank's live edges carry. With
    ``announce_min_ns`` above the back-to-back gaps' length every slot stays quiet (the
    steady state of a real rank, whose gaps between actions are microseconds)."""
    rec = ActionRecorder(
        device=device,
        edges=_NullEdges() if edges else None,
        predictor=make_predictor() if edges else None,
        announce_min_ns=announce_min_ns,
    )
    costs = []
    for r in range(repeats):
        rec.begin_step(r)
        t0 = time.perf_counter_ns()
        for i in range(n):
            rec.stop(rec.start(ActionKind.FORWARD, 0, i % 16))
        costs.append((time.perf_counter_ns() - t0) / n)
        rec.end_window()
        rec.finish_step()
        rec.drain_edges()
    rec.flush()
    rec.close()
    return {"min": round(min(costs)), "median": round(median(costs))}


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpus"] = torch.cuda.device_count()
    return info


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--schedule", default="1F1B")
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--steps", type=int, default=88)
    p.add_argument("--block", type=int, default=4, help="steps per A or B block")
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=2, help="text case: layers (at least --stages)")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--microbatch-size", type=int, default=4)
    p.add_argument(
        "--announce-min-ms",
        type=float,
        default=None,
        help="shortest predicted bubble announced live (default: the rank's, 1 ms; 0: every one)",
    )
    p.add_argument("--case", choices=("text", "synthetic", "both"), default="both")
    p.add_argument("--timeout-s", type=float, default=600)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    cases = ("text", "synthetic") if args.case == "both" else (args.case,)
    started = datetime.now(UTC)
    results = {
        "benchmark": "timing_overhead",
        "command": command_line(),
        "date": started.isoformat(timespec="seconds"),
        "machine": machine(),
        "recorder_ns_per_action": {
            "no_edges": recorder_cost_ns(False, args.device),
            "edges_and_predictor": recorder_cost_ns(True, args.device),
            "edges_quiet_slots": recorder_cost_ns(True, args.device, announce_min_ns=10**9),
        },
        "cases": [],
    }
    with tempfile.TemporaryDirectory(prefix="bench-timing-") as tmp:
        for case in cases:
            r = run_case(case, args, Path(tmp))
            results["cases"].append(r)
            o, u = r["overhead_frac"], r["overhead_us_per_action"]
            print(
                f"{case:10s} timed {r['median_step_ms']['timed']:9.3f} ms  plain "
                f"{r['median_step_ms']['plain']:9.3f} ms  overhead {o['value']:+.2%} "
                f"[{o['lo']:+.2%}, {o['hi']:+.2%}]  {u['value']:+.1f} us/action "
                f"[{u['lo']:+.1f}, {u['hi']:+.1f}]  ({r['block_pairs']} block pairs)"
            )
    rc = results["recorder_ns_per_action"]
    print(
        f"recorder start+stop per action (min/median ns): {rc['no_edges']['min']}/"
        f"{rc['no_edges']['median']}; with edges and predictor "
        f"{rc['edges_and_predictor']['min']}/{rc['edges_and_predictor']['median']}; "
        f"quiet slots {rc['edges_quiet_slots']['min']}/{rc['edges_quiet_slots']['median']}"
    )
    out = args.out or RESULTS / f"timing-overhead-{args.device}-{started.date().isoformat()}.json"
    write_results(results, out)


if __name__ == "__main__":
    main()
