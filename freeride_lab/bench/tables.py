"""The tables of ``freeride-lab bench``: per stage and per pipeline, every figure with its 95%
interval over blocks. Pure functions over the blocks table ``bench/driver.py`` builds
(``bench.stats.BLOCK_COLUMNS``); the per-block arithmetic is in ``bench.stats``, the
intervals in ``core.intervals``.

    summary = summarize_blocks(blocks, stages=4, microbatches=4, dedicated_per_s=speeds)
    pipeline = pipeline_summary(summary, blocks, stages=4, reference_keys=REFERENCE_KEYS)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import pandas as pd

from freeride_lab.bench.stats import (
    BLOCK_COLUMNS,
    IDLE_SPLIT_COLUMNS,
    LEFTOVERS_COLUMNS,
    MODES,
    REFERENCE_MODE,
    SegmentKey,
    leftovers_key,
    median,
    overhead_interval,
    paired_ratios,
    percentile,
    pipeline_cost,
)
from freeride_lab.core.accounting import CostModel, bubble_limit
from freeride_lab.core.intervals import (
    Interval,
    bootstrap_percentile_interval,
    bootstrap_percentile_ratio_interval,
    mean_interval,
    quotient_interval,
    ratio_interval,
    sum_interval,
)

__all__ = [
    "PIPELINE_COLUMNS",
    "SUMMARY_COLUMNS",
    "interval_columns",
    "interval_of",
    "pipeline_harvest",
    "pipeline_summary",
    "summarize_blocks",
    "with_interval",
]


def with_interval(name: str, unit: str) -> tuple[str, ...]:
    """``name_unit`` and its 95% bounds ``name_lo_unit``, ``name_hi_unit``."""
    return (f"{name}_{unit}", f"{name}_lo_{unit}", f"{name}_hi_{unit}")


#: Columns of ``summarize_blocks``, in order. Every ``x_lo_*`` / ``x_hi_*`` pair is the 95%
#: interval of ``x_*`` over the mode's blocks (``core.intervals``); ``x_se_*`` and ``x_df`` are
#: what a sum over stages needs.
SUMMARY_COLUMNS: tuple[str, ...] = (
    "run",
    "case",
    "stage",
    "task",
    "mode",
    "blocks",
    "step_ms_median",
    "ratio_vs_vanilla",  # 1 + overhead_frac
    # the mean of the per-block paired differences (see [Note: paired ratios]), one stage
    # harvesting at a time
    *with_interval("overhead", "frac"),
    "overhead_se_frac",
    "overhead_df",
    "overhead_median_frac",  # median of the paired ratios - 1 (the estimate before intervals)
    "overhead_min_frac",
    "overhead_max_frac",
    "progress",
    "unit",
    "throughput_per_s",  # progress ÷ wall time of the mode's blocks
    "throughput_se_per_s",
    "throughput_df",
    "bubble_used_frac",  # side-task busy time inside bubbles ÷ bubble time
    # the task's speed while its steps ran (progress ÷ busy time) ÷ its dedicated speed: what
    # its steps in these blocks (their sizes, their company) made of the time under them
    "step_speed_of_solo_frac",
    # the rest of the bubble time, by where it went (core.idle_use), each ÷ bubble time:
    # before a bubble's first step, between its steps, after its last, in bubbles left unused
    "idle_lead_frac",
    "idle_between_frac",
    "idle_tail_frac",
    "idle_unused_frac",
    # of the unused: bubbles a step as short as the task's shortest would have fitted, of
    # those the ones the rank never announced, the announced ones predicted too short for
    # that step, of the rest those predicted within the guard, and of the rest again those a
    # checkpoint held the host across (core.idle_use)
    "idle_unused_fit_frac",
    "idle_unused_silent_frac",
    "idle_unused_short_frac",
    "idle_unused_guard_frac",
    "idle_unused_held_frac",
    # of the time after the last step, the part past the bubble's predicted end (core.idle_use)
    "idle_tail_unpromised_frac",
    "unused_bubbles_frac",  # bubbles no step ran in ÷ bubbles
    "idle_frac",  # the real rank's *measured* bubble time ÷ wall time in these blocks
    # the same in the segment's vanilla blocks: the idle time training leaves, measured
    "vanilla_idle_frac",
    "vanilla_idle_se_frac",
    "vanilla_idle_df",
    "dedicated_per_s",  # this segment's own dedicated speed (its solo phases)
    # the task beside it that took its leftovers ("" for none: bench.stats.LEFTOVERS_COLUMNS),
    # its work, speed and dedicated speed, and its own share of the stage's harvest; where it
    # ran, harvest and the idle split above are the stage's, both tasks' together
    "leftovers_task",
    "leftovers_unit",
    "leftovers_progress",
    "leftovers_throughput_per_s",
    "leftovers_throughput_se_per_s",
    "leftovers_throughput_df",
    "leftovers_dedicated_per_s",
    *with_interval("leftovers_harvest_of_measured_idle", "frac"),
    *with_interval("harvest", "frac"),  # work at that speed ÷ wall time
    "harvest_se_frac",
    "harvest_df",
    "bubble_limit_frac",  # theory: (S-1)/(M+S-1)
    *with_interval("harvest_of_theory_limit", "frac"),  # harvest ÷ bubble_limit_frac
    *with_interval("harvest_of_measured_idle", "frac"),  # harvest ÷ vanilla_idle_frac
    "overruns",  # side-task steps that started in the blocks and overran (core.budget)
    "side_steps",
    "latency_p50_ms",
    "latency_p99_ms",
    "wake_p50_ms",  # latency's first hop: bubble start edge → the task's host saw it (pooled)
    "announce_p50_ms",  # the hop before: the device at the bubble's start → its edge (pooled)
    "pause_p99_ms",  # bubble end → the last side-task step started after it (pooled)
    # with a leftovers task: bubble start → its first step, in bubbles the stage's task left
    # whole (pooled); latency and wake are then the stage's task's own
    "handon_p50_ms",
    "handon_p99_ms",
    # the 99th percentile of the mode's step times against the vanilla blocks' (pooled; block
    # bootstrap interval): the tail a training job feels, which a mean hides
    *with_interval("step_p99_inflation", "frac"),
    "sm_clock_mhz",
    "power_w",
    # board energy above the vanilla blocks' per unit of side work: (median power - vanilla's
    # median power) x wall time / progress; NaN without progress or power samples
    "extra_energy_j_per_unit",
)

#: Columns of ``pipeline_summary``, in order (intervals as in ``SUMMARY_COLUMNS``).
PIPELINE_COLUMNS: tuple[str, ...] = (
    "run",
    "case",
    "mode",
    "stages_covered",
    "tasks",  # "stage:task" pairs, comma-separated
    "blocks_min",  # fewest blocks behind any stage's figures
    # every stage harvesting at once, *estimated* from one-stage-at-a-time runs: the sum of
    # the per-stage slowdowns (their variances add); the figure comparable to FreeRide's
    *with_interval("overhead_all_stages_estimate", "frac"),
    # one stage harvesting at a time: the mean over stages (not comparable to FreeRide's)
    *with_interval("overhead_one_stage_mean", "frac"),
    *with_interval("overhead_one_stage_worst", "frac"),  # the stage with the highest estimate
    "worst_stage",
    "worst_task",
    *with_interval("harvest", "frac"),  # mean over the S stages (uncovered ones count 0)
    "bubble_limit_frac",
    *with_interval("harvest_of_theory_limit", "frac"),
    "idle_frac",  # measured in the vanilla blocks, mean over the covered stages
    *with_interval("harvest_of_measured_idle", "frac"),
    "reference_gpus",  # FreeRide's x: RTX 3080s' worth of work
    *with_interval("saving_published", "frac"),
    # published - overhead_all_stages_estimate_frac
    *with_interval("saving_corrected", "frac"),
    *with_interval("latency_p50", "ms"),  # pooled over blocks; block bootstrap interval
    *with_interval("latency_p99", "ms"),
    # latency's first hop (bubble start → the task's host saw it); the rest is the host's path
    # to its step. As latency; NaN in results that did not record when hosts saw edges
    *with_interval("wake_p50", "ms"),
    *with_interval("wake_p99", "ms"),
    # the hop before the edge: the device reaching a bubble's start → the rank announcing it
    # (``stats.announce_lag_ms``); NaN in results that did not record it
    *with_interval("announce_p50", "ms"),
    *with_interval("announce_p99", "ms"),
    *with_interval("pause_p99", "ms"),  # as latency; NaN in results that did not time pauses
    # why edge → host takes what it does (``stats.spin_catches``): a bubble's start against the
    # start its host expected (as latency), and the share of starts that came inside the
    # host's spin window (mean of the blocks' shares, t-interval; GPU runs: hosts spin there
    # only). NaN in results that did not record them
    *with_interval("late_p50", "ms"),
    *with_interval("late_p90", "ms"),
    *with_interval("spin_caught", "frac"),
)


#: Block columns that results recorded before them lack (``_with_later_columns`` fills them).
_LISTS_LATER: tuple[str, ...] = (
    "pause_ms", "wake_ms", "announce_ms", "late_ms", "spun", "handon_ms",
)  # fmt: skip
_LATER_COLUMNS: tuple[str, ...] = (*IDLE_SPLIT_COLUMNS, *_LISTS_LATER, *LEFTOVERS_COLUMNS)


def _with_later_columns(blocks: pd.DataFrame) -> pd.DataFrame:
    """``blocks`` with what older results did not record read as not measured: NaN for the
    idle split, no pauses or wake-ups (an empty tuple) where a block has no list of them."""
    blocks = blocks.assign(**{c: math.nan for c in IDLE_SPLIT_COLUMNS if c not in blocks.columns})
    defaults: tuple[str | float, ...] = ("", 0.0, "")  # no task took leftovers
    blocks = blocks.assign(
        **{c: _column(blocks, c, d) for c, d in zip(LEFTOVERS_COLUMNS, defaults, strict=True)}
    )
    lists = {}
    for name in _LISTS_LATER:
        given = blocks[name] if name in blocks.columns else [None] * len(blocks)
        lists[name] = [tuple(x) if isinstance(x, list | tuple) else () for x in given]
    return blocks.assign(**lists)


def _column(blocks: pd.DataFrame, name: str, default: str | float) -> list[str | float]:
    """``blocks[name]`` with ``default`` where it is missing (NaN, None, or no column)."""
    given = blocks[name] if name in blocks.columns else [None] * len(blocks)
    return [default if x is None or (isinstance(x, float) and math.isnan(x)) else x for x in given]


def summarize_blocks(
    blocks: pd.DataFrame,
    *,
    stages: int,
    microbatches: int | Mapping[str, int],
    dedicated_per_s: Mapping[SegmentKey, float],
    limits: Mapping[str, float] | None = None,
) -> pd.DataFrame:
    """One row per (run, case, stage, task, mode): estimates and 95% intervals over its blocks.

    Args:
        blocks: rows with ``BLOCK_COLUMNS``.
        stages: S; microbatches: M, or M per run name (for the bubble limit).
        limits: the theory idle share per run name, for a run of another schedule than 1F1B
            (``core.theory.theory_bubble_fraction``); a run not in it has 1F1B's.
        dedicated_per_s: the dedicated speed of each segment, keyed (run, case, stage, task):
            the task alone on the device in *that* segment's solo phases. Never one speed
            pooled over runs: the same task's solo speed differs from run to run.

    Returns:
        ``SUMMARY_COLUMNS``. The overhead is the mean of the paired differences within
        (run, case, stage, task) with its t-interval ([Note: paired ratios]); throughput,
        idle time and harvest are ratios of sums over the blocks (= ``accounting.harvest_frac``
        over them) with the ratio estimator's t-interval. Harvest is NaN where the segment's
        dedicated speed is unknown; it is divided both by the theory limit and by the idle
        share of the segment's vanilla blocks (the measured limit; intervals by the delta
        method, the two come from different blocks).
    """
    missing = [c for c in BLOCK_COLUMNS if c not in blocks.columns and c not in _LATER_COLUMNS]
    if missing:
        raise ValueError(f"blocks lack column(s) {missing}; expected {', '.join(BLOCK_COLUMNS)}")
    blocks = _with_later_columns(blocks)
    rows: list[dict[str, object]] = []
    keys = ["run", "case", "stage", "task"]
    for key, seg in blocks.groupby(keys, sort=False):
        run, case, stage, task = str(key[0]), str(key[1]), int(key[2]), str(key[3])
        m = microbatches if isinstance(microbatches, int) else microbatches[run]
        limit = (limits or {}).get(run, bubble_limit(stages, m))
        theta = float(dedicated_per_s.get((run, case, stage, task), math.nan)) if task else math.nan
        rest = next((str(x) for x in seg["leftovers_task"] if x), "")
        theta_rest = (
            float(dedicated_per_s.get((run, case, stage, leftovers_key(rest)), math.nan))
            if rest
            else math.nan
        )
        order, modes, step_ms = list(seg["order"]), list(seg["mode"]), list(seg["step_ms_median"])
        ref = seg[seg["mode"] == REFERENCE_MODE]
        ref_steps = _step_groups(ref)
        ref_power = median(ref["power_w"]) if len(ref) else math.nan
        vanilla_idle = ratio_interval(
            ref["bubble_ms"].to_numpy(dtype=float) / 1e3, ref["wall_s"].to_numpy(dtype=float)
        )
        for mode in [x for x in MODES if x in set(seg["mode"])]:
            b = seg[seg["mode"] == mode]
            if mode == REFERENCE_MODE:
                ratios = [1.0] * len(b)
                over = Interval(0.0, 0.0, 0.0, 0.0, math.nan, len(b))
            else:
                ratios = paired_ratios(order, modes, step_ms, mode)
                over = overhead_interval(order, modes, step_ms, mode)
            wall = b["wall_s"].to_numpy(dtype=float)
            done = b["progress"].to_numpy(dtype=float)
            bubble_s = b["bubble_ms"].to_numpy(dtype=float) / 1e3
            progress = float(done.sum())
            throughput = ratio_interval(done, wall)
            idle = ratio_interval(bubble_s, wall)  # of these blocks, for the tables
            done_rest = b["leftovers_progress"].to_numpy(dtype=float)
            rest_harvest = Interval.point(math.nan, len(b))
            if rest and theta_rest > 0:
                rest_harvest = ratio_interval(done_rest / theta_rest, wall)
            if rest and not theta_rest > 0:  # the stage's work cannot be valued whole
                harvest = Interval.point(math.nan, len(b))
            elif task and theta > 0:
                work_s = done / theta + (done_rest / theta_rest if rest else 0.0)
                harvest = ratio_interval(work_s, wall)
            elif not task or progress == 0:
                harvest = Interval(0.0, 0.0, 0.0, 0.0, math.nan, len(b))
            else:
                harvest = Interval.point(math.nan, len(b))
            bubble_ms = float(b["bubble_ms"].sum())
            latencies = [x for t in b["latency_ms"] for x in t]
            power = median(b["power_w"])
            extra_j = (power - ref_power) * float(wall.sum()) / progress if progress else math.nan
            rows.append(
                {
                    "run": run,
                    "case": case,
                    "stage": stage,
                    "task": task,
                    "mode": mode,
                    "blocks": len(b),
                    "step_ms_median": median(b["step_ms_median"]),
                    "ratio_vs_vanilla": 1.0 + over.value,
                    **interval_columns("overhead", "frac", over, spread=True),
                    "overhead_median_frac": median(ratios) - 1.0,
                    "overhead_min_frac": min(ratios) - 1.0 if ratios else math.nan,
                    "overhead_max_frac": max(ratios) - 1.0 if ratios else math.nan,
                    "progress": progress,
                    "unit": next((str(u) for u in seg["unit"] if u), ""),
                    "throughput_per_s": throughput.value,
                    "throughput_se_per_s": throughput.se,
                    "throughput_df": throughput.df,
                    "bubble_used_frac": (
                        float(b["busy_in_bubble_ms"].sum()) / bubble_ms
                        if bubble_ms > 0
                        else math.nan
                    ),
                    "step_speed_of_solo_frac": step_speed_of_solo(b, theta, theta_rest),
                    **_idle_parts(b, bubble_ms),
                    "idle_frac": idle.value,
                    "vanilla_idle_frac": vanilla_idle.value,
                    "vanilla_idle_se_frac": vanilla_idle.se,
                    "vanilla_idle_df": vanilla_idle.df,
                    "dedicated_per_s": theta,
                    **_leftovers_columns(b, rest, theta_rest, rest_harvest, vanilla_idle),
                    **interval_columns("harvest", "frac", harvest, spread=True),
                    "bubble_limit_frac": limit,
                    **interval_columns(
                        "harvest_of_theory_limit", "frac", _per_limit(harvest, limit)
                    ),
                    **interval_columns(
                        "harvest_of_measured_idle", "frac", quotient_interval(harvest, vanilla_idle)
                    ),
                    "overruns": int(b["overruns"].sum()),
                    "side_steps": int(b["side_steps"].sum()),
                    "latency_p50_ms": percentile(latencies, 50),
                    "latency_p99_ms": percentile(latencies, 99),
                    "wake_p50_ms": percentile((x for t in b["wake_ms"] for x in t), 50),
                    "announce_p50_ms": percentile((x for t in b["announce_ms"] for x in t), 50),
                    "pause_p99_ms": percentile((x for t in b["pause_ms"] for x in t), 99),
                    "handon_p50_ms": percentile((x for t in b["handon_ms"] for x in t), 50),
                    "handon_p99_ms": percentile((x for t in b["handon_ms"] for x in t), 99),
                    **interval_columns(
                        "step_p99_inflation",
                        "frac",
                        bootstrap_percentile_ratio_interval(_step_groups(b), ref_steps, 99),
                    ),
                    "sm_clock_mhz": median(b["sm_clock_mhz"]),
                    "power_w": power,
                    "extra_energy_j_per_unit": extra_j,
                }
            )
    return pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))


def pipeline_summary(
    summary: pd.DataFrame,
    blocks: pd.DataFrame,
    *,
    stages: int,
    reference_keys: Mapping[str, str],
    model: CostModel | None = None,
) -> pd.DataFrame:
    """One row per (run, case, mode) over the stages its case covered: FreeRide's table row.

    Rows without a side task (timed-vs-plain instrumentation blocks) are left out. The
    harness has one real stage at a time, so the overhead comes two ways, named apart:

    - ``overhead_one_stage_mean`` / ``_worst``: one stage harvesting, the others not (what
      was measured); their mean is *not* comparable to FreeRide's figures;
    - ``overhead_all_stages_estimate``: every stage harvesting at once, as FreeRide measures,
      estimated as the sum of the per-stage slowdowns (a delay on any stage delays the step);
      the stages' runs are independent, so their variances add ([Note: sums of intervals]).

    Harvest is the mean over the S stages (each stage is one GPU; stages not covered count
    as not harvesting, ``stages_covered`` says how many were), divided both by the theory
    limit and by the idle share measured in the same segments' vanilla blocks (what training
    leaves idle here: more than theory, as the emulated step adds the optimizer and
    hand-offs). Cost sums each stage's
    side-task rate per FreeRide reference key; the corrected saving subtracts the all-stage
    overhead estimate. Saving intervals add the rates' and the overhead's variances (the two
    rise together, so that overstates the spread rather than understating it). Latency
    percentiles pool the blocks' values; their interval resamples whole blocks.

    Args:
        summary: ``summarize_blocks`` output; blocks: its input (for pooled latencies).
        reference_keys: task name → FreeRide reference key (``freeride_lab.tasks.REFERENCE_KEYS``).
    """
    model = model or CostModel()
    rows: list[dict[str, object]] = []
    work = summary[(summary["mode"] != REFERENCE_MODE) & (summary["task"] != "")]
    for (run, case, mode), g in work.groupby(["run", "case", "mode"], sort=False):
        over_rows = [r for _, r in g.iterrows() if math.isfinite(float(r["overhead_frac"]))]
        overheads = [interval_of(r, "overhead", "frac") for r in over_rows]
        all_stages = sum_interval(overheads) if overheads else Interval.point(math.nan, 0)
        one_mean = all_stages.scaled(1 / len(overheads)) if overheads else all_stages
        worst_row = max(over_rows, key=lambda r: float(r["overhead_frac"]), default=None)
        worst = (
            interval_of(worst_row, "overhead", "frac")
            if worst_row is not None
            else Interval.point(math.nan, 0)
        )
        harvest, idle = pipeline_harvest([r for _, r in g.iterrows()], stages=stages)
        limit = float(g["bubble_limit_frac"].iloc[0])
        published, corrected, x = _cost_intervals(g, all_stages, reference_keys, model)
        b = blocks[(blocks["run"] == run) & (blocks["case"] == case) & (blocks["mode"] == mode)]
        groups = [list(t) for t in b["latency_ms"]]
        later = _with_later_columns(b)
        pauses = [list(t) for t in later["pause_ms"] if t]
        wakes = [list(t) for t in later["wake_ms"] if t]
        announces = [list(t) for t in later["announce_ms"] if t]
        lates = [list(t) for t in later["late_ms"] if t]
        caught = [sum(t) / len(t) for t in later["spun"] if t]
        rows.append(
            {
                "run": run,
                "case": case,
                "mode": mode,
                "stages_covered": int(g["stage"].nunique()),
                "tasks": ", ".join(f"{s}:{t}" for s, t in zip(g["stage"], g["task"], strict=True)),
                "blocks_min": int(g["blocks"].min()),
                **interval_columns("overhead_all_stages_estimate", "frac", all_stages),
                **interval_columns("overhead_one_stage_mean", "frac", one_mean),
                **interval_columns("overhead_one_stage_worst", "frac", worst),
                "worst_stage": int(worst_row["stage"]) if worst_row is not None else -1,
                "worst_task": str(worst_row["task"]) if worst_row is not None else "",
                **interval_columns("harvest", "frac", harvest),
                "bubble_limit_frac": limit,
                **interval_columns("harvest_of_theory_limit", "frac", _per_limit(harvest, limit)),
                "idle_frac": idle.value,
                **interval_columns(
                    "harvest_of_measured_idle", "frac", quotient_interval(harvest, idle)
                ),
                "reference_gpus": x,
                **interval_columns("saving_published", "frac", published),
                **interval_columns("saving_corrected", "frac", corrected),
                **interval_columns("latency_p50", "ms", bootstrap_percentile_interval(groups, 50)),
                **interval_columns("latency_p99", "ms", bootstrap_percentile_interval(groups, 99)),
                **interval_columns("wake_p50", "ms", bootstrap_percentile_interval(wakes, 50)),
                **interval_columns("wake_p99", "ms", bootstrap_percentile_interval(wakes, 99)),
                **interval_columns(
                    "announce_p50", "ms", bootstrap_percentile_interval(announces, 50)
                ),
                **interval_columns(
                    "announce_p99", "ms", bootstrap_percentile_interval(announces, 99)
                ),
                **interval_columns("pause_p99", "ms", bootstrap_percentile_interval(pauses, 99)),
                **interval_columns("late_p50", "ms", bootstrap_percentile_interval(lates, 50)),
                **interval_columns("late_p90", "ms", bootstrap_percentile_interval(lates, 90)),
                **interval_columns("spin_caught", "frac", mean_interval(caught)),
            }
        )
    return pd.DataFrame(rows, columns=list(PIPELINE_COLUMNS))


def pipeline_harvest(
    rows: Sequence[Mapping[str, object] | pd.Series], *, stages: int
) -> tuple[Interval, Interval]:
    """A pipeline's harvest from its stages' summary rows, one row a stage, and the idle
    share it is measured against.

    Harvest is the mean over the S stages (each stage is one GPU; a stage without a row
    harvests nothing), NaN if a row's is unknown; the idle share is the mean over the rows of
    their vanilla blocks' (the segments' measured idle). Independent stages: variances add.
    """
    harvests = [interval_of(r, "harvest", "frac") for r in rows]
    if harvests and all(math.isfinite(h.value) for h in harvests):
        harvest = sum_interval(harvests).scaled(1 / stages)
    else:
        harvest = Interval.point(math.nan, 0)
    idles = [
        Interval.of(_num(r, "vanilla_idle_frac"), _num(r, "vanilla_idle_se_frac"),
                    _num(r, "vanilla_idle_df"), int(_num(r, "blocks")))
        for r in rows
    ]  # fmt: skip
    idle = sum_interval(idles).scaled(1 / len(idles)) if idles else Interval.point(math.nan, 0)
    return harvest, idle


def _cost_intervals(
    g: pd.DataFrame,
    overhead: Interval,
    reference_keys: Mapping[str, str],
    model: CostModel,
) -> tuple[Interval, Interval, float]:
    """Published and corrected saving of one pipeline row, and FreeRide's x (NaN if none)."""
    none = Interval.point(math.nan, 0)
    rates: dict[str, float] = {}
    parts: list[tuple[str, Interval]] = []
    for _, r in g.iterrows():
        for prefix, task in (("", r["task"]), ("leftovers_", r.get("leftovers_task", ""))):
            if not task:
                continue
            key = reference_keys.get(str(task), str(task))
            rate = float(r[f"{prefix}throughput_per_s"])
            if math.isfinite(rate):
                rates[key] = rates.get(key, 0.0) + rate
                iv = Interval.of(rate, float(r[f"{prefix}throughput_se_per_s"]),
                                 float(r[f"{prefix}throughput_df"]), int(r["blocks"]))  # fmt: skip
                parts.append((key, iv))
    o = overhead.value
    if not rates or not math.isfinite(o) or o <= -1:
        return none, none, math.nan
    try:
        cost = pipeline_cost(rates, overhead_frac=o, model=model)
        scale = {k: (1 + o) / (model.price_ratio * model.theta(k)) for k in rates}
    except KeyError:
        return none, none, math.nan  # a task without a reference throughput: no FreeRide cost
    published = sum_interval([iv.scaled(scale[k]) for k, iv in parts])
    published = published.shifted(cost.saving_published_frac - published.value)  # float noise
    corrected = sum_interval([published, overhead.scaled(-1.0)])
    return published, corrected, cost.reference_gpus


