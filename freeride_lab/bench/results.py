"""The results of ``freeride-lab bench``: blocks from a run's events, the tables, the JSON.
``bench/driver.py`` drives the runs; ``bench/stats.py`` and ``bench/tables.py`` hold the
arithmetic, ``core/intervals.py`` the 95% intervals, ``bench/markdown.py`` the markdown.

    rows = [block_row(b, "m4", starts, bubbles, side, edges, samples, t0) for b in blocks]
    fill_tables(result, stages=4)          # summary, pipeline, dedicated, headline, goal_checks
    write_results(result, Path("results/h200.json"))   # and results/h200.md

The results file holds: benchmark, profile, command, date, versions (python, torch, CUDA,
driver, GPU), machine, config (the profile), cost_model, goals, runs (per run: its settings,
calibration, segments with each task's solo speed before and after its blocks, budget and
step and overrun totals, skipped parts, errors, governor decisions), blocks
(``bench.stats.BLOCK_COLUMNS`` plus the raw ``step_ms``), summary
(``benchtables.SUMMARY_COLUMNS``), pipeline (``benchtables.PIPELINE_COLUMNS``), dedicated
(``DEDICATED_COLUMNS``), headline (``HEADLINE_FIGURES``, each with its interval) and
goal_checks (``goal_checks``).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import os
import platform
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd

from freeride_lab.bench import stats as bs
from freeride_lab.bench import tables as bt
from freeride_lab.bench.markdown import markdown
from freeride_lab.bench.placement import placement_summary
from freeride_lab.core.accounting import CostModel
from freeride_lab.core.announced import announced_spans
from freeride_lab.core.budget import OverrunStats
from freeride_lab.core.idle_use import idle_use

_Record = TypeVar("_Record", bound=Mapping[str, Any])  # a segment record, as given

__all__ = [
    "DEDICATED_COLUMNS",
    "block_row",
    "clears_goal",
    "cost_model_dict",
    "cpu_model",
    "default_out",
    "fill_tables",
    "goal_checks",
    "jsonable",
    "machine",
    "segment_speeds",
    "segment_tasks",
    "source_digest",
    "versions",
    "write_results",
]


#: Columns of ``segment_speeds`` (``result["dedicated"]``), in order.
DEDICATED_COLUMNS: tuple[str, ...] = (
    "run",
    "case",
    "stage",
    "task",
    "unit",
    "before_per_s",  # solo phase before the segment's blocks
    "after_per_s",  # solo phase after them (None: not measured in this result)
    "dedicated_per_s",  # the speed harvest uses: the mean of the two (or the one measured)
    "spread_frac",  # |after - before| ÷ their mean
    "unstable",  # spread_frac > bench.stats.SPREAD_FLAG_FRAC
    "after_measured",  # False for results from before the after phase existed
    "solo_before_s",
    "solo_after_s",
    "solo_before_steps",
    "solo_after_steps",
    "task_steps_total",  # every step of the task in the run (None: not measured)
    "task_overruns_total",  # of those, the ones that overran (core.budget.overrun_mask)
)


def fill_tables(result: dict[str, Any], *, stages: int) -> None:
    """Fill the summary tables from the blocks and segments collected so far.

    Each segment's side work is valued at that segment's own dedicated speed (never one
    pooled over runs). Old results, whose segments have one solo phase, are read as they are:
    what they lack is None in the tables (``NOT_MEASURED``).
    """
    result.pop("dedicated_per_s", None)  # the pooled speed of older results: not used
    blocks = pd.DataFrame(result["blocks"], columns=[*bs.BLOCK_COLUMNS, "step_ms"])
    dedicated = segment_speeds(result["runs"])
    if blocks.empty:
        result.update(
            summary=[], pipeline=[], placement=[], dedicated=dedicated, headline={}, goal_checks=[]
        )
        return
    blocks["latency_ms"] = [tuple(x) for x in blocks["latency_ms"]]
    speeds: dict[bs.SegmentKey, float] = {
        (d["run"], d["case"], d["stage"], d["task"]): d["dedicated_per_s"]
        for d in dedicated
        if d["dedicated_per_s"] is not None
    }
    m_of_run = {r["name"]: r["microbatches"] for r in result["runs"] if "microbatches" in r}
    # a run's theory idle share; results from before other schedules ran are 1F1B's
    limits = {r["name"]: r["bubble_limit_frac"] for r in result["runs"] if "bubble_limit_frac" in r}
    summary = bt.summarize_blocks(
        blocks, stages=stages, microbatches=m_of_run, dedicated_per_s=speeds, limits=limits
    )
    from freeride_lab.tasks import REFERENCE_KEYS

    pipeline = bt.pipeline_summary(summary, blocks, stages=stages, reference_keys=REFERENCE_KEYS)
    result["dedicated"] = dedicated
    result["summary"] = _records(summary)
    result["pipeline"] = _records(pipeline)
    result["placement"] = _records(placement_summary(summary, result["runs"], stages=stages))
    result["headline"] = _headline(summary, pipeline)
    result["goal_checks"] = goal_checks(result["pipeline"], result["summary"], result.get("goals"))


def segment_speeds(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One ``DEDICATED_COLUMNS`` row per segment with a side task, in run order."""
    out: list[dict[str, Any]] = []
    for run in runs:
        for whole in run.get("segments", []):
            if not whole.get("task"):
                continue
            for seg in segment_tasks(whole):
                out.append(_segment_speed(str(run["name"]), whole, seg))
    return out


