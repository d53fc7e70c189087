"""BENCHMARKS.md's "What each lever bought": each lever against itself switched off, its arms
read from the results' own per-stage tables, "helps" only when the interval of on − off clears 0
(synthetic results, no GPU; one check on a committed A/B)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from bench_scripts import load_script

from freeride_lab.bench.markdown import fmt_interval
from freeride_lab.core.intervals import Interval, quotient_interval, t_quantile

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str) -> ModuleType:
    """A script module of benchmarks/ (they import one another by bare name, so benchmarks/
    is on the path while it loads: run alone, this file has no other test that put it there)."""
    if name in sys.modules:
        return sys.modules[name]
    return load_script(name)


_load("goal_status")
lever_status = _load("lever_status")
Effect, Lever, Arm = lever_status.Effect, lever_status.Lever, lever_status.Arm

NAN = math.nan


def iv(value: float, lo: float, hi: float) -> Interval:
    return Interval(value, lo, hi, NAN, NAN, 5)


def stage_row(mode: str, stage: int, *, harvest: float, overhead: float, se: float = 0.01,
              task: str = "t") -> dict[str, Any]:  # fmt: skip
    """A per-stage row as ``bench.tables`` writes it: harvest and overhead with their standard
    errors over five blocks, and harvest ÷ the vanilla blocks' idle (0.5) with its bounds."""
    h = Interval.of(harvest, se, 4, 5)
    idle = Interval.of(0.5, 0.005, 5, 6)
    q = quotient_interval(h, idle)
    o = Interval.of(overhead, se, 4, 5)
    return {
        "run": "m4-timeslice", "case": "mix", "stage": stage, "task": task, "mode": mode,
        "blocks": 5,
        "overhead_frac": o.value, "overhead_lo_frac": o.lo, "overhead_hi_frac": o.hi,
        "overhead_se_frac": o.se, "overhead_df": o.df,
        "harvest_frac": h.value, "harvest_lo_frac": h.lo, "harvest_hi_frac": h.hi,
        "harvest_se_frac": h.se, "harvest_df": h.df,
        "vanilla_idle_frac": idle.value, "vanilla_idle_se_frac": idle.se,
        "vanilla_idle_df": idle.df,
        "harvest_of_measured_idle_frac": q.value, "harvest_of_measured_idle_lo_frac": q.lo,
        "harvest_of_measured_idle_hi_frac": q.hi,
    }  # fmt: skip


def bench(date: str, summary: list[dict[str, Any]]) -> Any:
    data = {"benchmark": "bench", "command": "freeride-lab bench --emulate-peers", "date": date,
            "config": {"stages": 2}, "summary": summary}  # fmt: skip
    return lever_status.Source(f"result-{date[:10]}", date, data)


LEVERS = (
    Lever("governed", "governed mode", "a tighter budget", ""),
    Lever("idle", "an idea", "nothing yet", "`freeride-lab bench --idea on,off`"),
    Lever("gone", "a tried idea", "took a rank down", "no A/B: taken out", backed_out=True),
)


def table_rows(lines: list[str]) -> list[list[str]]:
    return [line[2:-2].split(" | ") for line in lines[2:]]


# -- the arithmetic and the rule --------------------------------------------------------------


def test_the_difference_of_two_arms_adds_their_variances_with_welch_degrees_of_freedom() -> None:
    on, off = Interval.of(0.60, 0.03, 4, 5), Interval.of(0.52, 0.04, 4, 5)
    d = lever_status.difference(on, off)
    assert d.value == pytest.approx(0.08)
    assert d.se == pytest.approx(0.05)
    assert d.df == pytest.approx(0.05**4 / (0.03**4 / 4 + 0.04**4 / 4))
    assert d.hi - d.value == pytest.approx(t_quantile(0.975, d.df) * 0.05)
    # an arm without an interval leaves the difference without one
    assert not lever_status.difference(on, Interval.point(0.5)).has_bounds


@pytest.mark.parametrize(
    ("harvest", "overhead", "expected"),
    [
        # the harvest gain's whole interval is above 0, the overhead's straddles 0
        (iv(0.10, 0.01, 0.19), iv(0.001, -0.01, 0.012), "**helps**: more harvest"),
        # a large point gain whose interval reaches 0 is no clear effect
        (iv(0.20, -0.001, 0.40), iv(0.0, -0.01, 0.01), "no clear effect"),
        (iv(0.0, -0.1, 0.1), iv(-0.02, -0.03, -0.01), "**helps**: less overhead"),
        (iv(0.10, 0.01, 0.19), iv(0.01, 0.001, 0.02), "trade-off: more harvest, more overhead"),
        (iv(-0.10, -0.19, -0.01), iv(0.0, -0.01, 0.01), "hurts: less harvest"),
    ],
)
def test_a_lever_helps_only_where_the_interval_of_on_minus_off_clears_zero(
    harvest: Interval, overhead: Interval, expected: str
) -> None:
    arm = iv(0.5, 0.4, 0.6)
    assert lever_status.verdict(Effect(arm, arm, harvest), Effect(arm, arm, overhead)) == expected


