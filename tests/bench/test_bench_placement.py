"""Lever 6 in the bench: each placement policy's assignment of a run's tasks, and the harvest
read off the (task, stage) cells the run measured."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from freeride_lab.bench.markdown import markdown
from freeride_lab.bench.placement import HINDSIGHT, placement_summary, predicted_fill_ms
from freeride_lab.bench.readout import predicted_bubbles_ms

# harvest (share of wall) measured for each (task, stage); stage 0 has three 30 ms bubbles,
# stage 1 one of 90 ms
CELLS = {("resnet18", 0): 0.10, ("resnet18", 1): 0.25, ("pagerank", 0): 0.22,
         ("pagerank", 1): 0.24}  # fmt: skip
BUBBLES = {0: [30.0, 30.0, 30.0], 1: [90.0]}
STEPS = {"resnet18": (17.0, 20.0), "pagerank": (2.0, 5.0)}  # solo step, budget (ms)


def _summary_row(task: str, stage: int, harvest: float, mode: str = "governed") -> dict[str, Any]:
    return {"run": "m4", "case": task, "stage": stage, "task": task, "mode": mode, "blocks": 5,
            "harvest_frac": harvest, "harvest_lo_frac": harvest - 0.01,
            "harvest_hi_frac": harvest + 0.01, "harvest_se_frac": 0.0036, "harvest_df": 4.0,
            "vanilla_idle_frac": 0.40, "vanilla_idle_se_frac": 0.004,
            "vanilla_idle_df": 4.0, "overhead_frac": harvest / 100, "overhead_lo_frac": -0.01,
            "overhead_hi_frac": 0.01, "overhead_se_frac": 0.004, "overhead_df": 4.0}  # fmt: skip


def _run(*, bubbles: bool = True) -> dict[str, Any]:
    segments: list[dict[str, Any]] = [{"case": "instrumentation", "stage": 0, "task": ""}]
    for task in ("resnet18", "pagerank"):  # the run's case order: the submission order
        for stage in (0, 1):
            step, budget = STEPS[task]
            segments.append({"case": task, "stage": stage, "task": task, "budget_ms": budget,
                             "solo_step_ms_median": step,
                             "stage_bubbles_ms": BUBBLES[stage] if bubbles else []})  # fmt: skip
    segments.append({"case": "mix", "stage": 0, "task": "pagerank", "budget_ms": 5.0})
    return {"name": "m4", "segments": segments}


def _summary() -> pd.DataFrame:
    rows = [_summary_row(t, s, h) for (t, s), h in CELLS.items()]
    rows += [_summary_row(t, s, 0.0, mode="vanilla") for t, s in CELLS]
    rows.append(_summary_row("pagerank", 0, 0.5) | {"case": "mix"})  # not a placement cell
    return pd.DataFrame(rows)


def test_each_policy_places_the_run_s_tasks_and_reads_their_harvest_off_the_cells() -> None:
    """FreeRide's rule puts the tasks on the stages in submission order; the harvest order
    puts ResNet-18 where its 17 ms steps fill most (85 of 90 ms vs 51 of 90) and PageRank on
    the stage left (78 ms its own vs 86 / 2 shared), and reads higher, as measured."""
    rows = placement_summary(_summary(), [_run()], stages=2).set_index("policy")
    assert list(rows.index) == ["freeride", "harvest", *HINDSIGHT]
    assert rows.loc["freeride", "tasks"] == "0:resnet18, 1:pagerank"
    assert rows.loc["harvest", "tasks"] == "0:pagerank, 1:resnet18"
    assert rows.loc["freeride", "harvest_frac"] == pytest.approx((0.10 + 0.24) / 2)
    assert rows.loc["harvest", "harvest_frac"] == pytest.approx((0.22 + 0.25) / 2)
    assert rows.loc["harvest", "harvest_of_measured_idle_frac"] == pytest.approx(0.235 / 0.40)
    assert rows.loc["harvest", "fill_predicted_ms"] == pytest.approx(78.0 + 85.0)
    # every stage harvesting at once: the two assigned cells' slowdowns add
    assert rows.loc["harvest", "overhead_all_stages_estimate_frac"] == pytest.approx(0.0047)
    assert rows.loc["freeride", "fill_predicted_ms"] == pytest.approx(51.0 + 86.0)
    lo, hi = rows.loc["harvest", ["harvest_lo_frac", "harvest_hi_frac"]]
    assert lo < 0.235 < hi
    assert rows.loc[HINDSIGHT[0], "tasks"] == rows.loc["harvest", "tasks"]
    assert rows.loc[HINDSIGHT[1], "tasks"] == rows.loc["freeride", "tasks"]
    assert set(rows["mode"]) == {"governed"}


def test_each_cell_s_predicted_fill_is_what_its_steps_fill_of_the_stage_s_bubbles() -> None:
    assert predicted_fill_ms([_run()], "m4", "governed") == {
        ("resnet18", 0): 51.0, ("resnet18", 1): 85.0, ("pagerank", 0): 78.0,
        ("pagerank", 1): 86.0,
    }  # fmt: skip
    assert predicted_fill_ms([_run(bubbles=False)], "m4", "governed") == {}


def test_a_task_profiled_in_slices_fills_each_bubble_s_tail_with_them() -> None:
    """ResNet-18's profile says its 17 ms step was four slices: after its one whole step in
    each 30 ms bubble of stage 0, two slices (4.25 ms, 5 ms budget) fit in the 13 ms left."""
    run = _run()
    for seg in run["segments"]:
        if seg["task"] == "resnet18":
            seg["top_step_size"] = 4
    fill = predicted_fill_ms([run], "m4", "governed")
    assert fill[("resnet18", 0)] == pytest.approx(3 * (17.0 + 2 * 4.25))
    assert fill[("resnet18", 1)] == pytest.approx(85.0)  # 5 ms left: not > a slice's budget
    assert fill[("pagerank", 0)] == pytest.approx(78.0)


def test_a_stage_nobody_placed_on_harvests_nothing_over_all_s_stages() -> None:
    """Harvest is a mean over the S stages: with S = 4, two covered stages halve it."""
    rows = placement_summary(_summary(), [_run()], stages=4).set_index("policy")
    assert rows.loc["harvest", "harvest_frac"] == pytest.approx((0.22 + 0.25) / 4)


def test_without_predicted_bubbles_the_harvest_order_falls_back_to_freerides() -> None:
    rows = placement_summary(_summary(), [_run(bubbles=False)], stages=2).set_index("policy")
    assert rows.loc["harvest", "tasks"] == rows.loc["freeride", "tasks"]
    assert pd.isna(rows.loc["harvest", "fill_predicted_ms"])


def test_a_run_continued_over_two_calls_is_read_as_one() -> None:
    """``--resume`` records a run once a call: its segments are read together."""
    run = _run()
    first = {"name": "m4", "segments": run["segments"][:3]}
    second = {"name": "m4", "segments": run["segments"][3:]}
    whole = placement_summary(_summary(), [run], stages=2)
    pd.testing.assert_frame_equal(placement_summary(_summary(), [first, second], stages=2), whole)


def test_the_budget_is_the_one_the_mode_runs_with_and_a_task_no_bubble_fits_is_placed_nowhere() -> (
    None
):
    """Governed blocks run from the tight budget: at 95 ms no bubble exceeds ResNet-18's, so
    the lab would place it nowhere, and only PageRank harvests; managed blocks keep FreeRide's
    20 ms budget, and both are placed."""
    run = _run()
    for seg in run["segments"]:
        if seg["task"] == "resnet18":
            seg["tight_budget_ms"] = 95.0
    governed = _summary().query("mode == 'governed'")
    summary = pd.concat([_summary(), governed.assign(mode="managed")])
    rows = placement_summary(summary, [run], stages=2).set_index(["mode", "policy"])
    assert rows.loc[("governed", "freeride"), "tasks"] == "0:pagerank"
    assert rows.loc[("governed", "freeride"), "harvest_frac"] == pytest.approx(0.22 / 2)
    assert rows.loc[("managed", "freeride"), "tasks"] == "0:resnet18, 1:pagerank"


def test_runs_that_did_not_measure_every_task_on_every_stage_have_no_placement_rows() -> None:
    one_stage = _summary()
    one_stage = one_stage[one_stage["stage"] == 0]
    assert placement_summary(one_stage, [_run()], stages=2).empty
    mix_only = _summary()
    mix_only = mix_only[mix_only["case"] == "mix"]
    assert placement_summary(mix_only, [_run()], stages=2).empty


def test_the_bench_markdown_shows_the_placement_rows() -> None:
    rows = placement_summary(_summary(), [_run()], stages=2)
    text = markdown({"placement": rows.to_dict("records")})
    assert "## Placement" in text
    assert "| m4 | governed | harvest | 0:pagerank, 1:resnet18 | 163.0 | 23.5% [" in text


def test_the_placer_s_bubbles_come_from_the_segment_s_vanilla_blocks_on_its_rank() -> None:
    """Per slot, the minimum of its last five instances within the blocks' steps, on the
    rank asked about only (as ``core.bubbles.predict_bubbles`` gives the lab's placer)."""
    rows = [
        {"step": step, "rank": rank, "slot": slot, "label": "x",
         "duration_ms": 10.0 * (slot + 1) + step + (100.0 if rank else 0.0)}
        for step in range(20) for rank in (0, 1) for slot in (0, 1)
    ]  # fmt: skip
    bubbles = pd.DataFrame(rows)
    blocks = [{"first_step": 4, "steps": 3}, {"first_step": 12, "steps": 4}]  # 4-6, 12-15
    # the last five of steps 4, 5, 6, 12, 13, 14, 15 are 6, 12, ...: the minimum is step 6's
    assert predicted_bubbles_ms(bubbles, blocks, 0) == [16.0, 26.0]
    assert predicted_bubbles_ms(bubbles, blocks, 1) == [116.0, 126.0]
    assert predicted_bubbles_ms(bubbles, [], 0) == []