def segment_tasks(seg: _Record) -> tuple[_Record, ...]:
    """A segment's record, then its leftovers task's (``seg["leftovers"]``) where it had one:
    each names a task and holds its solo phases.

        >>> [t["task"] for t in segment_tasks({"task": "vgg19", "leftovers": {"task": "image"}})]
        ['vgg19', 'image']
    """
    beside: _Record | None = seg.get("leftovers")
    return (seg, beside) if isinstance(beside, Mapping) else (seg,)


def _segment_speed(run: str, whole: Mapping[str, Any], seg: Mapping[str, Any]) -> dict[str, Any]:
    """The ``DEDICATED_COLUMNS`` row of ``seg``: segment ``whole``'s task, or the task beside
    it that took its leftovers (named by ``bench.stats.leftovers_key``)."""
    task = str(seg["task"]) if seg is whole else bs.leftovers_key(str(seg["task"]))
    new = "dedicated_before_per_s" in seg
    before = _finite(seg.get("dedicated_before_per_s" if new else "dedicated_per_s"))
    after = _finite(seg.get("dedicated_after_per_s")) if new else None
    speed = bs.dedicated_speed(before, after)
    return {
        "run": run,
        "case": str(whole.get("case", "")),
        "stage": int(whole["stage"]),
        "task": task,
        "unit": str(seg.get("unit", "")),
        "before_per_s": before,
        "after_per_s": after,
        "dedicated_per_s": speed["dedicated_per_s"],
        "spread_frac": speed["dedicated_spread_frac"],
        "unstable": speed["dedicated_unstable"],
        "after_measured": new,
        "solo_before_s": seg.get("solo_s"),
        "solo_after_s": seg.get("solo_after_s"),
        "solo_before_steps": seg.get("solo_steps"),
        "solo_after_steps": seg.get("solo_after_steps"),
        "task_steps_total": seg.get("task_steps_total"),
        "task_overruns_total": seg.get("task_overruns_total"),
    }


def _finite(v: Any) -> float | None:
    return float(v) if v is not None and math.isfinite(float(v)) else None


def _bounds(row: Mapping[str, Any], name: str, unit: str = "frac") -> dict[str, Any]:
    return {
        "value": row[f"{name}_{unit}"],
        "lo": row[f"{name}_lo_{unit}"],
        "hi": row[f"{name}_hi_{unit}"],
    }


