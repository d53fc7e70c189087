"""The benchmark's bookkeeping: order, medians, ratios, bubble use, harvest and cost."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from freeride_lab.bench import stats as bs
from freeride_lab.bench import tables as bt
from freeride_lab.core.accounting import CostModel, bubble_limit, cost_saving, harvest_frac
from freeride_lab.core.intervals import t_quantile


def _block(**kw: object) -> dict[str, object]:
    row: dict[str, object] = {
        "run": "m4", "case": "mix", "stage": 1, "task": "resnet18", "mode": "vanilla",
        "repeat": 0, "order": 0, "first_step": 0, "steps": 4, "step_ms_median": 100.0,
        "wall_s": 0.4, "bubble_ms": 160.0, "progress": 0.0, "unit": "samples",
        "side_steps": 0, "busy_ms": 0.0, "busy_in_bubble_ms": 0.0, "overruns": 0,
        "overrun_ms_total": 0.0, "latency_ms": (), "sm_clock_mhz": math.nan,
        "power_w": math.nan,
    }  # fmt: skip
    row.update(kw)
    return row


def test_interleave_puts_every_mode_once_per_repeat_in_order() -> None:
    assert bs.interleave(["vanilla", "managed", "naive"], 2) == [
        (0, "vanilla"), (0, "managed"), (0, "naive"),
        (1, "vanilla"), (1, "managed"), (1, "naive"),
    ]  # fmt: skip


def test_closed_interleave_ends_with_one_more_reference_block() -> None:
    assert bs.interleave(["vanilla", "naive"], 2, closed=True)[-2:] == [
        (1, "naive"),
        (2, "vanilla"),
    ]


def test_interleave_rejects_an_unknown_mode_naming_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"'greedy'.*vanilla, plain, managed"):
        bs.interleave(["vanilla", "greedy"], 1)


def test_interleave_rejects_zero_repeats() -> None:
    with pytest.raises(ValueError, match="repeats=0"):
        bs.interleave(["vanilla"], 0)


def test_median_ignores_nan_and_is_nan_when_nothing_is_left() -> None:
    assert bs.median([3.0, math.nan, 1.0, 2.0]) == 2.0
    assert math.isnan(bs.median([math.nan]))


def test_step_periods_are_start_to_start_differences_in_ms() -> None:
    assert bs.step_periods_ms([0, 100_000_000, 250_000_000]) == [100.0, 150.0]


def test_step_periods_reject_starts_that_do_not_increase() -> None:
    with pytest.raises(ValueError, match="must increase"):
        bs.step_periods_ms([0, 5, 5])


def test_paired_ratio_divides_by_the_mean_of_the_neighbouring_vanilla_blocks() -> None:
    ratios = bs.paired_ratios(
        [0, 1, 2], ["vanilla", "managed", "vanilla"], [100.0, 105.0, 110.0], "managed"
    )
    assert ratios == [pytest.approx(1.0)]


def test_paired_ratios_cancel_a_linear_drift() -> None:
    order = list(range(6))
    modes = ["vanilla", "managed"] * 3
    drift = [100.0 + 2.0 * i for i in order]  # every block 2 ms slower than the one before
    step_ms = [d * (1.01 if m == "managed" else 1.0) for d, m in zip(drift, modes, strict=True)]
    ratios = bs.paired_ratios(order, modes, step_ms, "managed")
    assert ratios[:2] == [pytest.approx(1.01, abs=1e-9)] * 2


def test_paired_ratio_uses_the_one_neighbour_at_the_end_of_a_run() -> None:
    ratios = bs.paired_ratios([0, 1], ["vanilla", "naive"], [100.0, 150.0], "naive")
    assert ratios == [1.5]


def test_merge_intervals_joins_overlaps_and_drops_empty_ones() -> None:
    assert bs.merge_intervals([(5, 7), (0, 2), (1, 3), (4, 4)]) == [(0.0, 3.0), (5.0, 7.0)]


def test_overlap_counts_only_the_common_time() -> None:
    assert bs.overlap_ms([(0, 10), (20, 30)], [(5, 25)]) == 10.0


def test_bubble_use_is_busy_time_inside_bubbles_over_bubble_time() -> None:
    bubbles = [(0.0, 40.0), (100.0, 140.0)]
    busy = [(10.0, 30.0), (30.0, 110.0)]  # 30 ms inside the first bubble, 10 in the second
    assert bs.bubble_use_frac(bubbles, busy) == pytest.approx(40.0 / 80.0)


def test_bubble_use_is_nan_without_bubble_time() -> None:
    assert math.isnan(bs.bubble_use_frac([], [(0.0, 1.0)]))


def test_signal_latency_is_bubble_start_to_first_step_start_inside_it() -> None:
    ms = 1_000_000
    latency = bs.signal_latency_ms([0, 100 * ms], [50 * ms, 150 * ms], [2 * ms, 10 * ms, 101 * ms])
    assert latency == [2.0, 1.0]


def test_signal_latency_leaves_out_bubbles_no_step_started_in() -> None:
    ms = 1_000_000
    assert bs.signal_latency_ms([0, 100 * ms], [50 * ms, 150 * ms], [60 * ms]) == []


def test_pause_latency_is_bubble_end_to_the_last_step_that_still_started_after_it() -> None:
    ms = 1_000_000
    bubbles = ([0, 100 * ms, 200 * ms], [50 * ms, 150 * ms, 250 * ms])
    # bubble 1: steps at 2 and 10, then two late starts at 51 and 53 (before bubble 2 opens);
    # bubble 2: one step inside, none late; bubble 3: no step at all (not used)
    steps = [2 * ms, 10 * ms, 51 * ms, 53 * ms, 101 * ms]
    assert bs.pause_latency_ms(*bubbles, steps) == [3.0, 0.0]


def test_a_step_in_the_next_bubble_is_not_late_for_the_one_before() -> None:
    ms = 1_000_000
    assert bs.pause_latency_ms([0, 100 * ms], [50 * ms, 150 * ms], [1 * ms, 100 * ms]) == [0.0, 0.0]


def test_dedicated_throughput_skips_the_warm_up_steps() -> None:
    speed = bs.dedicated_throughput_per_s([64, 64, 64, 64], [500.0, 200.0, 16.0, 16.0], skip=2)
    assert speed == pytest.approx(128 / 0.032)


def test_dedicated_throughput_of_a_banded_task_counts_whole_cycles_only() -> None:
    # four 10 ms bands an image: 25 images/s, though the window ends three bands into one
    progress = [0, 0] + [0, 0, 0, 1] * 2 + [0, 0, 0]
    speed = bs.dedicated_throughput_per_s(progress, [10.0] * len(progress), skip=2)
    assert speed == pytest.approx(25.0)


def test_pipeline_cost_equals_accountings_cost_saving_of_a_whole_run() -> None:
    model = CostModel()
    t_v, t_f = 540.0, 545.0
    progress = {"resnet18": 217_152.0, "vgg19": 64_448.0}
    rates = {k: v / t_f for k, v in progress.items()}
    direct = cost_saving(progress, vanilla_s=t_v, freeride_s=t_f, model=model)
    via_rates = bs.pipeline_cost(rates, overhead_frac=t_f / t_v - 1, model=model)
    for name in ("overhead_frac", "reference_gpus", "saving_published_frac",
                 "saving_corrected_frac", "hourly_cost"):  # fmt: skip
        assert getattr(via_rates, name) == pytest.approx(getattr(direct, name), rel=1e-12)


def test_pipeline_cost_corrected_saving_is_published_minus_overhead() -> None:
    s = bs.pipeline_cost({"sgd": 6.5}, overhead_frac=0.0116)
    assert s.saving_corrected_frac == pytest.approx(s.saving_published_frac - 0.0116)


def test_pipeline_cost_names_a_task_without_reference_throughput() -> None:
    with pytest.raises(KeyError, match="'toy'"):
        bs.pipeline_cost({"toy": 1.0}, overhead_frac=0.0)


def test_summary_overhead_comes_from_paired_block_ratios() -> None:
    blocks = pd.DataFrame(
        [
            _block(order=0, mode="vanilla", step_ms_median=100.0),
            _block(order=1, mode="managed", step_ms_median=102.0, progress=640.0),
            _block(order=2, mode="vanilla", step_ms_median=104.0),
            _block(order=3, mode="managed", step_ms_median=106.0, progress=640.0),
            _block(order=4, mode="vanilla", step_ms_median=108.0),
        ]
    )
    out = bt.summarize_blocks(blocks, stages=4, microbatches=4, dedicated_per_s={})
    managed = out[out["mode"] == "managed"].iloc[0]
    assert managed["overhead_frac"] == pytest.approx(0.0)
    assert managed["throughput_per_s"] == pytest.approx(1280.0 / 0.8)
    assert list(out.columns) == list(bt.SUMMARY_COLUMNS)


def test_summary_harvest_values_work_at_the_dedicated_speed_against_the_bubble_limit() -> None:
    blocks = pd.DataFrame(
        [
            _block(order=0, mode="vanilla"),
            _block(
                order=1,
                mode="managed",
                progress=1000.0,
                wall_s=2.0,
                busy_in_bubble_ms=300.0,
                bubble_ms=400.0,
            ),
        ]
    )
    speeds = {("m4", "mix", 1, "resnet18"): 2000.0}
    out = bt.summarize_blocks(blocks, stages=4, microbatches=4, dedicated_per_s=speeds)
    row = out[out["mode"] == "managed"].iloc[0]
    assert row["harvest_frac"] == pytest.approx(harvest_frac({"r": 1000.0}, {"r": 2000.0}, 2.0))
    assert row["harvest_of_theory_limit_frac"] == pytest.approx(0.25 / bubble_limit(4, 4))
    assert row["bubble_used_frac"] == pytest.approx(0.75)


def test_summary_reports_the_speed_of_the_steps_against_the_task_alone() -> None:
    """1000 units in 625 ms of steps is 1600/s, 80% of the task alone (2000/s): time under
    steps that a finer step fills is worth less when its steps run slower; no dedicated speed
    or no step time leaves it unknown."""
    managed = _block(order=1, mode="managed", progress=1000.0, busy_ms=625.0)
    blocks = pd.DataFrame([_block(order=0, mode="vanilla"), managed])
    speeds = {("m4", "mix", 1, "resnet18"): 2000.0}
    out = bt.summarize_blocks(blocks, stages=4, microbatches=4, dedicated_per_s=speeds)
    assert out[out["mode"] == "managed"].iloc[0]["step_speed_of_solo_frac"] == pytest.approx(0.8)
    assert math.isnan(out[out["mode"] == "vanilla"].iloc[0]["step_speed_of_solo_frac"])
    unknown = bt.summarize_blocks(blocks, stages=4, microbatches=4, dedicated_per_s={})
    assert unknown["step_speed_of_solo_frac"].isna().all()


def test_summary_reports_the_p99_step_inflation_a_mean_hides_and_energy_per_unit() -> None:
    """Managed blocks whose median step is vanilla's but whose slowest step in 20 is 10% slow:
    the overhead of the medians is 0, the p99 inflation is not."""
    vanilla = [100.0] * 20
    managed = [100.0] * 19 + [110.0]
    rows = []
    for i in range(6):
        rows.append(_block(order=2 * i, mode="vanilla", step_ms=vanilla, power_w=400.0,
                           wall_s=2.0))  # fmt: skip
        rows.append(_block(order=2 * i + 1, mode="managed", step_ms=managed, power_w=450.0,
                           wall_s=2.0, progress=100.0))  # fmt: skip
    out = bt.summarize_blocks(pd.DataFrame(rows), stages=4, microbatches=4, dedicated_per_s={})
    row = out[out["mode"] == "managed"].iloc[0]
    assert row["overhead_frac"] == pytest.approx(0.0)
    assert row["step_p99_inflation_frac"] == pytest.approx(0.1)  # 6 slow steps in 120
    assert row["step_p99_inflation_lo_frac"] <= row["step_p99_inflation_frac"]
    assert row["step_p99_inflation_hi_frac"] == pytest.approx(0.1, abs=1e-9)
    # 50 W above vanilla over 12 s of managed blocks, 600 units of work: 1 J per unit
    assert row["extra_energy_j_per_unit"] == pytest.approx(1.0)
    van = out[out["mode"] == "vanilla"].iloc[0]
    assert van["step_p99_inflation_frac"] == pytest.approx(0.0)


def test_summary_rejects_blocks_without_the_documented_columns() -> None:
    with pytest.raises(ValueError, match="lack column"):
        bt.summarize_blocks(
            pd.DataFrame({"run": ["x"]}), stages=2, microbatches=4, dedicated_per_s={}
        )


def test_pipeline_row_sums_rates_over_stages_and_adds_overheads_for_the_corrected_saving() -> None:
    rows = []
    for stage, task, slow in ((0, "pagerank", 1.01), (1, "resnet18", 1.02)):
        rows += [
            _block(order=0, stage=stage, task=task, mode="vanilla", step_ms_median=100.0),
            _block(
                order=1,
                stage=stage,
                task=task,
                mode="managed",
                step_ms_median=100.0 * slow,
                progress=100.0,
                wall_s=1.0,
            ),
        ]
    blocks = pd.DataFrame(rows)
    speeds = {("m4", "mix", 0, "pagerank"): 400.0, ("m4", "mix", 1, "resnet18"): 400.0}
    summary = bt.summarize_blocks(blocks, stages=4, microbatches=4, dedicated_per_s=speeds)
    keys = {"pagerank": "pagerank", "resnet18": "resnet18"}
    pipe = bt.pipeline_summary(summary, blocks, stages=4, reference_keys=keys)
    row = pipe[pipe["mode"] == "managed"].iloc[0]
    expected = bs.pipeline_cost({"pagerank": 100.0, "resnet18": 100.0}, overhead_frac=0.03)
    assert row["overhead_all_stages_estimate_frac"] == pytest.approx(0.03)
    assert row["overhead_one_stage_mean_frac"] == pytest.approx(0.015)
    assert row["saving_corrected_frac"] == pytest.approx(expected.saving_corrected_frac)
    assert row["harvest_frac"] == pytest.approx((0.25 + 0.25) / 4)  # two of four GPUs harvest
    assert row["stages_covered"] == 2


# -- each segment at its own speed; intervals ------------------------------------------------


def _segment(
    run: str, *, stage: int = 0, task: str = "pagerank", **managed: object
) -> list[dict[str, object]]:
    """vanilla, managed, vanilla, managed, vanilla blocks of one segment."""
    rows = []
    for order in range(5):
        mode = "managed" if order % 2 else "vanilla"
        extra = managed if mode == "managed" else {}
        rows.append(_block(run=run, stage=stage, task=task, order=order, mode=mode, **extra))
    return rows


def test_summary_values_each_segment_at_its_own_dedicated_speed() -> None:
    blocks = pd.DataFrame(
        _segment("m4-timeslice", progress=400.0, wall_s=1.0)
        + _segment("m4-mps", progress=400.0, wall_s=1.0)
    )
    speeds = {
        ("m4-timeslice", "mix", 0, "pagerank"): 4000.0,
        ("m4-mps", "mix", 0, "pagerank"): 8000.0,
    }
    out = bt.summarize_blocks(blocks, stages=4, microbatches=4, dedicated_per_s=speeds)
    managed = out[out["mode"] == "managed"].set_index("run")
    assert managed.loc["m4-timeslice", "harvest_frac"] == pytest.approx(0.1)
    assert managed.loc["m4-mps", "harvest_frac"] == pytest.approx(0.05)
    assert managed.loc["m4-mps", "dedicated_per_s"] == 8000.0


def test_overhead_is_the_mean_paired_difference_with_a_t_interval() -> None:
    steps = [100.0, 101.0, 100.0, 103.0, 100.0]  # managed blocks 1% and 3% slower
    blocks = pd.DataFrame(
        [_block(order=i, mode="managed" if i % 2 else "vanilla", step_ms_median=v)
         for i, v in enumerate(steps)]
    )  # fmt: skip
    row = bt.summarize_blocks(blocks, stages=4, microbatches=4, dedicated_per_s={})
    row = row[row["mode"] == "managed"].iloc[0]
    assert row["overhead_frac"] == pytest.approx(0.02)
    assert row["overhead_lo_frac"] < 0.02 < row["overhead_hi_frac"]
    assert row["blocks"] == 2 and row["overhead_df"] == 1


def test_overhead_interval_keeps_95_percent_coverage_though_differences_share_vanilla_blocks() -> (
    None
):
    # equally noisy blocks, a true overhead of 1%: the design-corrected interval covers it 95%
    # of the time; treating the paired differences as independent covers it less often
    from freeride_lab.core.intervals import mean_interval

    rng = np.random.default_rng(7)
    modes = ["vanilla", "managed"] * 5 + ["vanilla"]
    order = list(range(len(modes)))
    corrected = independent = 0
    trials = 3000
    for _ in range(trials):
        noise = 1 + rng.normal(0, 0.01, len(modes))
        step = [
            100 * n * (1.01 if m == "managed" else 1) for n, m in zip(noise, modes, strict=True)
        ]
        iv = bs.overhead_interval(order, modes, step, "managed")
        corrected += iv.lo <= 0.01 <= iv.hi
        plain = mean_interval([r - 1 for r in bs.paired_ratios(order, modes, step, "managed")])
        independent += plain.lo <= 0.01 <= plain.hi
    assert 0.935 <= corrected / trials <= 0.965
    assert independent / trials < corrected / trials - 0.015


def test_all_stage_estimate_sums_per_stage_overheads_and_adds_their_variances() -> None:
    rows = []
    for stage, task, slow in ((0, "pagerank", (1.01, 1.03)), (1, "resnet18", (1.02, 1.02))):
        for order, (mode, factor) in enumerate(
            [("vanilla", 1.0), ("managed", slow[0]), ("vanilla", 1.0), ("managed", slow[1]),
             ("vanilla", 1.0)]
        ):  # fmt: skip
            rows.append(
                _block(stage=stage, task=task, order=order, mode=mode, step_ms_median=100 * factor)
            )
    blocks = pd.DataFrame(rows)
    summary = bt.summarize_blocks(blocks, stages=4, microbatches=4, dedicated_per_s={})
    pipe = bt.pipeline_summary(summary, blocks, stages=4, reference_keys={})
    row = pipe[pipe["mode"] == "managed"].iloc[0]
    stages = summary[summary["mode"] == "managed"]
    assert row["overhead_all_stages_estimate_frac"] == pytest.approx(0.02 + 0.02)
    assert row["overhead_one_stage_mean_frac"] == pytest.approx(0.02)
    se = math.sqrt(sum(stages["overhead_se_frac"] ** 2))
    half = row["overhead_all_stages_estimate_hi_frac"] - row["overhead_all_stages_estimate_frac"]
    # one stage has no spread, so the sum has the other's: its t quantile with its df
    assert se == pytest.approx(float(stages["overhead_se_frac"].max()))
    assert half == pytest.approx(t_quantile(0.975, 1) * se)
    assert (row["worst_stage"], row["worst_task"]) == (0, "pagerank")


def test_harvest_is_divided_by_the_theory_limit_and_by_the_measured_idle_share() -> None:
    blocks = pd.DataFrame(
        _segment("m4", progress=1000.0, wall_s=1.0, bubble_ms=300.0)
    )  # vanilla blocks: 160 ms idle in 0.4 s, 40% measured idle
    speeds = {("m4", "mix", 0, "pagerank"): 4000.0}
    summary = bt.summarize_blocks(blocks, stages=4, microbatches=4, dedicated_per_s=speeds)
    row = summary[summary["mode"] == "managed"].iloc[0]
    assert row["harvest_frac"] == pytest.approx(0.25)
    assert row["vanilla_idle_frac"] == pytest.approx(0.4)
    assert row["harvest_of_theory_limit_frac"] == pytest.approx(0.25 / (3 / 7))
    assert row["harvest_of_measured_idle_frac"] == pytest.approx(0.25 / 0.4)
    pipe = bt.pipeline_summary(summary, blocks, stages=1, reference_keys={})
    assert pipe.iloc[0]["harvest_of_measured_idle_frac"] == pytest.approx(0.25 / 0.4)
    assert pipe.iloc[0]["idle_frac"] == pytest.approx(0.4)


def test_corrected_saving_subtracts_the_all_stage_estimate_and_carries_an_interval() -> None:
    rows = []
    for stage, task in ((0, "pagerank"), (1, "resnet18")):
        for order, (mode, factor, done) in enumerate(
            [("vanilla", 1.0, 0.0), ("managed", 1.01, 120.0), ("vanilla", 1.0, 0.0),
             ("managed", 1.02, 130.0), ("vanilla", 1.0, 0.0), ("managed", 1.015, 125.0),
             ("vanilla", 1.0, 0.0)]
        ):  # fmt: skip
            rows.append(
                _block(stage=stage, task=task, order=order, mode=mode,
                       step_ms_median=100 * factor, progress=done, wall_s=1.0)
            )  # fmt: skip
    blocks = pd.DataFrame(rows)
    summary = bt.summarize_blocks(blocks, stages=4, microbatches=4, dedicated_per_s={})
    keys = {"pagerank": "pagerank", "resnet18": "resnet18"}
    row = bt.pipeline_summary(summary, blocks, stages=4, reference_keys=keys).iloc[0]
    assert row["mode"] == "managed"
    over = row["overhead_all_stages_estimate_frac"]
    assert row["saving_corrected_frac"] == pytest.approx(row["saving_published_frac"] - over)
    expected = bs.pipeline_cost({"pagerank": 125.0, "resnet18": 125.0}, overhead_frac=over)
    assert row["saving_published_frac"] == pytest.approx(expected.saving_published_frac)
    assert row["saving_corrected_lo_frac"] < row["saving_corrected_frac"]
    assert row["saving_corrected_hi_frac"] > row["saving_corrected_frac"]
