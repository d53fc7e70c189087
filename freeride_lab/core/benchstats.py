"""The bookkeeping of ``freeride-lab bench``: block order, medians, ratios, bubble use, harvest,
cost. Pure functions over numbers a benchmark has measured; ``lab/bench.py`` does the measuring.

A benchmark run interleaves *blocks* of training steps in different *modes* (A B C A B C …) so
that slow drift (clocks, temperature, other load) hits every mode alike, and reports medians
and ratios, never one absolute time:

- ``vanilla``: side tasks attached but parked (no step starts): the baseline;
- ``plain``: vanilla with plain ``PipelineStage`` instead of the timed one (instrumentation cost);
- ``managed``: FreeRide's gating: side-task steps only inside predicted bubbles;
- ``governed``: managed, with the overhead governor adjusting the step budget;
- ``naive``: the side task runs continuously beside training (the negative control).

[Note: paired ratios]
A mode's step-time ratio is taken block by block against the vanilla blocks next to it in run
order (the mean of the nearest one before and the nearest one after), then the median over its
blocks; the overhead is that median minus one. A drift that is linear over a few blocks cancels,
and one disturbed block moves the median little.

Cost and harvest go through ``core.accounting`` (FreeRide's formulas), so the benchmark's numbers
cannot drift from the library's:

    >>> interleave(["vanilla", "managed"], 2)
    [(0, 'vanilla'), (0, 'managed'), (1, 'vanilla'), (1, 'managed')]
    >>> round(pipeline_cost({"resnet18": 998.7}, overhead_frac=0.0).saving_published_frac, 4)
    0.0455
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from freeride_lab.core.accounting import (
    CostModel,
    CostSaving,
    bubble_limit,
    cost_saving,
    harvest_frac,
)

__all__ = [
    "BLOCK_COLUMNS",
    "MODES",
    "PIPELINE_COLUMNS",
    "REFERENCE_MODE",
    "SUMMARY_COLUMNS",
    "bubble_use_frac",
    "dedicated_throughput_per_s",
    "interleave",
    "median",
    "merge_intervals",
    "overlap_ms",
    "paired_ratios",
    "percentile",
    "pipeline_cost",
    "pipeline_summary",
    "signal_latency_ms",
    "step_periods_ms",
    "summarize_blocks",
]

MODES: tuple[str, ...] = ("vanilla", "plain", "managed", "governed", "naive")
REFERENCE_MODE = "vanilla"

#: Columns of the blocks table ``lab/bench.py`` builds (one row per block), in order.
BLOCK_COLUMNS: tuple[str, ...] = (
    "run",  # which pipeline run (one process tree): e.g. "m4-timeslice"
    "case",  # what its side tasks were: "mix", a task name, or "instrumentation"
    "stage",  # the real rank (its lowest stage index) in this block
    "task",  # the side task on that stage ("" for none)
    "mode",  # one of MODES
    "repeat",  # 0-based repeat of the interleaved sequence
    "order",  # 0-based position of the block in its run
    "first_step",  # first measured training step
    "steps",  # measured step periods in the block
    "step_ms_median",  # median step period (start to next start), ms
    "wall_s",  # first measured step start to the start after the last one
    "bubble_ms",  # the real rank's idle time inside step windows (gaps > 1 ms), summed
    "progress",  # side-task units done inside the block
    "unit",  # the side task's progress unit ("" for none)
    "side_steps",  # side-task steps that started inside the block
    "busy_ms",  # summed side-task step durations
    "busy_in_bubble_ms",  # the part of busy_ms that lies inside the real rank's bubbles
    "overruns",  # side-task steps that ran past their bubble's end
    "overrun_ms_total",
    "latency_ms",  # tuple: bubble start edge → first side-task step start, per bubble used
    "sm_clock_mhz",  # median NVML SM clock in the block (NaN without NVML)
    "power_w",  # median NVML board power in the block (NaN without NVML)
)

#: Columns of ``summarize_blocks``, in order.
SUMMARY_COLUMNS: tuple[str, ...] = (
    "run",
    "case",
    "stage",
    "task",
    "mode",
    "blocks",
    "step_ms_median",
    "ratio_vs_vanilla",  # median of paired ratios (see [Note: paired ratios])
    "overhead_frac",  # ratio_vs_vanilla - 1
    "overhead_min_frac",
    "overhead_max_frac",
    "progress",
    "unit",
    "throughput_per_s",  # progress ÷ wall time of the mode's blocks
    "bubble_used_frac",  # side-task busy time inside bubbles ÷ bubble time
    "idle_frac",  # the real rank's measured bubble time ÷ wall time
    "harvest_frac",  # work at the same GPU's dedicated speed ÷ wall time
    "bubble_limit_frac",  # (S-1)/(M+S-1)
    "harvest_of_limit_frac",  # harvest_frac ÷ bubble_limit_frac
    "overruns",
    "side_steps",
    "latency_p50_ms",
    "latency_p99_ms",
    "sm_clock_mhz",
    "power_w",
)

#: Columns of ``pipeline_summary``, in order.
PIPELINE_COLUMNS: tuple[str, ...] = (
    "run",
    "case",
    "mode",
    "stages_covered",
    "tasks",  # "stage:task" pairs, comma-separated
    "overhead_mean_frac",  # mean over stages of the per-stage overhead
    "overhead_max_frac",
    "overhead_sum_frac",  # conservative: every stage harvesting at once, delays adding up
    "harvest_frac",  # mean over stages: the whole pipeline's GPU time
    "bubble_limit_frac",
    "harvest_of_limit_frac",
    "reference_gpus",  # FreeRide's x: RTX 3080s' worth of work
    "saving_published_frac",
    "saving_corrected_frac",  # published - overhead_sum_frac
    "latency_p50_ms",
    "latency_p99_ms",
)


# -- order and statistics ---------------------------------------------------------------------


def interleave(
    modes: Sequence[str], repeats: int, *, closed: bool = False
) -> list[tuple[int, str]]:
    """(repeat, mode) in run order: every mode once per repeat, in the given order (A B A B).

    Args:
        closed: end with one more block of the first mode (A B A B A), so that every other
            block has a block of the first mode (the reference) on both sides.

    Raises:
        ValueError: repeats < 1, no modes, a repeated or unknown mode.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r} must be an integer >= 1")
    if not modes:
        raise ValueError(f"no modes given; valid: {', '.join(MODES)}")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown mode(s) {unknown}; valid: {', '.join(MODES)}")
    if len(set(modes)) != len(modes):
        raise ValueError(f"modes {list(modes)} repeat a mode; list each once")
    order = [(r, m) for r in range(repeats) for m in modes]
    return [*order, (repeats, modes[0])] if closed else order