#: Headline figures per (run, mode): name in the JSON → pipeline column it comes from.
HEADLINE_FIGURES: tuple[tuple[str, str, str], ...] = (
    ("overhead_all_stages_estimate_frac", "overhead_all_stages_estimate", "frac"),
    ("overhead_one_stage_mean_frac", "overhead_one_stage_mean", "frac"),
    ("overhead_one_stage_worst_frac", "overhead_one_stage_worst", "frac"),
    ("harvest_frac", "harvest", "frac"),
    ("harvest_of_theory_limit_frac", "harvest_of_theory_limit", "frac"),
    ("harvest_of_measured_idle_frac", "harvest_of_measured_idle", "frac"),
    ("saving_published_frac", "saving_published", "frac"),
    ("saving_corrected_frac", "saving_corrected", "frac"),
    ("latency_p50_ms", "latency_p50", "ms"),
    ("latency_p99_ms", "latency_p99", "ms"),
)


def _headline(summary: pd.DataFrame, pipeline: pd.DataFrame) -> dict[str, Any]:
    """The figures the goals are about, per run (mix case) and mode, each as
    ``{"value", "lo", "hi"}`` (the 95% interval), and the instrumentation overhead."""
    out: dict[str, Any] = {}
    for _, row in pipeline[pipeline["case"] == "mix"].iterrows():
        figures: dict[str, Any] = {
            key: _bounds(row, name, unit) for key, name, unit in HEADLINE_FIGURES
        }
        figures["overhead_one_stage_worst_frac"].update(
            stage=row["worst_stage"], task=row["worst_task"]
        )
        figures["idle_frac"] = row["idle_frac"]
        figures["bubble_limit_frac"] = row["bubble_limit_frac"]
        figures["blocks_min"] = row["blocks_min"]
        out.setdefault(str(row["run"]), {})[str(row["mode"])] = figures
    plain = summary[(summary["case"] == "instrumentation") & (summary["mode"] == "plain")]
    for _, row in plain.iterrows():
        # plain ÷ timed = 1 + overhead; the timed stage costs 1 / that - 1
        def inv(x: float) -> float:
            return 1.0 / (1.0 + x) - 1.0 if 1.0 + x > 0 else math.nan

        out.setdefault(str(row["run"]), {})["instrumentation_overhead_frac"] = {
            "value": inv(float(row["overhead_frac"])),
            "lo": inv(float(row["overhead_hi_frac"])),
            "hi": inv(float(row["overhead_lo_frac"])),
        }
    headline: dict[str, Any] = jsonable(out)
    return headline


#: The goals and the figure each is judged on: (goal key in ``result["goals"]``, name, figure,
#: "max" (met when the interval's upper bound is under it) or "min" (lower bound over it), and
#: where the figure comes from: "pipeline" (the run's pipeline row) or "every stage" (each
#: covered stage's own interval must clear the goal; the stage with the highest upper bound of
#: a maximum, the lowest lower bound of a minimum, decides). A pipeline figure counts stages a
#: run did not cover as harvesting nothing, so a goal about every stage is judged stage by
#: stage.
GOAL_FIGURES: tuple[tuple[str, str, str, str, str], ...] = (
    ("overhead_mean_frac_max", "overhead, one stage at a time: mean", "overhead_one_stage_mean",
     "max", "pipeline"),
    ("overhead_all_stages_frac_max", "overhead, all stages at once (estimate)",
     "overhead_all_stages_estimate", "max", "pipeline"),
    ("overhead_worst_frac_max", "overhead, worst stage (one at a time)", "overhead", "max",
     "every stage"),
    ("harvest_of_limit_frac_min", "harvest of the theory limit", "harvest_of_theory_limit",
     "min", "pipeline"),
    ("harvest_of_limit_frac_min", "harvest of the measured idle time, every stage",
     "harvest_of_measured_idle", "min", "every stage"),
    ("saving_corrected_frac_min", "saving, overhead-corrected", "saving_corrected", "min",
     "pipeline"),
)  # fmt: skip


