"""Training's own actions with side tasks in the bubbles against without, from a bench run.

A side-task step that runs past its bubble's end delays the action after it, and the bubble
ledger counts that (``bubble_ledger.py``). An action can also take longer than it does without
side tasks when no step ran into it: this reads a bench result and its run directories and
compares, per run, case and real stage, the real rank's actions of each kind (F, B, I, W) in
the stage's gated blocks against its vanilla blocks. Under ``--emulate-peers`` a block's real
rank is its stage and the other ranks sleep their replayed costs, so only that rank's actions
are read, and only within its own stage's blocks:

- per block, the median over its steps of a step's summed time in that kind, start to end as
  the rank timed it ("all": every kind together);
- per mode, the mean over the blocks with its 95% t-interval
  (``core.intervals.mean_interval``);
- each gated mode − vanilla, in ms a step (``lever_status.difference``: variances add, df by
  Welch-Satterthwaite) and as a share of the vanilla blocks' summed action time.

Per action (stage, kind, micro-batch) the same figures, median over the mode's steps, say
which actions the difference sits in (``actions``, largest first).

    python benchmarks/action_times.py r.json --run-root /tmp/runs --out actions.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from bench_output import add_run_arguments, bench_runs, command_line, write_results
from lever_status import difference

from freeride_lab.bench.stats import GATED_MODES
from freeride_lab.core.intervals import mean_interval
from freeride_lab.lab.frames import actions_frame

ALL = "all"
TOP_ACTIONS = 8  # per gated mode, the actions whose median moved most


def block_times(actions: pd.DataFrame, rank: int, first: int, steps: int) -> dict[str, float]:
    """Per action kind of ``rank`` (and ``ALL``), the median over steps ``first`` ..
    ``first + steps - 1`` of a step's summed time in that kind, in ms.

    >>> a = pd.DataFrame([(0, 1, "F", 0, 4_000_000), (0, 1, "I", 0, 2_000_000),
    ...                   (1, 1, "F", 0, 6_000_000), (1, 1, "I", 0, 3_000_000),
    ...                   (1, 0, "F", 0, 9_000_000)],
    ...                  columns=["step", "rank", "action", "start_ns", "end_ns"])
    >>> block_times(a, 1, 0, 2)
    {'F': 5.0, 'I': 2.5, 'all': 7.5}
    """
    mine = actions[
        (actions["rank"] == rank) & (actions["step"] >= first) & (actions["step"] < first + steps)
    ]
    per_step = mine.assign(ms=(mine["end_ns"] - mine["start_ns"]) / 1e6).pivot_table(
        index="step", columns="action", values="ms", aggfunc="sum", fill_value=0.0
    )
    out = {str(k): round(float(per_step[k].median()), 4) for k in sorted(per_step.columns)}
    if not per_step.empty:
        out[ALL] = round(float(per_step.sum(axis=1).median()), 4)
    return out


def action_medians(
    actions: pd.DataFrame, rank: int, blocks: Sequence[Mapping[str, Any]]
) -> dict[tuple[int, str, int], float]:
    """Per action (stage, kind, micro-batch) of ``rank``, its median time (ms) over the steps
    of ``blocks``."""
    steps = {
        s
        for b in blocks
        for s in range(int(b["first_step"]), int(b["first_step"]) + int(b["steps"]))
    }
    mine = actions[(actions["rank"] == rank) & actions["step"].isin(steps)]
    ms = (mine["end_ns"] - mine["start_ns"]) / 1e6
    grouped = ms.groupby([mine["stage"], mine["action"], mine["microbatch"]]).median()
    return {(int(s), str(a), int(m)): float(v) for (s, a, m), v in grouped.items()}


def stage_times(
    actions: pd.DataFrame, blocks: Sequence[Mapping[str, Any]], rank: int
) -> dict[str, Any]:
    """The figures of one real stage (``rank``) over its ``blocks`` (every mode)."""
    by_mode: dict[str, list[dict[str, float]]] = {}
    for b in blocks:
        times = block_times(actions, rank, int(b["first_step"]), int(b["steps"]))
        by_mode.setdefault(str(b["mode"]), []).append(times)
    out: dict[str, Any] = {"blocks": {m: len(ts) for m, ts in by_mode.items()}, "modes": {}}
    kinds = sorted({k for ts in by_mode.values() for t in ts for k in t})
    means = {
        m: {k: mean_interval([t[k] for t in ts if k in t]) for k in kinds}
        for m, ts in by_mode.items()
    }
    vanilla = means.get("vanilla")
    medians = {
        m: action_medians(actions, rank, [b for b in blocks if b["mode"] == m]) for m in by_mode
    }
    for mode, figures in means.items():
        entry: dict[str, Any] = {"step_ms": {k: figures[k].record(4) for k in kinds}}
        if vanilla is not None and mode in GATED_MODES:
            diff = {k: difference(figures[k], vanilla[k]) for k in kinds}
            entry["vs_vanilla_ms"] = {k: d.record(4) for k, d in diff.items()}
            entry["vs_vanilla_frac"] = diff[ALL].scaled(1 / vanilla[ALL].value).record(5)
            base = medians["vanilla"]
            moved = [(round(v - base[a], 3), a, round(base[a], 3), round(v, 3))
                     for a, v in medians[mode].items() if a in base]  # fmt: skip
            moved.sort(key=lambda x: (-x[0], x[1]))
            entry["actions"] = [
                {"stage": a[0], "action": a[1], "microbatch": a[2], "vanilla_ms": v,
                 "gated_ms": g, "moved_ms": d}
                for d, a, v, g in moved[:TOP_ACTIONS]
            ]  # fmt: skip
        out["modes"][mode] = entry
    return out


def action_times(result: Mapping[str, Any], run_root: Path) -> dict[str, dict[str, Any]]:
    """Per "run/case/stage" of ``result``, its real stage's figures (see the module's text)."""
    found: dict[str, dict[str, Any]] = {}
    for run, blocks, events in bench_runs(result, run_root):
        actions = actions_frame(events)
        for case, stage in sorted({(str(b["case"]), int(b["stage"])) for b in blocks}):
            mine = [b for b in blocks if b["case"] == case and int(b["stage"]) == stage]
            found[f"{run['name']}/{case}/{stage}"] = stage_times(actions, mine, stage)
    return found


def _line(key: str, mode: str, entry: Mapping[str, Any]) -> str:
    d, frac = entry["vs_vanilla_ms"][ALL], entry["vs_vanilla_frac"]
    top = entry["actions"][0] if entry["actions"] else None
    most = (f"; most: stage {top['stage']} {top['action']}{top['microbatch']} "
            f"{top['moved_ms']:+.2f} ms") if top else ""  # fmt: skip
    return (f"{key} {mode}: actions {d['value']:+.2f} ms a step [{d['lo']:+.2f}, {d['hi']:+.2f}]"
            f" ({100 * frac['value']:+.2f}%){most}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(ap)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    result = json.loads(args.result.read_text())
    found = action_times(result, args.run_root)
    for key, stage in found.items():
        for mode, entry in stage["modes"].items():
            if "vs_vanilla_ms" in entry:
                print(_line(key, mode, entry))
    if args.out is not None:
        write_results({
            "benchmark": "action_times", "command": command_line(), "result": args.result.name,
            "stages": found,
        }, args.out)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