def test_arms_side_by_side_count_only_when_their_intervals_are_disjoint() -> None:
    apart = Effect(iv(0.05, 0.04, 0.06), iv(0.08, 0.07, 0.09), None)
    touching = Effect(iv(0.05, 0.04, 0.075), iv(0.08, 0.07, 0.09), None)
    assert lever_status.verdict(None, apart) == "**helps**: less overhead"
    assert lever_status.verdict(None, touching) == "no clear effect"
    assert lever_status.verdict(Effect(iv(0.5, 0.4, 0.6), None, None), None) == (
        lever_status.NO_OFF_ARM
    )
    assert lever_status.verdict(None, None) == lever_status.NOT_MEASURED


# -- rows from a synthetic result -------------------------------------------------------------


def test_rows_pair_the_arms_stage_by_stage_and_quote_the_results_own_figures() -> None:
    summary = [
        stage_row("governed", 0, harvest=0.40, overhead=0.002),
        stage_row("managed", 0, harvest=0.30, overhead=0.001),
        stage_row("governed", 1, harvest=0.35, overhead=0.004, task="u"),
        stage_row("managed", 1, harvest=0.34, overhead=0.003, task="u"),
        stage_row("governed", 2, harvest=0.2, overhead=0.0, task="v"),  # no managed arm
    ]
    source = bench("2026-01-01T00:00:00", summary)
    compared = lever_status.bench_comparisons(
        Arm(source, "governed", "governed"), Arm(source, "managed", "managed"), "table `x`"
    )
    assert [c.where for c in compared] == ["0 · t (M = 4, time-sliced)",
                                           "1 · u (M = 4, time-sliced)"]  # fmt: skip
    rows = table_rows(lever_status.lever_table({"governed": compared}, LEVERS))
    first, second, idle, gone = rows
    # the lever, what it changes and the A/B are written once, on the lever's first row
    assert first[:3] == ["governed mode", "a tighter budget",
                         "`result-2026-01-01`: governed vs managed; table `x`"]  # fmt: skip
    assert second[:3] == ["", "", ""]
    # each arm is the result's own figure, as its per-stage table writes it
    on, off = summary[0], summary[1]
    name = "harvest_of_measured_idle"
    quoted = [fmt_interval(r[f"{name}_frac"], r[f"{name}_lo_frac"], r[f"{name}_hi_frac"], 0)
              for r in (on, off)]  # fmt: skip
    assert first[4].startswith(f"{quoted[0]} vs {quoted[1]}; on − off +20 [")
    assert first[6] == "**helps**: more harvest"
    assert second[6] == "no clear effect"
    # a lever with no A/B says so and what would measure it
    assert idle[2] == "`freeride-lab bench --idea on,off`"
    assert idle[6] == lever_status.NOT_MEASURED and gone[6] == lever_status.BACKED_OUT


def test_an_ab_from_before_the_peer_fix_is_marked() -> None:
    summary = [stage_row("governed", 0, harvest=0.4, overhead=0.0),
               stage_row("managed", 0, harvest=0.3, overhead=0.0)]  # fmt: skip
    source = bench("2026-01-01T00:00:00", summary)
    compared = lever_status.bench_comparisons(
        Arm(source, "governed", "governed"), Arm(source, "managed", "managed"), "table `x`"
    )
    before = table_rows(lever_status.lever_table({"governed": compared}, LEVERS,
                                                 peer_fix_date="2026-01-02"))  # fmt: skip
    after = table_rows(lever_status.lever_table({"governed": compared}, LEVERS,
                                                peer_fix_date="2025-12-31"))  # fmt: skip
    assert before[0][2].endswith("(before the peer fix)")
    assert "peer fix" not in after[0][2]


def test_a_harvest_without_its_standard_error_stands_side_by_side() -> None:
    rows = [stage_row("trickle", 0, harvest=0.6, overhead=0.0, se=0.005),
            stage_row("governed", 0, harvest=0.3, overhead=0.0, se=0.005)]  # fmt: skip
    for r in rows:
        r["harvest_se_frac"] = None  # an older table kept the bounds only
    source = bench("2026-01-01T00:00:00", rows)
    (c,) = lever_status.bench_comparisons(
        Arm(source, "trickle", "trickle"), Arm(source, "governed", "governed"), "table `x`"
    )
    assert c.harvest.diff is None or not c.harvest.diff.has_bounds
    assert c.harvest.on.lo == rows[0]["harvest_of_measured_idle_lo_frac"]
    # the arms' intervals are far apart, so the gain is clear without a difference
    assert lever_status.verdict(c.harvest, c.overhead) == "**helps**: more harvest"