def clears_goal(kind: str, threshold: float, lo: float | None, hi: float | None) -> bool | None:
    """Whether a 95% interval clears a goal: its upper bound under a maximum (``kind``
    "max"), its lower bound over a minimum ("min"); None without that bound (None or NaN)."""
    bound = hi if kind == "max" else lo
    if bound is None or math.isnan(bound):
        return None
    return bound < threshold if kind == "max" else bound > threshold


def goal_checks(
    pipeline: Sequence[Mapping[str, Any]],
    summary: Sequence[Mapping[str, Any]],
    goals: Mapping[str, Any] | None,
) -> list[dict[str, Any]]:
    """Each goal against each (run, case) of the product's modes: met only when the 95%
    interval clears it (upper bound under a maximum, lower bound over a minimum); a figure
    without an interval (fewer than two blocks) meets nothing."""
    out: list[dict[str, Any]] = []
    for row in pipeline:
        if row["mode"] not in bs.GATED_MODES:
            continue
        for key, name, figure, kind, scope in GOAL_FIGURES:
            threshold = (goals or {}).get(key)
            if threshold is None:
                continue
            stage: dict[str, Any] = {}
            if scope == "pipeline":
                if f"{figure}_frac" not in row:
                    continue
                value, lo, hi = (row[f"{figure}{s}_frac"] for s in ("", "_lo", "_hi"))
            else:
                value, lo, hi, stage = _deciding_stage(row, summary, figure, kind)
            met = clears_goal(kind, threshold, lo, hi)
            out.append(
                {
                    "run": row["run"],
                    "case": row["case"],
                    "mode": row["mode"],
                    "goal": name,
                    "kind": kind,
                    "threshold": threshold,
                    "value": value,
                    "lo": lo,
                    "hi": hi,
                    "met": bool(met) if met is not None else False,
                    "note": "" if met is not None else "no interval: too few blocks",
                    **stage,
                }
            )
    return out


def _deciding_stage(
    row: Mapping[str, Any], summary: Sequence[Mapping[str, Any]], figure: str, kind: str
) -> tuple[Any, Any, Any, dict[str, Any]]:
    """A goal about every stage, for ``row``'s (run, case, mode): the value and bound of the
    stage that decides it (the highest upper bound of a maximum, the lowest lower bound of a
    minimum; the other bound None) and ``{"stage", "task"}`` of that stage; no bound when a
    stage has none (too few blocks)."""
    stages = [
        s
        for s in summary
        if (s["run"], s["case"], s["mode"]) == (row["run"], row["case"], row["mode"]) and s["task"]
    ]
    side, pick = ("_hi", max) if kind == "max" else ("_lo", min)
    bounds = [s.get(f"{figure}{side}_frac") for s in stages]
    if not stages or any(b is None or b != b for b in bounds):
        return pick((s[f"{figure}_frac"] for s in stages), default=None), None, None, {}
    worst = pick(stages, key=lambda s: s[f"{figure}{side}_frac"])
    bound = worst[f"{figure}{side}_frac"]
    lo, hi = (None, bound) if kind == "max" else (bound, None)
    return worst[f"{figure}_frac"], lo, hi, {"stage": worst["stage"], "task": worst["task"]}


