"""Where bench results go: one file per GPU model and date."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from freeride_lab.bench import markdown as bench_markdown
from freeride_lab.bench import results as bench_results


@pytest.mark.parametrize(
    ("device", "name", "stem"),
    [
        ("cuda", "NVIDIA H200", "h200"),
        ("cuda", "NVIDIA H100 80GB HBM3", "h100"),
        ("cuda", "", "gpu"),
        ("cpu", "NVIDIA H200", "cpu"),
    ],
)
def test_results_files_are_named_after_the_gpu_that_made_them(
    device: str, name: str, stem: str
) -> None:
    out = bench_results.default_out(device, name)
    assert out.parent == Path("benchmarks") / "results"
    assert out.name.startswith(f"{stem}-") and out.suffix == ".json"


# -- dedicated speeds, intervals, goals -------------------------------------------------------


def _block(run: str, order: int, mode: str, **kw: object) -> dict[str, object]:
    row: dict[str, object] = {
        "run": run, "case": "mix", "stage": 0, "task": "pagerank", "mode": mode,
        "repeat": order // 2, "order": order, "first_step": 10 * order, "steps": 4,
        "step_ms_median": 100.0, "wall_s": 0.4, "bubble_ms": 160.0, "progress": 0.0,
        "unit": "iterations", "side_steps": 0, "busy_ms": 0.0, "busy_in_bubble_ms": 0.0,
        "overruns": 0, "overrun_ms_total": 0.0, "latency_ms": [], "sm_clock_mhz": None,
        "power_w": None, "step_ms": [100.0] * 4,
    }  # fmt: skip
    row.update(kw)
    return row


Run = tuple[dict[str, Any], list[dict[str, object]]]


def _run(name: str, segment: Mapping[str, object], slow: tuple[float, ...]) -> Run:
    """A run record with one pagerank segment and its vanilla/managed blocks."""
    blocks = []
    for i, factor in enumerate(slow):
        blocks.append(_block(name, 2 * i, "vanilla"))
        blocks.append(
            _block(name, 2 * i + 1, "managed", step_ms_median=100.0 * factor, progress=400.0)
        )
    blocks.append(_block(name, 2 * len(slow), "vanilla"))
    seg = {"case": "mix", "stage": 0, "task": "pagerank", "unit": "iterations", **segment}
    return {"name": name, "microbatches": 4, "segments": [seg]}, blocks


def _result(*runs: Run) -> dict[str, Any]:
    from freeride_lab.bench.profiles import GOALS

    return {
        "runs": [r for r, _ in runs],
        "blocks": [b for _, bs in runs for b in bs],
        "goals": GOALS,
        "dedicated_per_s": {"pagerank": 5000.0},  # what older results carry: pooled, unused
    }


def _managed(result: dict[str, Any], run: str) -> dict[str, Any]:
    return next(r for r in result["summary"] if r["run"] == run and r["mode"] == "managed")


def test_each_run_values_its_side_work_at_its_own_solo_speed_not_one_pooled_over_runs() -> None:
    # the same task measured alone at 4,000 and 6,000 units/s in two runs: pooled (median
    # 5,000) the first run's harvest would read 8% and the second's 8% too
    slow = (1.0, 1.0, 1.0, 1.0, 1.0)
    result = _result(
        _run("m4-timeslice", {"dedicated_per_s": 4000.0}, slow),
        _run("m4-mps", {"dedicated_per_s": 6000.0}, slow),
    )
    bench_results.fill_tables(result, stages=4)
    assert _managed(result, "m4-timeslice")["harvest_frac"] == pytest.approx(400 / 4000 / 0.4)
    assert _managed(result, "m4-mps")["harvest_frac"] == pytest.approx(400 / 6000 / 0.4)
    assert "dedicated_per_s" not in result  # no pooled speed is left to misread


def test_a_segment_uses_the_mean_of_its_solo_speeds_before_and_after_its_blocks() -> None:
    seg = {"dedicated_before_per_s": 4000.0, "dedicated_after_per_s": 5000.0}
    result = _result(_run("m4", seg, (1.0,) * 5))
    bench_results.fill_tables(result, stages=4)
    (row,) = result["dedicated"]
    assert (row["before_per_s"], row["after_per_s"], row["dedicated_per_s"]) == (
        4000.0,
        5000.0,
        4500.0,
    )
    assert _managed(result, "m4")["harvest_frac"] == pytest.approx(400 / 4500 / 0.4)


def test_the_theory_limit_is_the_runs_own_schedules_and_1f1bs_for_older_results() -> None:
    from freeride_lab.core.theory import theory_bubble_fraction

    seg = {"dedicated_per_s": 4000.0}
    interleaved, _ = run_blocks = _run("m4-interleaved", seg, (1.0,) * 5)
    interleaved["bubble_limit_frac"] = theory_bubble_fraction("Interleaved1F1B", 4, 4, 2)
    result = _result(run_blocks, _run("m4", seg, (1.0,) * 5))  # the second: recorded before
    bench_results.fill_tables(result, stages=4)
    assert _managed(result, "m4-interleaved")["bubble_limit_frac"] == pytest.approx(3 / 11)
    assert _managed(result, "m4")["bubble_limit_frac"] == pytest.approx(3 / 7)
    row = _managed(result, "m4-interleaved")
    assert row["harvest_of_theory_limit_frac"] == pytest.approx(row["harvest_frac"] / (3 / 11))


@pytest.mark.parametrize(("after", "flagged"), [(4300.0, False), (4500.0, True)])
def test_a_segment_whose_solo_speed_moved_more_than_ten_percent_is_flagged(
    after: float, flagged: bool
) -> None:
    seg = {"dedicated_before_per_s": 4000.0, "dedicated_after_per_s": after}
    result = _result(_run("m4", seg, (1.0,) * 5))
    bench_results.fill_tables(result, stages=4)
    (row,) = result["dedicated"]
    assert row["spread_frac"] == pytest.approx((after - 4000.0) / ((after + 4000.0) / 2))
    assert row["unstable"] is flagged
    assert ("| **yes** |" in bench_markdown.markdown(result)) is flagged


def test_results_from_before_the_after_phase_say_it_was_not_measured() -> None:
    result = _result(_run("m4", {"dedicated_per_s": 4000.0, "solo_s": 0.2}, (1.0,) * 5))
    bench_results.fill_tables(result, stages=4)
    (row,) = result["dedicated"]
    assert (row["before_per_s"], row["after_per_s"], row["after_measured"]) == (4000.0, None, False)
    assert bench_markdown.NOT_MEASURED in bench_markdown.markdown(result)


@pytest.mark.parametrize("weight_ms", [[0.0, 0.0], [0.0, 1.5]])
def test_the_runs_section_shows_a_calibrated_weight_half_only_where_there_is_one(
    weight_ms: list[float],
) -> None:
    calibration = {"rank": 1, "forward_ms": [1.0, 2.0], "backward_ms": [2.0, 4.0],
                   "weight_ms": weight_ms, "optimizer_ms": 0.5}  # fmt: skip
    md = bench_markdown.markdown({"runs": [{"name": "m4", "calibration": [calibration]}]})
    assert "rank 1: F 1.0/2.0 B 2.0/4.0" in md and "opt 0.5 ms" in md
    assert ("(W 0.0/1.5)" in md) is any(weight_ms)


def test_the_runs_section_says_which_calibration_was_replayed_and_what_was_measured() -> None:
    measured = {"forward_ms": [21.3], "backward_ms": [36.4], "weight_ms": [0.0],
                "optimizer_ms": 13.9}  # fmt: skip
    replayed = {"rank": 0, "forward_ms": [19.5], "backward_ms": [36.1], "weight_ms": [0.0],
                "optimizer_ms": 14.0, "measured": measured}  # fmt: skip
    md = bench_markdown.markdown({"runs": [{"name": "m4", "calibration": [replayed]}]})
    assert "rank 0: F 19.5 B 36.1 opt 14.0 ms (replayed; measured F 21.3 B 36.4)" in md


def test_headline_names_the_all_stage_estimate_and_the_one_stage_figures_with_intervals() -> None:
    result = _result(_run("m4", {"dedicated_per_s": 4000.0}, (1.01, 1.02, 1.00, 1.03, 1.01)))
    bench_results.fill_tables(result, stages=4)
    managed = result["headline"]["m4"]["managed"]
    for name in ("overhead_all_stages_estimate_frac", "overhead_one_stage_mean_frac",
                 "overhead_one_stage_worst_frac", "harvest_of_theory_limit_frac",
                 "harvest_of_measured_idle_frac", "saving_corrected_frac"):  # fmt: skip
        figure = managed[name]
        assert figure["lo"] <= figure["value"] <= figure["hi"], name
    assert managed["overhead_all_stages_estimate_frac"]["value"] == pytest.approx(0.014)
    md = bench_markdown.markdown(result)
    assert "all stages at once (estimate)" in md and "one stage: mean" in md


def test_a_goal_is_met_only_when_its_interval_clears_it() -> None:
    row: dict[str, Any] = {"run": "m4", "case": "mix", "mode": "managed"}
    row |= {f"overhead_one_stage_mean{s}_frac": v for s, v in
            (("", 0.002), ("_lo", -0.001), ("_hi", 0.005))}  # fmt: skip
    row |= {f"harvest_of_theory_limit{s}_frac": v for s, v in
            (("", 0.95), ("_lo", 0.91), ("_hi", 0.99))}  # fmt: skip
    goals = {"overhead_mean_frac_max": 0.003, "harvest_of_limit_frac_min": 0.9}
    checks = {c["goal"]: c for c in bench_results.goal_checks([row], [], goals)}
    overhead = checks["overhead, one stage at a time: mean"]
    assert overhead["value"] < 0.003 and overhead["met"] is False  # its upper bound is 0.5%
    assert checks["harvest of the theory limit"]["met"] is True  # lower bound 91% > 90%


def test_harvest_of_the_measured_idle_is_judged_stage_by_stage() -> None:
    """Three of four stages covered, each harvesting 95% [92, 98] of its measured idle: the
    pipeline figure (an uncovered stage counts as harvesting nothing) reads about 71%, yet
    every stage meets the goal; one stage below it decides, and is named."""
    key = ("m4", "mix", "governed")
    row: dict[str, Any] = dict(zip(("run", "case", "mode"), key, strict=True))
    row |= {f"harvest_of_measured_idle{s}_frac": v for s, v in
            (("", 0.71), ("_lo", 0.69), ("_hi", 0.73))}  # fmt: skip

    def stage(n: int, task: str, value: float) -> dict[str, Any]:
        return {"run": "m4", "case": "mix", "mode": "governed", "stage": n, "task": task,
                "harvest_of_measured_idle_frac": value,
                "harvest_of_measured_idle_lo_frac": value - 0.03,
                "harvest_of_measured_idle_hi_frac": value + 0.03}  # fmt: skip

    goals = {"harvest_of_limit_frac_min": 0.9}
    every = [stage(1, "resnet18", 0.95), stage(2, "image", 0.95), stage(3, "vgg19", 0.95)]
    name = "harvest of the measured idle time, every stage"
    (check,) = [c for c in bench_results.goal_checks([row], every, goals) if c["goal"] == name]
    assert check["met"] is True and check["lo"] == pytest.approx(0.92)
    every[2] = stage(3, "vgg19", 0.80)
    (check,) = [c for c in bench_results.goal_checks([row], every, goals) if c["goal"] == name]
    assert check["met"] is False
    assert (check["stage"], check["task"], check["value"]) == (3, "vgg19", 0.80)
    assert check["hi"] is None and check["lo"] == pytest.approx(0.77)
    assert "stage 3 · vgg19, lower bound 77.00%" in bench_markdown.goal_figure(check)


def test_the_one_stage_mean_and_the_all_stage_estimate_each_meet_their_own_goal() -> None:
    # 0.3% is the mean per stage; the estimate with every stage harvesting has 1.0%
    row: dict[str, Any] = {"run": "m4", "case": "mix", "mode": "managed"}
    for figure, hi in (("overhead_one_stage_mean", 0.002), ("overhead_all_stages_estimate", 0.008)):
        row |= {f"{figure}{s}_frac": v for s, v in (("", hi / 2), ("_lo", 0.0), ("_hi", hi))}
    goals = {"overhead_mean_frac_max": 0.003, "overhead_all_stages_frac_max": 0.01}
    checks = {c["goal"]: c for c in bench_results.goal_checks([row], [], goals)}
    assert checks["overhead, one stage at a time: mean"]["threshold"] == 0.003
    assert checks["overhead, all stages at once (estimate)"]["threshold"] == 0.01
    assert all(c["met"] for c in checks.values())


def test_block_overruns_count_any_step_that_ended_after_its_bubble() -> None:
    import pandas as pd

    from freeride_lab.lab.tables import SIDE_TASK_STEP_COLUMNS

    side = pd.DataFrame(
        [["t1", "counting", 0, 0, 1, 10.0, 12.0, 2.0, 1.0, "it", ms, *[float("nan")] * 5]
         for ms in (0.0, 1e-6, 3.0, float("nan"))],
        columns=list(SIDE_TASK_STEP_COLUMNS),
    )  # fmt: skip
    bubbles = pd.DataFrame(columns=["rank", "step", "start_ms", "end_ms", "duration_ms"])
    block = {"stage": 0, "first_step": 0, "steps": 1, "mode": "managed", "case": "x",
             "task": "counting", "task_id": "t1", "repeat": 0, "order": 0}  # fmt: skip
    row = bench_results.block_row(block, "m4", {(0, 0): 0, (0, 1): 20 * 10**6}, bubbles, side,
                                  [], [], 0)  # fmt: skip
    assert row is not None and (row["side_steps"], row["overruns"]) == (4, 2)
    assert row["overrun_ms_total"] == pytest.approx(3.0 + 1e-6)


# -- one overrun count ------------------------------------------------------------------------


def test_host_log_tables_task_board_report_and_bench_count_the_same_overruns(
    tmp_path: Path,
) -> None:
    """A real task host steps through bubbles that end before their prediction, so the step in
    flight at each end overruns; every place that counts overruns must give its count."""
    import json
    import re
    import time

    import pandas as pd

    from freeride_lab.core.accounting import ledger
    from freeride_lab.core.sidetask_state import SideTaskState
    from freeride_lab.io.rundir import RunDir
    from freeride_lab.lab.tables import side_task_steps_frame, steps_frame
    from freeride_lab.lab.taskbook import TaskBook, TaskRecord
    from freeride_lab.sidetasks.edges import EdgeWriter, edge_path
    from freeride_lab.sidetasks.process import TaskProcess
    from freeride_lab.sidetasks.spec import HostSpec, TaskSpec
    from freeride_lab.ui.report import overheads

    counting = f"{Path(__file__).parents[1] / 'sidetasks' / 'tasks_for_tests.py'}:Counting"
    run = RunDir(tmp_path / "run")
    run.create()
    spec = TaskSpec.from_dict(
        {"task": counting, "task_id": "t1", "options": {"step_s": 0.02},
         "limits": {"budget_s": 0.005}, "overrun_policy": "WARN"}
    )  # fmt: skip
    proc = TaskProcess(spec)
    log_path = run.logs_dir / "task-t1.log"
    writer = EdgeWriter.create(edge_path(run.path, 0))
    try:
        proc.start(HostSpec(task=spec, run_dir=str(run.path), rank=0, stage=0), log_path=log_path)

        def wait_state(state: SideTaskState) -> None:
            deadline = time.monotonic() + 60
            while proc.state != state:
                assert proc.conn is not None and time.monotonic() < deadline, proc.state
                if proc.conn.poll(0.05):
                    proc.receive()

        wait_state(SideTaskState.CREATED)
        assert proc.request({"cmd": "activate"})
        wait_state(SideTaskState.PAUSED)
        for step in range(6):  # predicted 10 s, really 50 ms: the step in flight overruns
            start_ns = time.time_ns()
            writer.bubble_start(step, 0, start_ns, start_ns + 10 * 10**9)
            time.sleep(0.05)  # the bubble itself: the scenario, not a synchronisation
            writer.bubble_end(step, 0, time.time_ns())
            time.sleep(0.05)  # training computes
        assert proc.request({"cmd": "stop", "reason": "test"})
        proc.wait_exit(30)
    finally:
        if proc.alive:
            proc.kill("test teardown")
            proc.wait_exit(10)
        proc.close_channel()
        writer.close()

    found = re.search(r"task t1: (\d+) of (\d+) steps overran", log_path.read_text())
    assert found, log_path.read_text()[-2000:]
    host = (int(found[1]), int(found[2]))
    assert host[0] >= 1  # the scenario makes overruns; zero would prove nothing

    events = [json.loads(x) for x in (run.events_dir / "task-t1.jsonl").read_text().splitlines()]
    side = side_task_steps_frame(events)
    table = ledger(side).iloc[0]
    book = TaskBook(run, lambda start: events[start:])
    board = book.view(TaskRecord(id="t1", task=counting, name="Counting", rank=0, stage=0))
    report = overheads(steps_frame([]), side)
    t0 = int(side_task_steps_frame(events)["start_ms"].min() * 0) or 0
    first_ns = min(int(e["start_ns"]) for e in events if e.get("kind") == "side_task_step")
    last_ns = max(int(e["end_ns"]) for e in events if e.get("kind") == "side_task_step")
    block = {"stage": 0, "first_step": 0, "steps": 1, "mode": "managed", "case": "x",
             "task": "counting", "task_id": "t1", "repeat": 0, "order": 0}  # fmt: skip
    bubbles = pd.DataFrame(columns=["rank", "step", "start_ms", "end_ms", "duration_ms"])
    bench = bench_results.block_row(
        block, "r", {(0, 0): first_ns, (0, 1): last_ns + 1}, bubbles,
        side_task_steps_frame(events, first_ns), [], [], first_ns + t0,
    )  # fmt: skip
    assert bench is not None
    assert (int(table["overruns"]), int(table["steps"])) == host
    assert (board["overruns"], board["steps"]) == host
    assert (int(report["side_task_overruns"]), int(report["side_task_steps"])) == host
    assert (bench["overruns"], bench["side_steps"]) == host


def _managed_block_row(
    steps: list[list[object]],
    bubbles_ms: list[tuple[float, float]],
    announced: list[tuple[float, float, float]],
    holds: list[tuple[str, float, float]] | None = None,
    **block_fields: object,
) -> dict[str, Any] | None:
    """``block_row`` of a managed block of task t1 on stage 0 (training step 0, 0-30 ms): its
    side-task ``steps`` (rows of ``SIDE_TASK_STEP_COLUMNS``), the rank's measured bubbles and
    the bubbles it announced as (start, end, predicted end), all in ms; ``holds``: the
    checkpoints of tasks as (task_id, start, end)."""
    import pandas as pd

    from freeride_lab.lab.tables import SIDE_TASK_STEP_COLUMNS

    side = pd.DataFrame(steps, columns=list(SIDE_TASK_STEP_COLUMNS))
    bubbles = pd.DataFrame(
        [[0, 0, a, b, b - a] for a, b in bubbles_ms],
        columns=["rank", "step", "start_ms", "end_ms", "duration_ms"],
    )
    edges = [
        {"kind": "bubble_edge", "rank": 0, "step": 0, "slot": slot, "edge": edge,
         "t_ns": int(ms * 1e6),
         **({"predicted_end_ns": int(end * 1e6)} if edge == "start" else {})}
        for slot, (a, b, end) in enumerate(announced)
        for edge, ms in (("start", a), ("end", b))
    ]  # fmt: skip
    block = {"stage": 0, "first_step": 0, "steps": 1, "mode": "managed", "case": "x",
             "task": "counting", "task_id": "t1", "repeat": 0, "order": 1,
             **block_fields}  # fmt: skip
    return bench_results.block_row(block, "m4", {(0, 0): 0, (0, 1): 30 * 10**6}, bubbles, side,
                                   edges, [], 0, holds or [])  # fmt: skip


@pytest.mark.parametrize("guard_ms", [4.0, 2.0, None])
def test_an_announced_bubble_predicted_within_the_guard_is_the_guards(
    guard_ms: float | None,
) -> None:
    """Steps 1-4 ms in bubble 0-10 (the block's shortest step: 3 ms) record the guard their
    bubble had to clear; bubble 15-19 was announced predicted to end at 18.5 ms (3.5 ms: room
    for the step): within a 4 ms guard it is the guard's, past a 2 ms one the host's, and
    without a recorded guard the split is not made (NaN)."""
    import math

    nan = float("nan")
    step = ["t1", "counting", 0, 0, 1, 1.0, 4.0, 3.0, 1.0, "it", 0.0, *[nan] * 4,
            nan if guard_ms is None else guard_ms]  # fmt: skip
    row = _managed_block_row([step], [(0.0, 10.0), (15.0, 19.0)],
                             [(0.0, 10.0, 9.0), (15.0, 19.0, 18.5)])  # fmt: skip
    assert row is not None
    assert (row["idle_unused_fit_ms"], row["idle_unused_short_ms"]) == (4.0, 0.0)
    if guard_ms is None:
        assert math.isnan(row["idle_unused_guard_ms"])
    else:
        assert row["idle_unused_guard_ms"] == (4.0 if guard_ms >= 3.5 else 0.0)


def test_an_announced_bubble_with_room_left_while_a_task_checkpointed_is_the_holds() -> None:
    """Bubble 15-19 (announced with room for the 3 ms step, no guard in its way) unused: a
    checkpoint of the block's task or of the task on its leftovers that held its host across
    it puts it in ``idle_unused_held_ms``; one of another task, or one over, does not."""
    nan = float("nan")
    step = ["t1", "counting", 0, 0, 1, 1.0, 4.0, 3.0, 1.0, "it", 0.0, *[nan] * 4, 2.0]

    def held(holds: list[tuple[str, float, float]]) -> float:
        row = _managed_block_row([step], [(0.0, 10.0), (15.0, 19.0)],
                                 [(0.0, 10.0, 9.0), (15.0, 19.0, 18.5)], holds,
                                 leftovers_task_id="t2")  # fmt: skip
        assert row is not None and row["idle_unused_guard_ms"] == 0.0
        return float(row["idle_unused_held_ms"])

    assert held([("t1", 14.0, 16.0)]) == 4.0
    assert held([("t2", 18.0, 25.0)]) == 4.0
    assert held([("t9", 14.0, 20.0), ("t1", 10.5, 14.5)]) == 0.0
    assert held([]) == 0.0


def test_a_block_splits_its_uncovered_bubble_time_and_the_summary_reports_the_shares() -> None:
    """Bubble 0-10 ms: wake-up 1 ms, steps 1-4 and 4.5-8, 2 ms left; bubbles 12-14 (shorter
    than the shortest step, 3 ms), 15-19 (announced, left by the host) and 21-25 (never
    announced) unused."""
    import pandas as pd

    from freeride_lab.bench import stats as bs
    from freeride_lab.bench import tables as bt

    steps = [["t1", "counting", 0, 0, 1, a, b, b - a, 1.0, "it", 0.0, *[float("nan")] * 5]
             for a, b in ((1.0, 4.0), (4.5, 8.0))]  # fmt: skip
    # the 15-19 bubble was announced predicted to end at 16.5 ms: 1.5 ms, too short for 3 ms
    row = _managed_block_row(steps, [(0.0, 10.0), (12.0, 14.0), (15.0, 19.0), (21.0, 25.0)],
                             [(0.0, 10.0, 9.0), (15.0, 19.0, 16.5)])  # fmt: skip
    assert row is not None
    assert (row["idle_lead_ms"], row["idle_between_ms"], row["idle_tail_ms"]) == (1.0, 0.5, 2.0)
    assert (row["idle_unused_ms"], row["bubbles"], row["unused_bubbles"]) == (10.0, 4, 3)
    assert (row["idle_unused_fit_ms"], row["idle_unused_silent_ms"]) == (8.0, 4.0)
    assert row["idle_unused_short_ms"] == 4.0
    assert row["idle_tail_unpromised_ms"] == 1.0  # 9-10: the bubble outlasted its prediction
    vanilla = {**row, "mode": "vanilla", "order": 0, "progress": 0.0, "side_steps": 0}
    blocks = pd.DataFrame([vanilla, row], columns=[*bs.BLOCK_COLUMNS, "step_ms"])
    summary = bt.summarize_blocks(blocks, stages=4, microbatches=4, dedicated_per_s={})
    managed = summary[summary["mode"] == "managed"].iloc[0]
    assert managed["bubble_used_frac"] == pytest.approx(6.5 / 20)
    assert managed["idle_tail_frac"] == pytest.approx(2.0 / 20)
    assert managed["idle_tail_unpromised_frac"] == pytest.approx(1.0 / 20)
    assert managed["idle_unused_frac"] == pytest.approx(10.0 / 20)
    assert managed["idle_unused_fit_frac"] == pytest.approx(8.0 / 20)
    assert managed["idle_unused_silent_frac"] == pytest.approx(4.0 / 20)
    assert managed["idle_unused_short_frac"] == pytest.approx(4.0 / 20)
    assert managed["unused_bubbles_frac"] == 0.75
    parts = ("bubble_used", "idle_lead", "idle_between", "idle_tail", "idle_unused")
    assert sum(managed[f"{p}_frac"] for p in parts) == pytest.approx(1.0)
    text = bench_markdown.markdown({"summary": summary.to_dict("records")})
    assert "## Where the idle time went" in text
    shares = "32.5% | 5.0% | 2.5% | 10.0% | 5.0% | 50.0% | 40.0% | 20.0% | 20.0% | 0.0% | 75.0% | -"
    assert f"| m4 | x | 0 | counting | managed | {shares} |" in text


def test_results_recorded_before_the_idle_split_still_summarize() -> None:
    import pandas as pd

    from freeride_lab.bench import stats as bs
    from freeride_lab.bench import tables as bt

    blocks = pd.DataFrame([_block("m4", 0, "vanilla"), _block("m4", 1, "managed")])
    assert not set(bs.IDLE_SPLIT_COLUMNS) & set(blocks.columns)
    summary = bt.summarize_blocks(blocks, stages=4, microbatches=4, dedicated_per_s={})
    assert summary["idle_tail_frac"].isna().all()
    assert summary["idle_tail_unpromised_frac"].isna().all()
    assert "idle time went" not in bench_markdown.markdown({"summary": summary.to_dict("records")})


@pytest.mark.parametrize(("mode", "pauses"), [("managed", [4.0]), ("trickle", [])])
def test_a_block_times_how_long_its_task_went_on_starting_steps_after_a_bubble_ended(
    mode: str, pauses: list[float]
) -> None:
    import pandas as pd

    from freeride_lab.lab.tables import SIDE_TASK_STEP_COLUMNS

    side = pd.DataFrame(
        [["t1", "counting", 0, 0, 1, start, start + 1.0, 1.0, 1.0, "it", 0.0, *[float("nan")] * 5]
         for start in (2.0, 12.0)],  # one step in the bubble [1, 8) ms, one 4 ms after its end
        columns=list(SIDE_TASK_STEP_COLUMNS),
    )  # fmt: skip
    bubbles = pd.DataFrame(columns=["rank", "step", "start_ms", "end_ms", "duration_ms"])
    edges = [
        {"kind": "bubble_edge", "rank": 0, "step": 0, "slot": 1, "edge": edge, "t_ns": t * 10**6}
        for edge, t in (("start", 1), ("end", 8))
    ]
    block = {"stage": 0, "first_step": 0, "steps": 1, "mode": mode, "case": "x",
             "task": "counting", "task_id": "t1", "repeat": 0, "order": 0}  # fmt: skip
    row = bench_results.block_row(block, "m4", {(0, 0): 0, (0, 1): 20 * 10**6}, bubbles, side,
                                  edges, [], 0)  # fmt: skip
    assert row is not None and row["pause_ms"] == pauses
    assert row["latency_ms"] == [1.0]  # the bubble opened at 1 ms, its first step at 2 ms


def test_a_block_splits_its_signal_latency_at_the_moment_the_host_saw_the_edge() -> None:
    """Bubble [1, 8) ms: its host saw the edge at 1.25 ms and started a step at 2 ms, then
    another (no edge of its own); bubble [10, 18): a first step that did not record when.
    The device reached those bubbles 0.2 ms and 0.5 ms before their edges were announced."""
    import pandas as pd

    from freeride_lab.lab.tables import SIDE_TASK_STEP_COLUMNS

    nan = float("nan")
    # the first bubble's host expected it at 0.9 ms and spun over [0.6, 1.5] ms; the second's
    # expected it at 9.0 ms and spun over [8.7, 9.5] ms, before its edge
    side = pd.DataFrame(
        [["t1", "counting", 0, 0, 1, start, start + 1.0, 1.0, 1.0, "it", 0.0, seen, *why, nan]
         for start, seen, why in ((2.0, 1.25, (0.9, 0.6, 1.5)), (3.5, nan, (nan,) * 3),
                                  (11.0, nan, (9.0, 8.7, 9.5)))],
        columns=list(SIDE_TASK_STEP_COLUMNS),
    )  # fmt: skip
    bubbles = pd.DataFrame(
        [[0, 0, 0.8, 8.0, 7.2], [0, 0, 9.5, 18.0, 8.5]],
        columns=["rank", "step", "start_ms", "end_ms", "duration_ms"],
    )
    edges = [
        {"kind": "bubble_edge", "rank": 0, "step": 0, "slot": slot, "edge": edge, "t_ns": t * 10**6}
        for slot, edge, t in ((1, "start", 1), (1, "end", 8), (2, "start", 10), (2, "end", 18))
    ]
    block = {"stage": 0, "first_step": 0, "steps": 1, "mode": "managed", "case": "x",
             "task": "counting", "task_id": "t1", "repeat": 0, "order": 0}  # fmt: skip
    row = bench_results.block_row(block, "m4", {(0, 0): 0, (0, 1): 20 * 10**6}, bubbles, side,
                                  edges, [], 0)  # fmt: skip
    assert row is not None and row["latency_ms"] == [1.0, 1.0]
    assert row["wake_ms"] == [pytest.approx(0.25)]  # of the first 1.0 ms; the rest the host's
    assert row["announce_ms"] == [pytest.approx(0.2), pytest.approx(0.5)]  # before the edges
    assert row["late_ms"] == [pytest.approx(0.1), pytest.approx(1.0)]  # against the expected
    assert row["spun"] == [1.0, 0.0]  # the first edge inside its spin, the second after it


def test_announce_lag_counts_only_edges_inside_a_measured_gap() -> None:
    from freeride_lab.bench import stats as bs

    gaps = [(1_000_000, 8_000_000), (9_500_000, 18_000_000)]
    # inside the first; at the second's start; after both ended; before any gap
    edges = [1_300_000, 9_500_000, 18_000_000, 500_000]
    assert bs.announce_lag_ms(gaps, edges) == [pytest.approx(0.3), 0.0]
    assert bs.announce_lag_ms([], edges) == []


def test_results_from_before_hosts_said_when_they_saw_edges_read_not_measured() -> None:
    import math

    import pandas as pd

    from freeride_lab.bench import tables as bt

    blocks = pd.DataFrame([_block("m4", 0, "vanilla"), _block("m4", 1, "managed")])
    assert "wake_ms" not in blocks.columns
    summary = bt.summarize_blocks(blocks, stages=4, microbatches=4, dedicated_per_s={})
    pipeline = bt.pipeline_summary(summary, blocks, stages=4, reference_keys={})
    assert not pipeline.empty
    assert all(math.isnan(r["wake_p50_ms"]) for _, r in pipeline.iterrows())
    assert all(math.isnan(r["announce_p99_ms"]) for _, r in pipeline.iterrows())
    for name in ("late_p90_ms", "spin_caught_frac"):
        assert all(math.isnan(r[name]) for _, r in pipeline.iterrows())


def test_the_pipeline_says_how_many_starts_came_inside_the_hosts_spin() -> None:
    """Per mode: the share of bubble starts inside their host's spin window, the mean of the
    blocks' shares (a block without spins counts for nothing), and how late starts came."""
    import pandas as pd

    from freeride_lab.bench import tables as bt

    spins = ([1.0, 0.0], [1.0, 1.0], [], [1.0, 1.0, 1.0, 0.0], [1.0])
    blocks = pd.DataFrame([
        b for i, spun in enumerate(spins)
        for b in (_block("m4", 2 * i, "vanilla"),
                  _block("m4", 2 * i + 1, "managed", spun=list(spun),
                         late_ms=[0.1 * (k + 1) for k in range(len(spun))]))
    ])  # fmt: skip
    summary = bt.summarize_blocks(blocks, stages=4, microbatches=4, dedicated_per_s={})
    pipeline = bt.pipeline_summary(summary, blocks, stages=4, reference_keys={})
    managed = pipeline[pipeline["mode"] == "managed"].iloc[0]
    assert managed["spin_caught_frac"] == pytest.approx((0.5 + 1.0 + 0.75 + 1.0) / 4)
    assert managed["spin_caught_lo_frac"] < managed["spin_caught_frac"]
    assert 0.1 <= managed["late_p50_ms"] <= managed["late_p90_ms"] <= 0.4


def test_a_step_in_a_bubble_still_open_when_the_block_ends_is_not_late() -> None:
    import pandas as pd

    from freeride_lab.lab.tables import SIDE_TASK_STEP_COLUMNS

    side = pd.DataFrame(
        [["t1", "counting", 0, 0, 1, start, start + 1.0, 1.0, 1.0, "it", 0.0, *[float("nan")] * 5]
         for start in (2.0, 15.0)],  # one step in [1, 8), one in the bubble opened at 14 ms
        columns=list(SIDE_TASK_STEP_COLUMNS),
    )  # fmt: skip
    bubbles = pd.DataFrame(columns=["rank", "step", "start_ms", "end_ms", "duration_ms"])
    edges = [
        {"kind": "bubble_edge", "rank": 0, "step": 0, "slot": slot, "edge": edge, "t_ns": t * 10**6}
        for slot, edge, t in ((1, "start", 1), (1, "end", 8), (2, "start", 14))
    ]  # the second bubble ends after the block's window (20 ms)
    block = {"stage": 0, "first_step": 0, "steps": 1, "mode": "governed", "case": "x",
             "task": "counting", "task_id": "t1", "repeat": 0, "order": 0}  # fmt: skip
    row = bench_results.block_row(block, "m4", {(0, 0): 0, (0, 1): 20 * 10**6}, bubbles, side,
                                  edges, [], 0)  # fmt: skip
    assert row is not None and row["pause_ms"] == [0.0]


def test_a_results_source_digest_tells_apart_the_code_that_measured(tmp_path: Path) -> None:
    def tree(name: str, body: str) -> Path:
        root = tmp_path / name
        (root / "core").mkdir(parents=True)
        (root / "core" / "a.py").write_text(body)
        (root / "notes.txt").write_text(name)  # not source: not in the digest
        return root

    same = bench_results.source_digest(tree("one", "x = 1\n"))
    assert bench_results.source_digest(tree("two", "x = 1\n")) == same
    assert bench_results.source_digest(tree("three", "x = 2\n")) != same
    recorded = bench_results.versions()
    assert len(recorded["freeride_lab_source"]) == 16 and "freeride_lab_commit" in recorded


def test_a_result_records_the_product_settings_its_processes_inherited(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two calls that differ only in, say, the task hosts' spin lead must say so in their
    results: the FREERIDE_ settings of the environment are kept, nothing else of it."""
    monkeypatch.setenv("FREERIDE_SPIN_LEAD_US", "0")
    monkeypatch.setenv("SOME_SECRET_TOKEN", "not for the results")
    environment = bench_results.machine()["environment"]
    assert environment["FREERIDE_SPIN_LEAD_US"] == "0"
    assert all(name.startswith("FREERIDE_") for name in environment)


def test_a_result_records_the_host_cpu_its_latencies_ran_on(tmp_path: Path) -> None:
    """An edge's latency is mostly the task host's own path on the CPU: a result names the
    CPU model, so two calls' latencies are set side by side only on the same one."""
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9454 48-Core"
        " Processor\n\nprocessor\t: 1\nmodel name\t: AMD EPYC 9454 48-Core Processor\n"
    )
    assert bench_results.cpu_model(info) == "AMD EPYC 9454 48-Core Processor"
    info.write_text("processor\t: 0\nHardware\t: BCM2835\n")  # no model name line
    assert bench_results.cpu_model(info) is None
    assert bench_results.cpu_model(tmp_path / "absent") is None
    assert "cpu_model" in bench_results.machine()


# -- a second task on the stage, taking the first one's leftovers ------------------------------


def test_a_block_with_a_leftovers_task_splits_the_stages_bubble_time_over_both_tasks_steps() -> (
    None
):
    """Bubble 0-10 ms: the main task's steps 1-4 and 4.5-7, then the leftovers task's 7.2-8
    and 8-9.5; bubble 12-14 too short for the main task, taken whole by the leftovers task
    (12.3-13.8). Another task's steps on the stage are not the block's."""
    nan = float("nan")
    rows = [("t1", "counting", 1.0, 4.0, 2.0), ("t1", "counting", 4.5, 7.0, 2.0),
            ("t2", "tiles", 7.2, 8.0, 5.0), ("t2", "tiles", 8.0, 9.5, 5.0),
            ("t2", "tiles", 12.3, 13.8, 5.0), ("t9", "other", 20.0, 21.0, 9.0)]  # fmt: skip
    steps = [[task_id, name, 0, 0, 1, a, b, b - a, done, "u-" + name, 0.0, *[nan] * 5]
             for task_id, name, a, b, done in rows]  # fmt: skip
    row = _managed_block_row(
        steps, [(0.0, 10.0), (12.0, 14.0)], [(0.0, 10.0, 9.8), (12.0, 14.0, 13.9)],
        leftovers_task="tiles", leftovers_task_id="t2",
    )  # fmt: skip
    assert row is not None
    assert (row["progress"], row["unit"]) == (4.0, "u-counting")  # the segment's task's
    assert (row["leftovers_task"], row["leftovers_progress"]) == ("tiles", 15.0)
    assert row["leftovers_unit"] == "u-tiles"
    assert row["side_steps"] == 5
    assert row["busy_in_bubble_ms"] == pytest.approx(3.0 + 2.5 + 0.8 + 1.5 + 1.5)
    assert (row["idle_unused_ms"], row["unused_bubbles"]) == (0.0, 0)
    assert row["idle_tail_ms"] == pytest.approx(0.5 + 0.2)
    # the signal latency is the stage's task's; the bubble it left whole is the hand-on's
    assert row["latency_ms"] == [pytest.approx(1.0)]
    assert row["handon_ms"] == [pytest.approx(0.3)]


def _with_leftovers(result: dict[str, Any], progress: float, speed: float) -> None:
    """Give every pagerank segment of ``result`` an image task beside it that did
    ``progress`` units in each managed block, alone at ``speed`` units/s."""
    for run in result["runs"]:
        for seg in run["segments"]:
            seg["leftovers"] = {"task": "image", "task_id": "t2", "unit": "images",
                                "dedicated_before_per_s": speed}  # fmt: skip
    for block in result["blocks"]:
        block["leftovers_task"] = "image"
        block["leftovers_unit"] = "images" if block["mode"] == "managed" else ""
        block["leftovers_progress"] = progress if block["mode"] == "managed" else 0.0


def test_a_stages_harvest_is_both_tasks_work_each_at_its_own_dedicated_speed() -> None:
    """Per managed block of 0.4 s: 400 iterations of pagerank (4,000/s alone) and 20 images
    (500/s alone): 0.1 s + 0.04 s of dedicated work in 0.4 s, harvest 35%, the image task's
    own 10%; its speed is keyed apart from the segment's task's."""
    result = _result(_run("m4", {"dedicated_per_s": 4000.0}, (1.0,) * 5))
    _with_leftovers(result, progress=20.0, speed=500.0)
    bench_results.fill_tables(result, stages=4)
    row = _managed(result, "m4")
    assert row["harvest_frac"] == pytest.approx((400 / 4000 + 20 / 500) / 0.4)
    assert row["leftovers_task"] == "image"
    assert row["leftovers_throughput_per_s"] == pytest.approx(20 / 0.4)
    idle = row["vanilla_idle_frac"]
    assert row["leftovers_harvest_of_measured_idle_frac"] == pytest.approx(20 / 500 / 0.4 / idle)
    assert row["harvest_of_measured_idle_frac"] == pytest.approx(row["harvest_frac"] / idle)
    speeds = {(d["task"], d["dedicated_per_s"]) for d in result["dedicated"]}
    assert speeds == {("pagerank", 4000.0), ("image (leftovers)", 500.0)}
    (pipeline,) = [r for r in result["pipeline"] if r["mode"] == "managed"]
    assert pipeline["harvest_frac"] == pytest.approx(row["harvest_frac"] / 4)


def test_a_stages_harvest_is_unknown_while_its_leftovers_tasks_speed_is() -> None:
    result = _result(_run("m4", {"dedicated_per_s": 4000.0}, (1.0,) * 5))
    _with_leftovers(result, progress=20.0, speed=float("nan"))
    bench_results.fill_tables(result, stages=4)
    assert _managed(result, "m4")["harvest_frac"] is None  # not the main task's alone
