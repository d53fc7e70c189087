"""Bubble by bubble: which side task stepped in each bubble a bench run's real stages announced.

The idle split (``core.idle_use``) says how much of a stage's bubble time went where. With two
tasks on a stage (gating "leftovers", ``freeride-lab bench --leftovers``) it cannot say which
task left a bubble, nor what held it back. This reads a bench result and its run directories
and lists, for every bubble a real stage announced inside a gated block: its slot, length and
predicted length, each side-task step in it (task, start and end after the bubble's start,
the guard it cleared at entry, ms, its progress in the task's unit and the calls it covers),
and whether a checkpoint of one of the stage's tasks held its host during it (``held``; runs
recorded before the hold was an event have none); then sums up per
stage: bubbles and their time by who stepped (each task alone, both, neither), the lengths and
predictions of the bubbles no task used, the time after the last step, the gap from the
stage's task's last step to the leftovers task's first step in bubbles both used, each task's
guard at entry, and each task's step time by its progress (a step's size: a step of a task's
smallest steps taken k at a time makes k times their progress), to set its speed in bubbles,
size by size, beside its speed alone.

Run it where the bench ran, before the run directories go (they are not kept with results):

    freeride-lab bench ... --run-root /tmp/runs --leftovers image --out r.json
    python benchmarks/bubble_ledger.py r.json --run-root /tmp/runs --out ledger.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench_output import add_run_arguments, bench_runs, command_line, write_results

from freeride_lab.bench.readout import step_calls
from freeride_lab.bench.stats import GATED_MODES
from freeride_lab.core.announced import announced_spans

LONGEST_MS = 1000.0  # longer bubbles are the bench's pauses (solo phases), not training's
NONE = "none"


def stage_ledger(
    events: Sequence[Mapping[str, Any]], blocks: Sequence[Mapping[str, Any]], stage: int
) -> list[dict[str, Any]]:
    """One row per bubble ``stage`` announced in the gated ``blocks`` (of one run), in order."""
    starts = {int(e["step"]): int(e["start_ns"]) for e in events
              if e.get("kind") == "step" and e.get("rank") == stage}  # fmt: skip
    told = announced_spans(events, stage).spans
    steps = sorted((e for e in events
                    if e.get("kind") == "side_task_step" and e.get("stage") == stage),
                   key=lambda e: int(e["start_ns"]))  # fmt: skip
    holds = [(int(e["start_ns"]), int(e["end_ns"])) for e in events
             if e.get("kind") == "side_task_checkpoint" and e.get("stage") == stage]  # fmt: skip
    rows = []
    for b in blocks:
        if int(b["stage"]) != stage or b["mode"] not in GATED_MODES:
            continue
        first = int(b["first_step"])
        lo, hi = starts.get(first), starts.get(first + int(b["steps"]))
        if lo is None or hi is None:
            continue
        for step, slot, a, z, p in told:
            if not lo <= a < hi or (z - a) / 1e6 > LONGEST_MS:
                continue
            rows.append({
                "mode": b["mode"], "repeat": int(b["repeat"]), "step": step, "slot": slot,
                "length_ms": round((z - a) / 1e6, 3),
                "predicted_ms": None if p is None else round((p - a) / 1e6, 3),
                "steps": [_step(s, a) for s in steps
                          if int(s["end_ns"]) > a and int(s["start_ns"]) < z],
                "held": any(h_end > a and h_start < z for h_start, h_end in holds),
            })  # fmt: skip
    return rows


def _step(e: Mapping[str, Any], start_ns: int) -> list[Any]:
    """A ``side_task_step`` event in a bubble that started at ``start_ns``: its task's name,
    start and end after the bubble's start and the guard it cleared at entry (ms), its
    progress, and the ``step()`` calls it covers (a group's; 1 where the event does not say)."""
    return [
        str(e["task_id"]).rsplit("-", 1)[0],
        round((int(e["start_ns"]) - start_ns) / 1e6, 3),
        round((int(e["end_ns"]) - start_ns) / 1e6, 3),
        round(int(e.get("guard_ns") or 0) / 1e6, 3),
        float(e.get("progress") or 0.0),
        step_calls(e),
    ]


def summary(rows: Sequence[Mapping[str, Any]], main: str, leftovers: str) -> dict[str, Any]:
    """Bubbles and their time by who stepped, the unused bubbles, the tail, the hand-on gap
    (``main``'s last step's end → ``leftovers``' first step, in bubbles both used) and each
    task's guard at entry (ms, quantiles where there are enough)."""
    total = sum(r["length_ms"] for r in rows) or 1.0
    by: dict[str, list[float]] = {}
    tails, gaps, unused = [], [], []
    guards: dict[str, list[float]] = {}
    sized: dict[str, dict[float, list[float]]] = {}  # task → progress → step ms
    for r in rows:
        who = sorted({s[0] for s in r["steps"]})
        by.setdefault(" + ".join(who) or NONE, []).append(r["length_ms"])
        if not who:
            unused.append(r)
            continue
        tails.append(max(0.0, r["length_ms"] - max(s[2] for s in r["steps"])))
        for s in r["steps"]:
            guards.setdefault(s[0], []).append(s[3])
            sized.setdefault(s[0], {}).setdefault(s[4], []).append(s[2] - s[1])
        ends = [s[2] for s in r["steps"] if s[0] == main]
        firsts = [s[1] for s in r["steps"] if s[0] == leftovers]
        if ends and firsts and min(firsts) >= max(ends):
            gaps.append(min(firsts) - max(ends))
    return {
        "bubbles": len(rows),
        "by_who": {
            k: {"bubbles": len(v), "time_frac": round(sum(v) / total, 4)}
            for k, v in sorted(by.items())
        },
        "unused_length_ms": _quantiles([r["length_ms"] for r in unused]),
        "unused_predicted_ms": _quantiles(
            [r["predicted_ms"] for r in unused if r["predicted_ms"] is not None]
        ),
        "tail_frac": round(sum(tails) / total, 4),
        "handon_gap_ms": _quantiles(gaps),
        "guard_at_entry_ms": {k: _quantiles(v) for k, v in sorted(guards.items())},
        "step_ms_by_progress": {task: _by_size(by) for task, by in sorted(sized.items())},
    }


def _by_size(ms_by_progress: Mapping[float, Sequence[float]]) -> dict[str, dict[str, float]]:
    """A task's step-time quantiles and step count per progress of a step, for those with
    three steps or more."""
    return {
        f"{progress:g}": {**(_quantiles(ms) or {}), "steps": len(ms)}
        for progress, ms in sorted(ms_by_progress.items())
        if len(ms) >= 3
    }


def _quantiles(xs: Sequence[float]) -> dict[str, float] | None:
    """p10, p50, p90 of ``xs`` (ms); None for fewer than three."""
    if len(xs) < 3:
        return None
    q = statistics.quantiles(xs, n=10)
    return {"p10": round(q[0], 3), "p50": round(statistics.median(xs), 3), "p90": round(q[-1], 3)}


def ledger(result: Mapping[str, Any], run_root: Path) -> dict[str, Any]:
    """Per run and real stage of ``result``: its bubbles (``stage_ledger``) and ``summary``."""
    out: dict[str, Any] = {}
    for run, blocks, events in bench_runs(result, run_root):
        for stage in sorted({int(b["stage"]) for b in blocks}):
            rows = stage_ledger(events, blocks, stage)
            mine = next(b for b in blocks if int(b["stage"]) == stage)
            out[f"{run['name']}/{stage}"] = {
                "summary": summary(rows, str(mine["task"]), str(mine.get("leftovers_task") or "")),
                "bubbles": rows,
            }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(parser)
    parser.add_argument("--out", type=Path, required=True, help="write the ledger as JSON here")
    args = parser.parse_args(argv)  # fmt: skip
    result = json.loads(args.result.read_text())
    found = ledger(result, args.run_root)
    for key, one in found.items():
        print(key, json.dumps(one["summary"], indent=1))
    write_results({"command": command_line(), "result": args.result.name, "stages": found},
                  args.out, indent=0)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