def median(values: Iterable[float]) -> float:
    """The median, ignoring NaN; NaN when nothing is left."""
    a = np.asarray([v for v in values if not _isnan(v)], dtype=float)
    return float(np.median(a)) if a.size else math.nan


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (0-100, linear), ignoring NaN; NaN when nothing is left."""
    if not 0 <= q <= 100:
        raise ValueError(f"q={q} must be in [0, 100]")
    a = np.asarray([v for v in values if not _isnan(v)], dtype=float)
    return float(np.percentile(a, q)) if a.size else math.nan


def step_periods_ms(start_ns: Sequence[int]) -> list[float]:
    """Start-to-next-start periods in ms of consecutive steps (one fewer than starts).

    Raises:
        ValueError: starts that do not increase.
    """
    a = np.asarray(start_ns, dtype=np.int64)
    d = np.diff(a)
    if (d <= 0).any():
        raise ValueError(f"step starts must increase; got differences {d.tolist()} ns")
    return [float(x) / 1e6 for x in d]


def paired_ratios(
    order: Sequence[int],
    modes: Sequence[str],
    step_ms: Sequence[float],
    mode: str,
    *,
    reference: str = REFERENCE_MODE,
) -> list[float]:
    """Per block of ``mode``: its step time ÷ its neighbouring reference blocks' mean.

    Args:
        order, modes, step_ms: one entry per block (run order, mode, median step ms) of one
            segment; the neighbours are the nearest ``reference`` blocks before and after in
            ``order`` (one side only at the ends).

    Returns:
        One ratio per ``mode`` block that has a reference neighbour, in run order.
    """
    if not len(order) == len(modes) == len(step_ms):
        raise ValueError(
            f"order, modes and step_ms differ in length ({len(order)}, {len(modes)}, "
            f"{len(step_ms)}); give one entry per block"
        )
    rows = sorted(zip(order, modes, step_ms, strict=True))
    refs = [(o, v) for o, m, v in rows if m == reference and not _isnan(v)]
    out: list[float] = []
    for o, m, v in rows:
        if m != mode or _isnan(v):
            continue
        before = [r for r in refs if r[0] < o]
        after = [r for r in refs if r[0] > o]
        near = ([before[-1][1]] if before else []) + ([after[0][1]] if after else [])
        if near:
            out.append(v / (sum(near) / len(near)))
    return out


# -- intervals ------------------------------------------------------------------------------


def merge_intervals(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, non-overlapping union of (start, end) intervals; empty ones are dropped."""
    out: list[tuple[float, float]] = []
    for s, e in sorted((float(s), float(e)) for s, e in intervals if e > s):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def overlap_ms(a: Iterable[tuple[float, float]], b: Iterable[tuple[float, float]]) -> float:
    """Total length of the intersection of two sets of intervals (each merged first)."""
    x, y = merge_intervals(a), merge_intervals(b)
    total, i, j = 0.0, 0, 0
    while i < len(x) and j < len(y):
        lo = max(x[i][0], y[j][0])
        hi = min(x[i][1], y[j][1])
        if hi > lo:
            total += hi - lo
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