def test_pipeline_means_over_the_same_stages_stand_side_by_side() -> None:
    def row(mode: str, harvest: tuple[float, float, float], stages: int) -> dict[str, Any]:
        value, lo, hi = harvest
        return {"run": "m4-timeslice", "case": "mix", "mode": mode, "stages_covered": stages,
                "blocks_min": 5, "harvest_of_measured_idle_frac": value,
                "harvest_of_measured_idle_lo_frac": lo, "harvest_of_measured_idle_hi_frac": hi,
                "overhead_one_stage_mean_frac": 0.0, "overhead_one_stage_mean_lo_frac": -0.01,
                "overhead_one_stage_mean_hi_frac": 0.01}  # fmt: skip

    source = bench("2026-01-01T00:00:00", [])
    source.data["pipeline"] = [row("governed", (0.69, 0.64, 0.73), 4),
                               row("managed", (0.56, 0.50, 0.62), 4),
                               row("naive", (0.9, 0.8, 1.0), 3)]  # fmt: skip
    governed, managed = Arm(source, "governed", "governed"), Arm(source, "managed", "managed")
    (c,) = lever_status.pipeline_comparisons(governed, managed, "table `x`")
    assert c.where == "mix, 4 stages: mean (M = 4, time-sliced)"
    assert c.harvest.diff is None and (c.harvest.on.lo, c.harvest.off.hi) == (0.64, 0.62)
    assert lever_status.verdict(c.harvest, c.overhead) == "**helps**: more harvest"
    # a mode measured over other stages is not compared
    naive = Arm(source, "naive", "naive")
    assert lever_status.pipeline_comparisons(naive, managed, "table `x`") == []


def test_placements_stand_side_by_side_and_alike_ones_differ_by_nothing() -> None:
    """Lever 6: the harvest-aware placement beside FreeRide's, per mode; where both placed
    the tasks alike they are one measurement, so the verdict is "no clear effect"."""

    def row(
        mode: str, policy: str, tasks: str, harvest: tuple[float, float, float]
    ) -> dict[str, Any]:
        value, lo, hi = harvest
        return {"run": "m4-timeslice", "mode": mode, "policy": policy, "tasks": tasks,
                "stages_covered": 4, "harvest_of_measured_idle_frac": value,
                "harvest_of_measured_idle_lo_frac": lo, "harvest_of_measured_idle_hi_frac": hi,
                "overhead_all_stages_estimate_frac": 0.004,
                "overhead_all_stages_estimate_lo_frac": 0.001,
                "overhead_all_stages_estimate_hi_frac": 0.007}  # fmt: skip

    source = bench("2026-01-01T00:00:00", [])
    source.data["placement"] = [
        row("governed", "freeride", "0:a, 1:b", (0.60, 0.55, 0.65)),
        row("governed", "harvest", "0:b, 1:a", (0.75, 0.70, 0.80)),
        row("governed", "best in hindsight", "0:b, 1:a", (0.75, 0.70, 0.80)),
        row("managed", "freeride", "0:a, 1:b", (0.50, 0.45, 0.55)),
        row("managed", "harvest", "0:a, 1:b", (0.50, 0.45, 0.55)),
    ]
    governed, managed = lever_status.placement_comparisons(source, "table `x`")
    assert governed.where == "4 stages: pipeline, governed (M = 4, time-sliced)"
    assert "harvest-aware (0:b, 1:a) vs FreeRide's placement (0:a, 1:b)" in governed.ab
    assert governed.harvest.diff is None
    assert lever_status.verdict(governed.harvest, governed.overhead) == "**helps**: more harvest"
    assert managed.harvest.diff.value == 0.0 and managed.overhead.diff.value == 0.0
    assert lever_status.verdict(managed.harvest, managed.overhead) == "no clear effect"


def test_comparisons_for_a_lever_that_is_not_listed_are_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown lever\(s\) \['typo'\]; known: governed"):
        lever_status.lever_table({"typo": []}, LEVERS)


# -- a committed A/B --------------------------------------------------------------------------


def test_the_committed_step_group_ab_has_a_difference_of_the_tables_own_figures() -> None:
    make_tables = _load("make_tables")
    (off, _), (on, _) = make_tables.H200_LEVERS[:2]
    compared = lever_status.bench_comparisons(
        Arm(make_tables.source(on), "governed", "on"),
        Arm(make_tables.source(off), "governed", "off"), "table `h200-12-04d-levers`",
    )  # fmt: skip
    row = next(r for r in make_tables.result(on)["summary"] if r["mode"] == "governed")
    (c,) = compared
    assert c.harvest.on.value == pytest.approx(row["harvest_of_measured_idle_frac"])
    assert (c.harvest.on.lo, c.harvest.on.hi) == pytest.approx(
        (row["harvest_of_measured_idle_lo_frac"], row["harvest_of_measured_idle_hi_frac"])
    )
    assert c.harvest.diff.has_bounds and c.overhead.diff.has_bounds