def block_row(
    b: Mapping[str, Any],
    run: str,
    starts: Mapping[tuple[int, int], int],
    bubbles: pd.DataFrame,
    side: pd.DataFrame,
    edges: Sequence[Mapping[str, Any]],
    samples: Sequence[Any],
    t0: int,
    holds: Sequence[tuple[str, float, float]] = (),
) -> dict[str, Any] | None:
    """One ``BLOCK_COLUMNS`` row (plus the raw ``step_ms``), or None if steps are missing.
    ``holds``: the run's side-task checkpoints as (task_id, start, end), ms after ``t0``: a
    host busy with one takes no bubble (``idle_unused_held_ms``)."""
    r, first, k = int(b["stage"]), int(b["first_step"]), int(b["steps"])
    ns = [starts.get((r, s)) for s in range(first, first + k + 1)]
    if any(x is None for x in ns):
        return None
    ns_ok = [int(x) for x in ns if x is not None]
    periods = bs.step_periods_ms(ns_ok)
    lo_ms, hi_ms = (ns_ok[0] - t0) / 1e6, (ns_ok[-1] - t0) / 1e6
    mine = bubbles[(bubbles["rank"] == r) & bubbles["step"].between(first, first + k - 1)]
    gaps = list(zip(mine["start_ms"], mine["end_ms"], strict=True))
    s = side[(side["stage"] == r) & (side["start_ms"] >= lo_ms) & (side["start_ms"] < hi_ms)]
    rest_id = str(b.get("leftovers_task_id") or "")
    if b.get("task_id"):  # the stage's side work: its task's steps and its leftovers task's
        s = s[s["task_id"].isin([b["task_id"], rest_id])].sort_values("start_ms", kind="stable")
    rest = s[s["task_id"] == rest_id] if rest_id else s.iloc[0:0]
    tasks_here = {str(b["task_id"]), rest_id} if b.get("task_id") else set(s["task_id"])
    held = [(a, e) for task_id, a, e in holds if task_id in tasks_here and e > lo_ms and a < hi_ms]
    main = s[s["task_id"] != rest_id] if rest_id else s
    busy = [(a, min(e, hi_ms)) for a, e in zip(s["start_ms"], s["end_ms"], strict=True)]
    latency: list[float] = []
    wake: list[float] = []
    late: list[float] = []
    spun: list[float] = []
    pause: list[float] = []
    handon: list[float] = []
    # the bubbles the rank announced, ms after t0, with their predicted end where it had one
    told: list[tuple[float, ...]] = []
    announce: list[float] = []
    if b["mode"] in bs.GATED_MODES and len(s):
        spans, open_starts_ns = announced_spans(edges, r, ns_ok[0], ns_ok[-1])
        step_ns, main_ns = _starts_ns(s, t0), _starts_ns(main, t0)  # both tasks', its task's
        starts_ns, ends_ns = [x.start_ns for x in spans], [x.end_ns for x in spans]
        guard_at = _guards_of_steps(s)
        for span in spans:
            announced: tuple[float, ...] = ((span.start_ns - t0) / 1e6, (span.end_ns - t0) / 1e6)
            if span.predicted_end_ns is not None:  # and the guard it was held to where known
                guard = guard_at(announced[0])
                announced += ((span.predicted_end_ns - t0) / 1e6,)
                announced += () if guard is None else (guard,)
            told.append(announced)
        gaps_ns = [(round(a * 1e6) + t0, round(e * 1e6) + t0) for a, e in gaps]
        announce = bs.announce_lag_ms(gaps_ns, starts_ns)
        latency = bs.signal_latency_ms(starts_ns, ends_ns, main_ns)
        wake = bs.wake_latency_ms(starts_ns, ends_ns, main_ns, _times_ns(main, "seen_ms", t0))
        spin_from = _times_ns(main, "spin_from_ms", t0)
        spin_until = _times_ns(main, "spin_until_ms", t0)
        late, spun = bs.spin_catches(
            starts_ns, ends_ns, main_ns, _times_ns(main, "expected_ms", t0),
            list(zip(spin_from, spin_until, strict=True)),
        )  # fmt: skip
        if rest_id:
            handon = bs.handon_latency_ms(starts_ns, ends_ns, main_ns, _starts_ns(rest, t0))
        if b["mode"] != "trickle":  # trickle steps run between bubbles by design
            # a bubble still open when the block's window closes bounds the one before it
            pause = bs.pause_latency_ms(starts_ns, ends_ns, step_ns, open_start_ns=open_starts_ns)
    lo_ns, hi_ns = ns_ok[0], ns_ok[-1]
    window = [x for x in samples if lo_ns <= x.t_ns < hi_ns]
    overruns = OverrunStats.of(s["overrun_ms"] * 1e6)
    durations = [e - a for a, e in busy if e > a]
    use = idle_use(
        gaps, busy, fit_ms=min(durations) if durations else None, announced=told, held=held
    )
    return {
        "run": run,
        "case": b["case"],
        "stage": r,
        "task": b["task"],
        "mode": b["mode"],
        "repeat": int(b["repeat"]),
        "order": int(b["order"]),
        "first_step": first,
        "steps": k,
        "step_ms_median": bs.median(periods),
        "wall_s": (ns_ok[-1] - ns_ok[0]) / 1e9,
        "bubble_ms": float(mine["duration_ms"].sum()),
        "progress": float(main["progress"].sum()),
        "unit": str(main["unit"].iloc[0]) if len(main) else "",
        "side_steps": len(s),
        "busy_ms": float(sum(e - a for a, e in busy if e > a)),
        "busy_in_bubble_ms": use.covered_ms,
        "idle_lead_ms": use.lead_ms,
        "idle_between_ms": use.between_ms,
        "idle_tail_ms": use.tail_ms,
        "idle_unused_ms": use.unused_ms,
        "idle_unused_fit_ms": use.unused_fit_ms,
        "idle_unused_silent_ms": use.unused_silent_ms,
        "idle_unused_short_ms": use.unused_short_ms,
        "idle_unused_guard_ms": (
            use.unused_guard_ms if any(len(t) > 3 for t in told) else math.nan
        ),
        "idle_unused_held_ms": use.unused_held_ms,
        "idle_tail_unpromised_ms": (
            use.tail_unpromised_ms if any(len(t) > 2 for t in told) else math.nan
        ),
        "bubbles": use.bubbles,
        "unused_bubbles": use.unused_bubbles,
        "overruns": overruns.overruns,
        "overrun_ms_total": overruns.overrun_ns_total / 1e6,
        "latency_ms": latency,
        "wake_ms": wake,
        "late_ms": [round(x, 4) for x in late],
        "spun": spun,
        "announce_ms": announce,
        "pause_ms": pause,
        "handon_ms": handon,
        "sm_clock_mhz": bs.median(x.sm_clock_mhz for x in window),
        "power_w": bs.median(x.power_w for x in window),
        "leftovers_task": str(b.get("leftovers_task") or ""),
        "leftovers_progress": float(rest["progress"].sum()),
        "leftovers_unit": str(rest["unit"].iloc[0]) if len(rest) else "",
        "step_ms": [round(x, 4) for x in periods],
    }


