"""benchmarks/host_stalls.py: runs of announced bubbles with room that no task took."""

from __future__ import annotations

import doctest
import json
from pathlib import Path
from typing import Any

from bench_scripts import load_script

host_stalls = load_script("host_stalls")


def _bubble(repeat: int, slot: int, used: bool, predicted: float | None = 5.0) -> dict[str, Any]:
    return {"mode": "governed", "repeat": repeat, "step": 10 + repeat, "slot": slot,
            "length_ms": 5.0, "predicted_ms": predicted,
            "steps": [["image", 0.2, 0.5, 0.46, 1, 1]] if used else []}  # fmt: skip


def _ledger() -> dict[str, Any]:
    """Stage 3: block 0 has five announced bubbles with room unused back to back, then one
    used; block 1 ends with three and block 2 starts with two (not one run across blocks);
    block 3 has four unused, one of them never announced and one predicted too short."""
    bubbles = [
        *(_bubble(0, s, False) for s in range(5)), _bubble(0, 5, True),
        _bubble(1, 0, True), *(_bubble(1, s, False) for s in (1, 2, 3)),
        *(_bubble(2, s, False) for s in (0, 1)), _bubble(2, 2, True),
        _bubble(3, 0, False), _bubble(3, 1, False, None), _bubble(3, 2, False, 0.5),
        _bubble(3, 3, False),
    ]  # fmt: skip
    summary = {
        "step_ms_by_progress": {"image": {"1": {"p50": 0.3}}, "vgg19": {"8": {"p50": 0.1}}},
        "guard_at_entry_ms": {"image": {"p50": 0.5}, "vgg19": None},
    }  # too few steps
    return {"stages": {"m8/3": {"summary": summary, "bubbles": bubbles},
                       "m8/0": {"summary": {}, "bubbles": bubbles}}}  # fmt: skip


def test_a_stall_is_a_run_of_announced_bubbles_with_room_unused_inside_one_block(
    tmp_path: Path,
) -> None:
    path = tmp_path / "h100-x-ledger-m8.json"
    path.write_text(json.dumps(_ledger()))
    out = tmp_path / "stalls.json"
    assert host_stalls.main([str(path), "--out", str(out)]) == 0
    stages = json.loads(out.read_text())["ledgers"][path.name]
    assert list(stages) == ["m8/3"]  # stage 0's ledger has no room to judge by
    stage = stages["m8/3"]
    assert stage["room_ms"] == 0.8 and stage["bubble_ms"] == 85.0
    assert [(s["repeat"], s["slot"], s["bubbles"], s["ms"]) for s in stage["stalls"]] == [
        (0, 0, 5, 25.0)
    ]
    assert stage["stalls"][0]["block_frac"] == 25.0 / 30.0
    assert stage["stalled_frac"] == 25.0 / 85.0
    assert stage["stalls"][0]["held_bubbles"] is None  # a ledger from before holds were events
    with_three = host_stalls.ledger_stalls(_ledger(), min_bubbles=3)["m8/3"]["stalls"]
    assert [(s["repeat"], s["bubbles"]) for s in with_three] == [(0, 5), (1, 3)]
    held = _ledger()
    for i, row in enumerate(held["stages"]["m8/3"]["bubbles"]):
        row["held"] = i < 3  # a checkpoint held the host across the stall's first three
    (stall,) = host_stalls.ledger_stalls(held, min_bubbles=4)["m8/3"]["stalls"]
    assert stall["held_bubbles"] == 3


def test_the_scripts_examples_hold() -> None:
    assert doctest.testmod(host_stalls).failed == 0