def bubble_use_frac(
    bubbles: Iterable[tuple[float, float]], busy: Iterable[tuple[float, float]]
) -> float:
    """Side-task busy time inside bubbles ÷ bubble time (NaN without bubble time)."""
    merged = merge_intervals(bubbles)
    total = sum(e - s for s, e in merged)
    return overlap_ms(merged, busy) / total if total > 0 else math.nan


def signal_latency_ms(
    edge_start_ns: Sequence[int], edge_end_ns: Sequence[int], step_start_ns: Sequence[int]
) -> list[float]:
    """Bubble start → first side-task step start, for every bubble a step started in.

    Args:
        edge_start_ns, edge_end_ns: the bubbles' start and end edges (pairs, same length).
        step_start_ns: side-task step starts.
    """
    if len(edge_start_ns) != len(edge_end_ns):
        raise ValueError(
            f"{len(edge_start_ns)} start edges but {len(edge_end_ns)} end edges; pass pairs"
        )
    steps = np.sort(np.asarray(step_start_ns, dtype=np.int64))
    out: list[float] = []
    for s, e in sorted(zip(edge_start_ns, edge_end_ns, strict=True)):
        i = int(np.searchsorted(steps, s, side="left"))
        if i < steps.size and steps[i] < e:
            out.append(float(steps[i] - s) / 1e6)
    return out


# -- side-task speed, harvest, cost ---------------------------------------------------------


def dedicated_throughput_per_s(
    progress: Sequence[float], duration_ms: Sequence[float], *, skip: int = 2
) -> float:
    """Units per second of step time, leaving out the first ``skip`` steps (warm-up).

    A task whose progress comes in whole units every few steps (an image resized in bands:
    fifteen steps of 0, then 1) is measured over whole cycles only: from just after the first
    step that made progress to the last one that did, when at least two did. Otherwise a
    window that ends mid-image would count the bands it did as no work.
    NaN when no step is left or they took no time.
    """
    if len(progress) != len(duration_ms):
        raise ValueError(f"{len(progress)} progress values but {len(duration_ms)} durations")
    p = np.asarray(progress, dtype=float)[skip:]
    d = np.asarray(duration_ms, dtype=float)[skip:]
    done = np.flatnonzero(p > 0)
    if done.size >= 2 and done.size < p.size:  # not every step made progress: whole cycles
        p, d = p[done[0] + 1 : done[-1] + 1], d[done[0] + 1 : done[-1] + 1]
    total_s = float(d.sum()) / 1e3
    return float(p.sum()) / total_s if p.size and total_s > 0 else math.nan


