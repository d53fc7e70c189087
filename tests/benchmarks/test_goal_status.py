"""BENCHMARKS.md's "Where each goal stands": one row per goal, met only when the whole 95%
interval clears it, best and latest chosen by the stated rule (synthetic results, no GPU)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location(
    "goal_status", ROOT / "benchmarks" / "goal_status.py"
)
assert _SPEC is not None and _SPEC.loader is not None
goal_status = importlib.util.module_from_spec(_SPEC)
sys.modules["goal_status"] = goal_status
_SPEC.loader.exec_module(goal_status)

MEAN = "training overhead, mean per stage"
HARVEST_M4 = "harvest of the measured idle, every stage, M = 4"


def bench(date: str, *, mean: tuple[float, float, float], harvest_lo: tuple[float, float]) -> Any:
    """A two-stage emulated-peer bench result: one managed pipeline row with the given mean
    per-stage overhead (value, lo, hi), and per stage a harvest of the measured idle whose
    lower bounds are ``harvest_lo``."""
    value, lo, hi = mean
    summary = [
        {"run": "m4-timeslice", "case": "mix", "mode": "managed", "stage": stage, "task": "t",
         "harvest_of_measured_idle_frac": bound + 0.02,
         "harvest_of_measured_idle_lo_frac": bound,
         "harvest_of_measured_idle_hi_frac": bound + 0.04}
        for stage, bound in enumerate(harvest_lo)
    ]  # fmt: skip
    pipeline = [
        {"run": "m4-timeslice", "case": "mix", "mode": "managed", "stages_covered": 2,
         "overhead_one_stage_mean_frac": value, "overhead_one_stage_mean_lo_frac": lo,
         "overhead_one_stage_mean_hi_frac": hi}
    ]  # fmt: skip
    data = {
        "benchmark": "bench",
        "command": "freeride-lab bench --emulate-peers",
        "date": date,
        "config": {"stages": 2, "schedule": "1F1B"},
        "summary": summary,
        "pipeline": pipeline,
        "blocks": [],
        "headline": {},
    }
    return goal_status.Source(f"result-{date[:10]}", date, data)


def status(rows: list[Any], name: str) -> Any:
    return next(r for r in rows if r.goal.name == name)


def test_the_table_has_one_row_per_goal_and_says_what_was_never_recorded() -> None:
    lines = goal_status.goal_table([bench("2026-01-01T00:00:00", mean=(0, -1, 1),
                                          harvest_lo=(0.5, 0.5))])  # fmt: skip
    rows = [line for line in lines if line.startswith("| ")][1:]  # without the header
    assert len(rows) == len(goal_status.GOALS)
    power = next(r for r in rows if r.startswith("| board power"))
    assert goal_status.NOT_RECORDED in power
    assert " ".join(lines[len(rows) + 3 :]) == goal_status.SELECTION_RULE


def test_a_goal_is_met_only_when_its_whole_interval_clears_the_threshold() -> None:
    threshold = status(goal_status.goal_rows([]), MEAN).goal.threshold
    under = bench("2026-01-01T00:00:00", mean=(0.0, -0.002, threshold * 0.99), harvest_lo=(0, 0))
    across = bench("2026-01-02T00:00:00", mean=(0.0, -0.002, threshold * 1.01), harvest_lo=(0, 0))
    assert status(goal_status.goal_rows([under]), MEAN).met
    # the point estimate is under the goal, the interval is not: not met
    assert not status(goal_status.goal_rows([across]), MEAN).met
    # no interval: nothing is met
    bare = bench("2026-01-03T00:00:00", mean=(0.0, float("nan"), float("nan")), harvest_lo=(0, 0))
    assert not status(goal_status.goal_rows([bare]), MEAN).met


def test_a_goal_about_every_stage_is_judged_on_its_deciding_stage() -> None:
    threshold = status(goal_status.goal_rows([]), HARVEST_M4).goal.threshold
    one_short = bench("2026-01-01T00:00:00", mean=(0, -1, 1),
                      harvest_lo=(threshold + 0.01, threshold - 0.01))  # fmt: skip
    both_over = bench("2026-01-02T00:00:00", mean=(0, -1, 1),
                      harvest_lo=(threshold + 0.01, threshold + 0.02))  # fmt: skip
    row = status(goal_status.goal_rows([one_short]), HARVEST_M4)
    assert not row.met
    assert row.best.lo == threshold - 0.01
    assert status(goal_status.goal_rows([both_over]), HARVEST_M4).met
    # a stage without an interval decides: nothing is known to clear the goal there
    no_interval = bench("2026-01-03T00:00:00", mean=(0, -1, 1),
                        harvest_lo=(threshold + 0.01, float("nan")))  # fmt: skip
    row = status(goal_status.goal_rows([no_interval]), HARVEST_M4)
    assert not row.met and row.best.what.endswith("deciding stage 1 · t")


def test_best_is_closest_to_the_goal_latest_is_the_newest_and_old_runs_are_marked() -> None:
    old_good = bench("2026-01-01T00:00:00", mean=(0.0, -0.002, 0.002), harvest_lo=(0, 0))
    new_bad = bench("2026-01-05T00:00:00", mean=(0.01, 0.0, 0.02), harvest_lo=(0, 0))
    row = status(goal_status.goal_rows([new_bad, old_good]), MEAN)
    assert row.best.source is old_good and row.latest.source is new_bad
    table = "\n".join(goal_status.goal_table([new_bad, old_good], peer_fix_date="2026-01-03"))
    line = next(x for x in table.splitlines() if x.startswith(f"| {MEAN}"))
    best, latest, met = line.split(" | ")[1:4]
    assert goal_status.PEER_FIX_NOTE in best and goal_status.PEER_FIX_NOTE not in latest
    assert met == "**yes** (latest: no)"


def test_board_power_is_judged_on_the_highest_gated_block_against_the_recorded_cap() -> None:
    """Every block must stay under the cap: the figure is the highest gated block (a vanilla
    block does not count), and a result without a recorded cap says nothing."""

    def with_blocks(date: str, watts: list[tuple[str, float]], cap: float | None) -> Any:
        s = bench(date, mean=(0, -1, 1), harvest_lo=(0, 0))
        s.data["blocks"] = [
            {"run": "m4-timeslice", "mode": mode, "stage": i, "power_w": w}
            for i, (mode, w) in enumerate(watts)
        ]
        s.data["machine"] = {} if cap is None else {"power_limit_w": cap}
        return s

    power = "board power"
    under = with_blocks("2026-01-01T00:00:00", [("vanilla", 710.0), ("managed", 560.0),
                                                ("governed", 630.0)], 700.0)  # fmt: skip
    row = status(goal_status.goal_rows([under]), power)
    assert row.met and row.best.value == 630.0 / 700.0 - 1.0
    assert "highest of 2 gated blocks (governed, stage 2): 630 W of 700 W" in row.best.what
    over = with_blocks("2026-01-02T00:00:00", [("managed", 560.0), ("governed", 705.0)], 700.0)
    assert not status(goal_status.goal_rows([over]), power).met
    no_cap = with_blocks("2026-01-03T00:00:00", [("managed", 560.0)], None)
    assert status(goal_status.goal_rows([no_cap]), power).best is None


def test_a_zero_bubble_result_counts_for_the_residual_goal_not_the_harvest_goals() -> None:
    # the residual idle of a zero-bubble schedule is another quantity than a 1F1B bubble
    threshold = status(goal_status.goal_rows([]), HARVEST_M4).goal.threshold
    zb = bench("2026-01-02T00:00:00", mean=(0, -1, 1), harvest_lo=(threshold + 0.01,) * 2)
    zb.data["config"]["schedule"] = "InterleavedZeroBubble"
    rows = goal_status.goal_rows([zb])
    assert status(rows, HARVEST_M4).best is None
    assert status(rows, "zero-bubble residual idle harvested").best.source is zb