def _guards_of_steps(s: pd.DataFrame) -> Callable[[float], float | None]:
    """For a time (ms after t0): the guard in force then (the guard recorded by the latest
    bubble step that started by then, else by the first after it), or None where no step
    recorded one (hosts before they did, or a task that took no bubble step)."""
    if "guard_ms" not in s.columns:
        return lambda t: None
    known = sorted(
        (float(a), float(g))
        for a, g in zip(s["start_ms"], s["guard_ms"], strict=True)
        if math.isfinite(g) and g > 0
    )
    starts = [a for a, _ in known]

    def at(t: float) -> float | None:
        if not known:
            return None
        i = bisect.bisect_right(starts, t)
        return known[i - 1][1] if i > 0 else known[0][1]

    return at


def _starts_ns(s: pd.DataFrame, t0: int) -> list[int]:
    """The side-task steps' starts (ms after t0) on the run clock in ns."""
    return [round(x * 1e6) + t0 for x in s["start_ms"]]


def _times_ns(s: pd.DataFrame, column: str, t0: int) -> list[float]:
    """A time column of the side-task steps (ms after t0) on the run clock in ns, per step:
    NaN where a step did not record it, and for every step of a table from before hosts
    recorded that column."""
    if column not in s.columns:
        return [math.nan] * len(s)
    return [x * 1e6 + t0 if math.isfinite(x) else math.nan for x in s[column]]