def _step_groups(blocks: pd.DataFrame) -> list[list[float]]:
    """Each block's raw step times (ms); none where the blocks carry only medians."""
    if "step_ms" not in blocks.columns:
        return []
    return [list(v) for v in blocks["step_ms"] if isinstance(v, list | tuple) and len(v)]


def step_speed_of_solo(b: pd.DataFrame, theta: float, theta_rest: float = math.nan) -> float:
    """Units per second of side-task step time in a mode's blocks ÷ the task's dedicated speed
    ``theta`` (NaN without steps or a dedicated speed): below 1 where its steps ran slower than
    the task alone, e.g. smaller steps, or steps sharing the device with training. With a task
    that took the leftovers (dedicated speed ``theta_rest``), the work of both at their own
    speeds alone per second of their steps."""
    busy_s = float(b["busy_ms"].sum()) / 1e3
    if not busy_s > 0 or not theta > 0:
        return math.nan
    work_s = float(b["progress"].sum()) / theta
    rest_done = float(b["leftovers_progress"].sum())
    if rest_done > 0:
        if not theta_rest > 0:
            return math.nan
        work_s += rest_done / theta_rest
    return work_s / busy_s


def _leftovers_columns(
    b: pd.DataFrame, rest: str, theta: float, harvest: Interval, vanilla_idle: Interval
) -> dict[str, object]:
    """The summary's ``leftovers_*`` columns of a mode's blocks (``rest`` "": none)."""
    wall = b["wall_s"].to_numpy(dtype=float)
    done = b["leftovers_progress"].to_numpy(dtype=float)
    throughput = ratio_interval(done, wall) if rest else Interval.point(math.nan, len(b))
    return {
        "leftovers_task": rest,
        "leftovers_unit": next((str(u) for u in b["leftovers_unit"] if u), ""),
        "leftovers_progress": float(done.sum()),
        "leftovers_throughput_per_s": throughput.value,
        "leftovers_throughput_se_per_s": throughput.se,
        "leftovers_throughput_df": throughput.df,
        "leftovers_dedicated_per_s": theta,
        **interval_columns(
            "leftovers_harvest_of_measured_idle", "frac", quotient_interval(harvest, vanilla_idle)
        ),
    }


