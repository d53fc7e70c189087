"""benchmarks/action_times.py: training's own actions in gated blocks against vanilla ones."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from bench_scripts import load_script

from freeride_lab.core import events as ev

action_times = load_script("action_times")
MS = 1_000_000


def _run(tmp_path: Path, slower_ms: float) -> tuple[dict[str, Any], Path]:
    """Rank 1 (the real stage) and rank 0, eight steps of two forwards (4 ms) and a backward
    (I, 10 ms) each; blocks of two steps alternate vanilla and governed, and in the governed
    ones rank 1's I is ``slower_ms`` longer, 0.4 ms more in the second (so the blocks
    differ). Rank 0's actions are slower still there: they are not the real stage's."""
    events = tmp_path / "runs" / "r1" / "events"
    events.mkdir(parents=True)
    lines: dict[int, list[ev.Event]] = {0: [], 1: []}
    for step in range(8):
        governed = (step // 2) % 2 == 1
        t = step * 100 * MS
        for rank in (0, 1):
            extra = (slower_ms + 0.4 * (step >= 4)) * MS if governed else 0
            if rank == 0 and governed:
                extra += 50 * MS
            spans = [("F", 0, 4 * MS), ("F", 1, 4 * MS), ("I", 0, int(10 * MS + extra))]
            at = t
            for kind, mb, length in spans:
                lines[rank].append(ev.ActionTimed(
                    rank=rank, stage=rank, step=step, action=kind, microbatch=mb,
                    start_ns=at, end_ns=at + length,
                ))  # fmt: skip
                at += length + MS
    for rank, es in lines.items():
        (events / f"rank-{rank}.jsonl").write_text("".join(ev.to_json(e) + "\n" for e in es))
    block = {"run": "m2", "case": "mix", "stage": 1, "steps": 2}
    result = {
        "runs": [{"name": "m2", "run_dir": "benchmarks/results/runs/r1"}],
        "blocks": [{**block, "mode": "governed" if i % 2 else "vanilla", "first_step": 2 * i}
                   for i in range(4)],
    }  # fmt: skip
    return result, tmp_path / "runs"


def test_a_gated_blocks_longer_actions_are_found_by_kind_and_action(tmp_path: Path) -> None:
    result, root = _run(tmp_path, slower_ms=1.0)
    stage = action_times.action_times(result, root)["m2/mix/1"]
    assert stage["blocks"] == {"vanilla": 2, "governed": 2}
    governed = stage["modes"]["governed"]
    diff = governed["vs_vanilla_ms"]
    assert diff["I"]["value"] == pytest.approx(1.2)  # the mean of 1.0 and 1.4
    assert diff["F"]["value"] == pytest.approx(0.0)
    assert diff["all"]["value"] == pytest.approx(1.2)
    assert governed["vs_vanilla_frac"]["value"] == pytest.approx(1.2 / 18, rel=1e-3)
    assert diff["I"]["lo"] < 1.2 < diff["I"]["hi"]
    top = governed["actions"][0]
    assert (top["stage"], top["action"], top["microbatch"]) == (1, "I", 0)
    assert top["moved_ms"] == pytest.approx(1.2)  # the median over the governed steps
    assert "vs_vanilla_ms" not in stage["modes"]["vanilla"]


def test_without_a_difference_the_interval_holds_zero_and_the_script_writes_it(
    tmp_path: Path,
) -> None:
    result, root = _run(tmp_path, slower_ms=0.0)
    found = action_times.action_times(result, root)["m2/mix/1"]["modes"]["governed"]
    assert found["vs_vanilla_ms"]["all"]["lo"] <= 0 <= found["vs_vanilla_ms"]["all"]["hi"]
    path = tmp_path / "r.json"
    path.write_text(json.dumps(result))
    out = tmp_path / "actions.json"
    assert action_times.main([str(path), "--run-root", str(root), "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["benchmark"] == "action_times" and "m2/mix/1" in written["stages"]