# -- output -----------------------------------------------------------------------------------


def versions() -> dict[str, Any]:
    import torch

    from freeride_lab.gpu import nvml
    from freeride_lab.lab.launch import software_versions

    gpu = None
    if nvml.is_available() and nvml.device_count() > 0:
        handle = nvml.query("nvmlDeviceGetHandleByIndex", 0, default=None)
        name = None if handle is None else nvml.query("nvmlDeviceGetName", handle, default=None)
        gpu = name.decode() if isinstance(name, bytes) else name
    package = Path(__file__).resolve().parents[1]
    return {
        **software_versions(),
        # which code measured: a digest of the package's sources (the same for the same
        # tree wherever it runs) and the commit where the tree is a git checkout
        "freeride_lab_source": source_digest(package),
        "freeride_lab_commit": _git_commit(package),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "driver": nvml.driver_version(),
        "gpu": gpu,
        "nvml": nvml.unavailable_reason() or "ok",
    }


def source_digest(package: Path) -> str:
    """The first 16 hex digits of a SHA-256 over the package's ``.py`` files (paths and bytes,
    in path order): two trees with the same sources give the same digest."""
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _git_commit(package: Path) -> str | None:
    """HEAD of the git checkout holding ``package`` (with "+changes" if the tree differs from
    it); None where there is no checkout or no git."""
    try:
        head = subprocess.run(
            ["git", "-C", str(package), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", str(package), "status", "--porcelain", "--untracked-files=no", "."],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}+changes" if dirty else head


def machine() -> dict[str, Any]:
    from freeride_lab.gpu import nvml

    return {
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        # the host's own path (an edge to a side task's step) runs on it: two calls' latencies
        # are comparable only on the same model
        "cpu_model": cpu_model(),
        "load_avg_1m_at_start": round(os.getloadavg()[0], 2),
        "host": platform.node(),
        # the board's power cap, which the board power of each block is judged against
        "power_limit_w": nvml.power_limit_w(),
        # the product's settings from the environment the run's processes inherit (a task
        # host's spin lead, say): two results that differ only there must say so
        "environment": {k: v for k, v in sorted(os.environ.items()) if k.startswith("FREERIDE_")},
    }


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The host CPU's model name (the first "model name" of ``cpuinfo``); None where that
    cannot be read (not Linux, or no such line)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            return value.strip()
    return None


def cost_model_dict(model: CostModel) -> dict[str, Any]:
    return {
        "reference_throughput_per_s": dict(model.reference_throughput_per_s),
        "reference_gpu": model.reference_gpu,
        "c_ref_usd_per_h": model.c_ref_usd_per_h,
        "c_srv_usd_per_h": model.c_srv_usd_per_h,
        "price_ratio": model.price_ratio,
    }


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [jsonable(r) for r in frame.to_dict(orient="records")]


def jsonable(value: Any) -> Any:
    """Plain JSON: NaN and infinities become None, tuples lists, numpy scalars Python ones."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_results(result: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(jsonable(result), indent=1) + "\n")
    os.replace(tmp, out)
    out.with_suffix(".md").write_text(markdown(result))


def default_out(device: str, gpu_name: str = "") -> Path:
    """``benchmarks/results/<gpu-or-cpu>-<date>.json`` under the working directory.

    ``gpu_name`` is the device's name ("NVIDIA H200"): its model ("h200") names the file, so
    numbers from different GPUs never share one.
    """
    kind = "cpu" if device != "cuda" else gpu_model(gpu_name)
    return Path("benchmarks") / "results" / f"{kind}-{datetime.now().date().isoformat()}.json"


def gpu_model(name: str) -> str:
    """A short file-name form of a GPU's name: "NVIDIA H100 80GB HBM3" → "h100"; "gpu" if none."""
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w and w != "nvidia"]
    return words[0] if words else "gpu"