def _idle_parts(b: pd.DataFrame, bubble_ms: float) -> dict[str, float]:
    """The uncovered bubble time of a mode's blocks by where it went, each ÷ its bubble time
    (NaN for results recorded before the split was kept)."""
    out = {
        f"{column.removesuffix('_ms')}_frac": float(b[column].sum(min_count=1)) / bubble_ms
        if bubble_ms > 0
        else math.nan
        for column in IDLE_SPLIT_COLUMNS
        if column.endswith("_ms")
    }
    count = float(b["bubbles"].sum(min_count=1))
    out["unused_bubbles_frac"] = (
        float(b["unused_bubbles"].sum(min_count=1)) / count if count > 0 else math.nan
    )
    return out


def _per_limit(harvest: Interval, limit: float) -> Interval:
    """Harvest as a share of the theory limit (NaN for a pipeline of one stage: no bubbles)."""
    return harvest.scaled(1 / limit) if limit > 0 else Interval.point(math.nan, harvest.n)


def interval_columns(
    name: str, unit: str, iv: Interval, *, spread: bool = False
) -> dict[str, float]:
    """``{name}_{unit}`` and its bounds (and, with ``spread``, ``_se_`` and ``_df``)."""
    out = {f"{name}_{unit}": iv.value, f"{name}_lo_{unit}": iv.lo, f"{name}_hi_{unit}": iv.hi}
    if spread:
        out[f"{name}_se_{unit}"] = iv.se
        out[f"{name}_df"] = iv.df
    return out


def interval_of(row: Mapping[str, object] | pd.Series, name: str, unit: str) -> Interval:
    """The ``Interval`` a summary row holds under ``name`` (see ``interval_columns``)."""
    return Interval(
        _num(row, f"{name}_{unit}"),
        _num(row, f"{name}_lo_{unit}"),
        _num(row, f"{name}_hi_{unit}"),
        _num(row, f"{name}_se_{unit}"),
        _num(row, f"{name}_df"),
        int(_num(row, "blocks")),
    )


def _num(row: Mapping[str, object] | pd.Series, col: str) -> float:
    """``row[col]`` as a float (None: NaN)."""
    v = row[col]
    return math.nan if v is None else float(v)  # type: ignore[arg-type]