def pipeline_cost(
    rates_per_s: Mapping[str, float],
    *,
    overhead_frac: float,
    model: CostModel | None = None,
) -> CostSaving:
    """FreeRide's cost figures for side-task rates summed over the pipeline's stages.

    Goes through ``accounting.cost_saving`` with T_v = 1 s and T_f = 1 + overhead, P_k =
    rate_k · T_f: the same formulas as a full run of length T_f (both are linear in time).

    Args:
        rates_per_s: units per second of training wall time per FreeRide reference key
            ("resnet18", "sgd", …), summed over stages.
        overhead_frac: the training slowdown the side tasks cause (T_f / T_v - 1).
    """
    if not math.isfinite(overhead_frac) or overhead_frac <= -1:
        raise ValueError(f"overhead_frac={overhead_frac!r} must be a finite number > -1")
    freeride_s = 1.0 + overhead_frac
    progress = {k: float(v) * freeride_s for k, v in rates_per_s.items()}
    return cost_saving(progress, vanilla_s=1.0, freeride_s=freeride_s, model=model)


# -- tables ---------------------------------------------------------------------------------


def summarize_blocks(
    blocks: pd.DataFrame,
    *,
    stages: int,
    microbatches: int | Mapping[str, int],
    dedicated_per_s: Mapping[str, float],
) -> pd.DataFrame:
    """One row per (run, case, stage, task, mode): medians, ratios and fractions over its blocks.

    Args:
        blocks: rows with ``BLOCK_COLUMNS``.
        stages: S; microbatches: M, or M per run name (for the bubble limit).
        dedicated_per_s: each task's units per second alone on the same device (harvest).

    Returns:
        ``SUMMARY_COLUMNS``; ratios come from [Note: paired ratios] within (run, case, stage,
        task); harvest is NaN where a task's dedicated speed is unknown.
    """
    missing = [c for c in BLOCK_COLUMNS if c not in blocks.columns]
    if missing:
        raise ValueError(f"blocks lack column(s) {missing}; expected {', '.join(BLOCK_COLUMNS)}")
    rows: list[dict[str, object]] = []
    keys = ["run", "case", "stage", "task"]
    for key, seg in blocks.groupby(keys, sort=False):
        run = str(key[0])
        m = microbatches if isinstance(microbatches, int) else microbatches[run]
        limit = bubble_limit(stages, m)
        for mode in [x for x in MODES if x in set(seg["mode"])]:
            b = seg[seg["mode"] == mode]
            ratios = (
                [1.0] * len(b)
                if mode == REFERENCE_MODE
                else paired_ratios(
                    list(seg["order"]), list(seg["mode"]), list(seg["step_ms_median"]), mode
                )
            )
            ratio = median(ratios)
            wall_s = float(b["wall_s"].sum())
            progress = float(b["progress"].sum())
            task = str(key[3])
            theta = dedicated_per_s.get(task, math.nan)
            harvest = (
                harvest_frac({task: progress}, {task: theta}, wall_s)
                if task and theta > 0 and wall_s > 0
                else (0.0 if not task or progress == 0 else math.nan)
            )
            bubble_ms = float(b["bubble_ms"].sum())
            latencies = [x for t in b["latency_ms"] for x in t]
            rows.append(
                {
                    "run": run,
                    "case": str(key[1]),
                    "stage": int(key[2]),
                    "task": task,
                    "mode": mode,
                    "blocks": len(b),
                    "step_ms_median": median(b["step_ms_median"]),
                    "ratio_vs_vanilla": ratio,
                    "overhead_frac": ratio - 1.0,
                    "overhead_min_frac": min(ratios) - 1.0 if ratios else math.nan,
                    "overhead_max_frac": max(ratios) - 1.0 if ratios else math.nan,
                    "progress": progress,
                    "unit": next((str(u) for u in seg["unit"] if u), ""),
                    "throughput_per_s": progress / wall_s if wall_s > 0 else math.nan,
                    "bubble_used_frac": (
                        float(b["busy_in_bubble_ms"].sum()) / bubble_ms
                        if bubble_ms > 0
                        else math.nan
                    ),
                    "idle_frac": bubble_ms / (wall_s * 1e3) if wall_s > 0 else math.nan,
                    "harvest_frac": harvest,
                    "bubble_limit_frac": limit,
                    "harvest_of_limit_frac": harvest / limit,
                    "overruns": int(b["overruns"].sum()),
                    "side_steps": int(b["side_steps"].sum()),
                    "latency_p50_ms": percentile(latencies, 50),
                    "latency_p99_ms": percentile(latencies, 99),
                    "sm_clock_mhz": median(b["sm_clock_mhz"]),
                    "power_w": median(b["power_w"]),
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

    Rows without a side task (timed-vs-plain instrumentation blocks) are left out. Overheads
    combine per-stage measurements (mean, max, and the conservative sum that
    assumes every stage harvesting at once adds its delay); harvest is the mean over stages
    (each stage is one GPU); cost sums each stage's side-task rate per FreeRide reference key
    and uses the summed overhead for the corrected saving. Stages not covered count as not
    harvesting (``stages_covered`` says how many were).

    Args:
        summary: ``summarize_blocks`` output; blocks: its input (for pooled latencies).
        reference_keys: task name → FreeRide reference key (``freeride_lab.tasks.REFERENCE_KEYS``).
    """
    rows: list[dict[str, object]] = []
    work = summary[(summary["mode"] != REFERENCE_MODE) & (summary["task"] != "")]
    for (run, case, mode), g in work.groupby(["run", "case", "mode"], sort=False):
        tasks = g[g["task"] != ""]
        rates: dict[str, float] = {}
        for _, r in tasks.iterrows():
            key = reference_keys.get(str(r["task"]), str(r["task"]))
            rate = float(r["throughput_per_s"])
            if math.isfinite(rate):
                rates[key] = rates.get(key, 0.0) + rate
        over = [float(x) for x in g["overhead_frac"] if math.isfinite(float(x))]
        over_sum = sum(over) if over else math.nan
        harvests = [float(x) for x in g["harvest_frac"]]
        harvest = sum(h for h in harvests if math.isfinite(h)) / stages
        if any(not math.isfinite(h) for h in harvests):
            harvest = math.nan
        limit = float(g["bubble_limit_frac"].iloc[0])
        cost: CostSaving | None = None
        if rates and math.isfinite(over_sum) and over_sum > -1:
            try:
                cost = pipeline_cost(rates, overhead_frac=over_sum, model=model)
            except KeyError:
                cost = None  # a task without a reference throughput: no FreeRide cost
        b = blocks[(blocks["run"] == run) & (blocks["case"] == case) & (blocks["mode"] == mode)]
        latencies = [x for t in b["latency_ms"] for x in t]
        rows.append(
            {
                "run": run,
                "case": case,
                "mode": mode,
                "stages_covered": int(g["stage"].nunique()),
                "tasks": ", ".join(f"{s}:{t}" for s, t in zip(g["stage"], g["task"], strict=True)),
                "overhead_mean_frac": sum(over) / len(over) if over else math.nan,
                "overhead_max_frac": max(over) if over else math.nan,
                "overhead_sum_frac": over_sum,
                "harvest_frac": harvest,
                "bubble_limit_frac": limit,
                "harvest_of_limit_frac": harvest / limit,
                "reference_gpus": cost.reference_gpus if cost else math.nan,
                "saving_published_frac": cost.saving_published_frac if cost else math.nan,
                "saving_corrected_frac": cost.saving_corrected_frac if cost else math.nan,
                "latency_p50_ms": percentile(latencies, 50),
                "latency_p99_ms": percentile(latencies, 99),
            }
        )
    return pd.DataFrame(rows, columns=list(PIPELINE_COLUMNS))


def _isnan(v: object) -> bool:
    try:
        return math.isnan(float(v))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return True
