"""Stalls in bubble ledgers: runs of announced bubbles with room that no task took, back to back.

The idle split (``core.idle_use``) leaves a remainder among a stage's unused bubbles: announced,
predicted long enough for the stage's shortest step and its guard, and still no step. A bubble
or two of it is a late edge or a command; many in a row are a host that was doing something
else (a checkpoint's hold: ``side_task_checkpoint`` events and the idle split's
``idle_unused_held`` measure it in runs recorded since; older runs do not have them). This
reads bubble ledgers (``bubble_ledger.py``) and finds, in each gated block of each stage, the
runs of at least ``--min-bubbles`` consecutive bubbles that were announced with a predicted
length of at least the stage's *room*, the shortest of its tasks' smallest steps plus that
task's guard at entry (medians, from the ledger's summary), and in which no task stepped. Per
stage: its gated bubble time, and each stall's block, first bubble, bubbles and time, as a
share of the stage's bubble time and of its block's, and how many of its bubbles a checkpoint
held the host across (ledgers written since record ``held``). Arithmetic over committed files;
no task runs.

    python benchmarks/host_stalls.py benchmarks/results/h100-*-ledger-*.json --out stalls.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from itertools import groupby
from pathlib import Path
from typing import Any

from bench_output import command_line, write_results

MIN_BUBBLES = 4


def room_ms(summary: Mapping[str, Any]) -> float | None:
    """The shortest predicted length any of a stage's tasks would step in: its smallest
    step's median time plus its median guard at entry, the least over the tasks (None where
    the ledger lacks either; a task with too few steps for a guard's quantiles is left out).

        >>> room_ms({"step_ms_by_progress": {"image": {"1": {"p50": 0.3}, "2": {"p50": 0.5}},
        ...                                  "vgg19": {"8": {"p50": 10.7}}},
        ...          "guard_at_entry_ms": {"image": {"p50": 0.46}, "vgg19": {"p50": 12.9}}})
        0.76
    """
    sizes, guards = summary.get("step_ms_by_progress"), summary.get("guard_at_entry_ms")
    if not sizes or not guards:
        return None
    rooms = [
        min(float(v["p50"]) for v in by_size.values()) + float(guards[task]["p50"])
        for task, by_size in sizes.items()
        if by_size and guards.get(task)
    ]
    return round(min(rooms), 3) if rooms else None


def stalls(
    bubbles: Sequence[Mapping[str, Any]], room: float, min_bubbles: int = MIN_BUBBLES
) -> list[dict[str, Any]]:
    """The runs of at least ``min_bubbles`` consecutive bubbles of one block (ledger rows, in
    order) announced with room (``predicted_ms >= room``) and no step; each with its block's
    mode and repeat, first step and slot, bubbles, ms, the share of its block's time, and how
    many of its bubbles a checkpoint's hold overlapped (None for ledgers without ``held``).

        >>> row = lambda slot, used, predicted=5.0: {"mode": "governed", "repeat": 0, "step": 1,
        ...     "slot": slot, "length_ms": 5.0, "predicted_ms": predicted,
        ...     "steps": [["image", 0.1, 0.4]] if used else []}
        >>> found = stalls([row(0, True), *(row(s, False) for s in (2, 4, 6, 8)),
        ...                 row(10, False, 0.5), row(12, False)], room=1.0)
        >>> [(s["slot"], s["bubbles"], s["ms"], round(s["block_frac"], 3)) for s in found]
        [(2, 4, 20.0, 0.571)]
    """
    out: list[dict[str, Any]] = []
    for (mode, repeat), rows in groupby(bubbles, key=lambda b: (b["mode"], b["repeat"])):
        block = list(rows)
        block_ms = sum(float(b["length_ms"]) for b in block)
        run: list[Mapping[str, Any]] = []
        for b in [*block, None]:
            predicted = None if b is None else b.get("predicted_ms")
            if b is not None and not b["steps"] and predicted is not None and predicted >= room:
                run.append(b)
                continue
            if len(run) >= min_bubbles:
                ms = sum(float(x["length_ms"]) for x in run)
                held = [x["held"] for x in run if "held" in x]  # ledgers since holds are events
                out.append({"mode": mode, "repeat": repeat, "step": run[0]["step"],
                            "slot": run[0]["slot"], "bubbles": len(run), "ms": round(ms, 3),
                            "block_frac": ms / block_ms,
                            "held_bubbles": sum(held) if held else None})  # fmt: skip
            run = []
    return out


def ledger_stalls(ledger: Mapping[str, Any], min_bubbles: int) -> dict[str, Any]:
    """Every stage of one ledger: its room, gated bubble time, stalls and their share."""
    stages: dict[str, Any] = {}
    for key, stage in ledger["stages"].items():
        bubbles = stage.get("bubbles") or []
        room = room_ms(stage.get("summary", {}))
        if not bubbles or room is None or "repeat" not in bubbles[0]:
            continue
        total = sum(float(b["length_ms"]) for b in bubbles)
        found = stalls(bubbles, room, min_bubbles)
        stages[key] = {
            "room_ms": room,
            "bubble_ms": round(total, 3),
            "stalls": found,
            "stalled_frac": sum(s["ms"] for s in found) / total if total else 0.0,
        }
    return stages


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ledgers", nargs="+", type=Path, help="bubble_ledger.py outputs")
    parser.add_argument("--min-bubbles", type=int, default=MIN_BUBBLES,
                        help="the fewest consecutive bubbles a stall has")  # fmt: skip
    parser.add_argument("--out", type=Path, required=True, help="write the results as JSON here")
    args = parser.parse_args(argv)
    if args.min_bubbles < 2:
        parser.error("--min-bubbles must be >= 2")
    found = {}
    for path in args.ledgers:
        ledger = json.loads(path.read_text())
        found[path.name] = ledger_stalls(ledger, args.min_bubbles)
    write_results({"command": command_line(), "min_bubbles": args.min_bubbles, "ledgers": found},
                  args.out, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
