"""benchmarks/bubble_floats.py: how far past each announced bubble's end a step could run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench_scripts import load_script

from freeride_lab.core import events as ev
from freeride_lab.core.plan import Costs, simulate

bubble_floats = load_script("bubble_floats")
MS = 1_000_000
T0 = 10_000 * MS  # the run clock's start of step 0


def _run(tmp_path: Path) -> tuple[dict[str, Any], Path]:
    """Two ranks under 1F1B, M = 2, rank 0 four times slower; three steps of 24 ms. Rank 1 (the
    real stage of a vanilla block over step 1 and a governed one over step 0) idles before its
    first forward (until 4 ms) and between its first backward and second forward (7-8 ms):
    its first forward may end 1 ms late (rank 0's first backward waits for its backward), its
    second forward 5 ms (rank 0's second backward starts at 16 ms)."""
    events = tmp_path / "runs" / "r1" / "events"
    events.mkdir(parents=True)
    costs = Costs(forward_ms=(4.0, 1.0), backward_ms=(8.0, 2.0))
    actions = simulate("1F1B", 2, 2, costs=costs, steps=3)
    lines: dict[int, list[ev.Event]] = {0: [], 1: []}
    for row in actions.itertuples():
        lines[int(row.rank)].append(
            ev.ActionTimed(rank=int(row.rank), stage=int(row.stage), step=int(row.step),
                           action=str(row.action), microbatch=int(row.microbatch),
                           start_ns=T0 + int(row.start_ns), end_ns=T0 + int(row.end_ns))
        )  # fmt: skip
    for (step, rank), g in actions.groupby(["step", "rank"]):
        start, end = T0 + int(step) * 24 * MS, T0 + int(g["end_ns"].max())
        lines[int(rank)].append(
            ev.StepTimed(rank=int(rank), step=int(step), start_ns=start, end_ns=end,
                         optimizer_start_ns=end, optimizer_end_ns=end)
        )  # fmt: skip
    for step in (0, 1):
        base = T0 + step * 24 * MS
        for slot, (a, z) in enumerate(((0, 4), (7, 8))):
            lines[1] += [
                ev.BubbleEdge(rank=1, stage=1, step=step, slot=slot, edge="start",
                              t_ns=base + a * MS, predicted_end_ns=base + z * MS),
                ev.BubbleEdge(rank=1, stage=1, step=step, slot=slot, edge="end",
                              t_ns=base + z * MS),
            ]  # fmt: skip
    for rank, es in lines.items():
        (events / f"rank-{rank}.jsonl").write_text("".join(ev.to_json(e) + "\n" for e in es))
    block = {"run": "m2", "stage": 1, "task": "image", "steps": 1, "repeat": 0}
    result = {
        "config": {"stages": 2},
        "runs": [{"name": "m2", "run_dir": "benchmarks/results/runs/r1", "schedule": "1F1B",
                  "microbatches": 2, "chunks": None,
                  "calibration": [{"rank": 0, "optimizer_ms": 0.0},
                                  {"rank": 1, "optimizer_ms": 0.0}]}],
        "blocks": [{**block, "mode": "governed", "first_step": 0},
                   {**block, "mode": "vanilla", "first_step": 1}],
    }  # fmt: skip
    return result, tmp_path / "runs"


def test_each_bubble_gets_the_float_of_the_action_after_it_in_every_block(
    tmp_path: Path,
) -> None:
    result, root = _run(tmp_path)
    ledger = {"stages": {"m2/1": {"bubbles": [
        {"mode": "governed", "step": 0, "slot": 0, "length_ms": 4.0,
         "steps": [["image", 0.2, 4.5, 0.5, 1.0, 1]]},  # 0.5 ms past: within the 1 ms
        {"mode": "governed", "step": 0, "slot": 1, "length_ms": 1.0,
         "steps": [["image", 0.1, 7.0, 0.5, 1.0, 1]]},  # 6 ms past: beyond the 5 ms
    ]}}}  # fmt: skip
    found = bubble_floats.floats(result, root, ledger)["m2/1"]
    for mode in ("governed", "vanilla"):
        rows = found[mode]["bubbles"]
        assert [(r["slot"], r["length_ms"], r["float_ms"]) for r in rows] == [
            (0, 4.0, 1.0),
            (1, 1.0, 5.0),
        ]
        assert [r["float_least_lags_ms"] for r in rows] == [1.0, 5.0]  # nothing unexplained
    s = found["governed"]["summary"]
    assert s["time_frac_float_at_least_ms"] == {"1": 1.0, "2": 0.2, "5": 0.2}
    assert (s["overruns"], s["overruns_within_float"]) == (2, 1)
    assert found["vanilla"]["summary"]["overruns"] == 0
