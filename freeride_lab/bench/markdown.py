"""The markdown of ``freeride-lab bench`` results: the tables beside the JSON and the number
formats BENCHMARKS.md's generator shares (``benchmarks/make_tables.py``).

    print(markdown(result))        # result: a results dict after ``bench_results.fill_tables``
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from freeride_lab.bench import stats as bs

__all__ = [
    "NOT_MEASURED",
    "PLACEMENT_HEADERS",
    "SPIN_COLUMNS",
    "SPIN_HEADERS",
    "UNUSED_WHY",
    "fmt_frac_interval",
    "fmt_interval",
    "fmt_ms_interval",
    "fmt_num",
    "fmt_pct",
    "fmt_rate",
    "fmt_throughput",
    "goal_figure",
    "markdown",
    "md_table",
    "placement_cells",
    "recorded",
    "run_label",
    "spin_cells",
]

#: What a table says for a figure an older result did not record.
NOT_MEASURED = "not measured in this result"


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and not math.isfinite(v))


def fmt_pct(v: Any, digits: int = 2, *, signed: bool = False) -> str:
    """A fraction as a percentage ("-" when missing); ``signed`` adds "+" to positives."""
    if _missing(v):
        return "-"
    return f"{100 * float(v):{'+' if signed else ''}.{digits}f}%"


def fmt_interval(
    v: Any, lo: Any, hi: Any, digits: int = 2, *, signed: bool = False, pct: bool = True
) -> str:
    """ "+0.59% [-0.41, +1.59]": a figure and its 95% interval; the figure alone without one.

    >>> fmt_interval(0.0059, -0.0041, 0.0159, signed=True)
    '+0.59% [-0.41, +1.59]'
    >>> fmt_interval(7.08, -2.16, 11.99, 1, signed=True, pct=False)
    '+7.1 [-2.2, +12.0]'
    """
    if pct:
        head = fmt_pct(v, digits, signed=signed)
        if _missing(lo) or _missing(hi):
            return head
        return f"{head} [{fmt_pct(lo, digits, signed=signed)[:-1]}, " \
            f"{fmt_pct(hi, digits, signed=signed)[:-1]}]"  # fmt: skip
    fmt = f"{'+' if signed else ''}.{digits}f"
    head = fmt_num(v, fmt)
    if _missing(lo) or _missing(hi):
        return head
    return f"{head} [{fmt_num(lo, fmt)}, {fmt_num(hi, fmt)}]"


def fmt_num(v: Any, fmt: str = ".3g") -> str:
    return "-" if _missing(v) else format(float(v), fmt)


def fmt_rate(v: Any) -> str:
    """Units per second with thousands separators at 3 significant digits (1,630; 5.14)."""
    if _missing(v):
        return "-"
    x = float(v)
    if abs(x) >= 1000:
        return f"{round(x, -len(str(int(abs(x)))) + 3):,.0f}"
    return f"{x:.3g}"


def fmt_throughput(r: Mapping[str, Any]) -> str:
    """A summary row's side-task throughput, and its leftovers task's beside it.

    >>> fmt_throughput({"throughput_per_s": 242.4, "unit": "samples"})
    '242 samples/s'
    >>> fmt_throughput({"throughput_per_s": 242.4, "unit": "samples",
    ...     "leftovers_task": "image", "leftovers_throughput_per_s": 1.2,
    ...     "leftovers_unit": "images"})
    '242 samples/s + 1.2 images/s'
    """
    text = f"{fmt_rate(r.get('throughput_per_s'))} {r.get('unit', '')}/s"
    if r.get("leftovers_task"):
        rate = fmt_rate(r.get("leftovers_throughput_per_s"))
        text += f" + {rate} {r.get('leftovers_unit', '')}/s"
    return text


def fmt_frac_interval(
    r: Mapping[str, Any], name: str, digits: int = 2, *, signed: bool = False
) -> str:
    """``fmt_interval`` of a row's ``{name}_frac`` with its ``_lo_frac`` and ``_hi_frac``."""
    return fmt_interval(
        r.get(f"{name}_frac"), r.get(f"{name}_lo_frac"), r.get(f"{name}_hi_frac"), digits,
        signed=signed,
    )  # fmt: skip


def fmt_calibration(records: Iterable[Mapping[str, Any]]) -> str:
    """A run's calibration records, one a rank, e.g. ``rank 1: F 12.9/10.8 B 22.2/22.1
    (W 9.1/9.1) opt 11.1 ms; rank 2: ...`` (one value per stage chunk; W only where a
    zero-bubble schedule split it off), or "(none)"; a replayed calibration
    (``EmulateOptions.costs``) adds what the run measured: ``replayed; measured F 13.4 B 22.9``."""

    def ms(values: Iterable[float]) -> str:
        return "/".join(f"{x:.1f}" for x in values)

    def one(c: Mapping[str, Any]) -> str:
        weight = c.get("weight_ms") or []
        measured = c.get("measured")
        return (
            f"rank {c['rank']}: F {ms(c['forward_ms'])} B {ms(c['backward_ms'])}"
            + (f" (W {ms(weight)})" if any(weight) else "")
            + f" opt {c['optimizer_ms']:.1f} ms"
            + (
                f" (replayed; measured F {ms(measured['forward_ms'])} "
                f"B {ms(measured['backward_ms'])})"
                if measured
                else ""
            )
        )

    return "; ".join(map(one, records)) or "(none)"


#: What says why edge → host took what it did (``bench.stats.spin_catches``): the columns
#: that record it and their headers, as the bench's markdown and the generated tables show them.
SPIN_COLUMNS: tuple[str, ...] = ("late_p50_ms", "late_p90_ms", "spin_caught_frac")
SPIN_HEADERS: tuple[str, ...] = (
    "start vs expected p50 ms",
    "start vs expected p90 ms",
    "starts inside the spin",
)


def spin_cells(r: Mapping[str, Any]) -> list[str]:
    """A pipeline row's ``SPIN_COLUMNS`` cells, under ``SPIN_HEADERS``."""
    return [fmt_ms_interval(r, "late_p50"), fmt_ms_interval(r, "late_p90"),
            fmt_frac_interval(r, "spin_caught", 0)]  # fmt: skip


#: The headers of a placement row's cells (``placement_cells``).
PLACEMENT_HEADERS: tuple[str, ...] = (
    "run", "mode", "placement", "stage:task", "fill predicted ms / step", "harvest",
    "of measured idle",
)  # fmt: skip


def placement_cells(r: Mapping[str, Any]) -> list[str]:
    """A ``bench.placement`` row's cells, under ``PLACEMENT_HEADERS``."""
    return [str(r["run"]), str(r["mode"]), str(r["policy"]), str(r["tasks"]),
            fmt_num(r["fill_predicted_ms"], ".1f"), fmt_frac_interval(r, "harvest", 1),
            fmt_frac_interval(r, "harvest_of_measured_idle", 0)]  # fmt: skip


def fmt_ms_interval(r: Mapping[str, Any], name: str) -> str:
    """Row ``r``'s ``{name}_ms`` with its ``_lo_ms`` / ``_hi_ms`` bounds, two decimals."""
    return fmt_interval(
        r.get(f"{name}_ms"), r.get(f"{name}_lo_ms"), r.get(f"{name}_hi_ms"), 2, pct=False
    )


def _overhead_cells(r: Mapping[str, Any]) -> list[str]:
    """The "overhead [95%]" and "median (min..max)" cells of a per-stage row; the baseline
    says so."""
    if r["mode"] == bs.REFERENCE_MODE:
        return ["baseline", "-"]
    return [
        fmt_frac_interval(r, "overhead", signed=True),
        f"{fmt_pct(r['overhead_median_frac'], signed=True)}"
        f" ({fmt_pct(r['overhead_min_frac'])}..{fmt_pct(r['overhead_max_frac'])})",
    ]


def goal_figure(c: Mapping[str, Any]) -> str:
    """A goal check's figure: its value and 95% interval, or for a goal about every stage the
    deciding stage's value and the bound that decides (its other bound is not the goal's)."""
    signed = c["kind"] == "max"
    if (c["lo"] is None) == (c["hi"] is None):
        return fmt_interval(c["value"], c["lo"], c["hi"], 2, signed=signed)
    side, bound = ("upper", c["hi"]) if c["hi"] is not None else ("lower", c["lo"])
    where = f"stage {c['stage']} · {c['task']}" if c.get("task") else "its stage"
    return (f"{fmt_pct(c['value'], 2, signed=signed)} ({where}, {side} bound "
            f"{fmt_pct(bound, 2, signed=signed)})")  # fmt: skip


def _goal_cells(c: Mapping[str, Any]) -> list[str]:
    """A goal check's cells."""
    sign = "≤" if c["kind"] == "max" else "≥"
    met = "yes" if c["met"] else ("no" if not c["note"] else f"no ({c['note']})")
    return [
        c["run"], c["case"], c["mode"], f"{c['goal']} {sign} {fmt_pct(c['threshold'], 1)}",
        goal_figure(c), met,
    ]  # fmt: skip


def _dedicated_cells(d: Mapping[str, Any]) -> list[str]:
    """A dedicated-speed row's cells; what an older result did not record says so."""
    unit = f" {d['unit']}/s" if d["unit"] else ""
    after = d["after_measured"]
    return [
        d["run"], d["case"], f"{d['stage']} · {d['task']}",
        f"{fmt_rate(d['before_per_s'])}{unit}",
        f"{fmt_rate(d['after_per_s'])}{unit}" if after else NOT_MEASURED,
        f"{fmt_rate(d['dedicated_per_s'])}{unit}",
        fmt_pct(d["spread_frac"], 1) if after else "-",
        "**yes**" if d["unstable"] else "no",
        f"{fmt_num(d['solo_before_s'], '.2f')} / {fmt_num(d['solo_after_s'], '.2f')}",
        f"{d['task_overruns_total']} of {d['task_steps_total']}"
        if d["task_steps_total"] is not None
        else NOT_MEASURED,
    ]  # fmt: skip


def run_label(run: str) -> str:
    """A bench run's name in words: "m4-timeslice" → "M = 4, time-sliced" (others as given)."""
    found = re.fullmatch(r"m(\d+)-(timeslice|mps)", run)
    if not found:
        return run
    return f"M = {found[1]}, {'time-sliced' if found[2] == 'timeslice' else 'MPS'}"


def md_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    """The lines of a markdown table: the header, its rule, then one line per row of cells."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(str(c) for c in r) + " |" for r in rows),
    ]


def _section(
    title: str,
    header: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    note: str = "",
    omit_empty: bool = False,
) -> list[str]:
    """A "## title" section holding one table, with an optional line of text before it;
    nothing at all for no rows with ``omit_empty`` (a figure the result does not have)."""
    if omit_empty and not rows:
        return []
    return ["", f"## {title}", "", *([note, ""] if note else []), *md_table(header, rows)]


def markdown(result: Mapping[str, Any]) -> str:
    """The results as markdown tables: pipeline rows (overhead; harvest, cost and latency),
    goal checks, per-stage rows, dedicated speeds, runs. Every ``[lo, hi]`` is a 95% interval
    over blocks."""
    v = result.get("versions", {})
    device = result.get("config", {}).get("device")
    lines = [
        f"# freeride-lab bench ({result.get('profile')}) — {result.get('date')}",
        "",
        f"`{result.get('command')}`",
        "",
        *(
            f"continued {c.get('date')} ({c.get('elapsed_s')} s): `{c.get('command')}`\n"
            for c in result.get("resumed", [])
        ),
        f"GPU {v.get('gpu')}, driver {v.get('driver')}, torch {v.get('torch')} "
        f"(CUDA {v.get('cuda')}), python {v.get('python')}; "
        f"{result.get('machine', {}).get('cpu_count')} CPUs; elapsed {result.get('elapsed_s')} s",
        "",
    ]
    if v.get("freeride_lab_source"):  # results from before it was recorded have none
        lines[-1:-1] = [
            f"freeride_lab sources {v['freeride_lab_source']}, commit "
            f"{v.get('freeride_lab_commit') or 'not a git checkout'}",
            "",
        ]
    if device == "cpu":
        lines += ["**CPU figures** (the real stage computed on the CPU): a check of the "
                  "harness, not GPU results.", ""]  # fmt: skip
    lines += [
        "Every `[lo, hi]` is a 95% confidence interval over the blocks (t-interval; latency: "
        "block bootstrap). *One stage* figures are what the harness measures (one stage "
        "harvesting at a time); *all stages* is the estimate for every stage harvesting at "
        "once (the sum of the per-stage slowdowns), the one comparable to FreeRide's.",
    ]
    lines += _section(
        "Pipeline: training overhead (vs interleaved vanilla blocks)",
        ["run", "case", "mode", "stages", "blocks (min)", "all stages at once (estimate)",
         "one stage: mean", "one stage: worst"],
        [
            [r["run"], r["case"], r["mode"], r["stages_covered"], r["blocks_min"],
             fmt_frac_interval(r, "overhead_all_stages_estimate", signed=True),
             fmt_frac_interval(r, "overhead_one_stage_mean", signed=True),
             f"{fmt_frac_interval(r, 'overhead_one_stage_worst', signed=True)} "
             f"({r['worst_stage']}·{r['worst_task']})"]
            for r in result.get("pipeline", [])
        ],
    )  # fmt: skip
    pipeline = result.get("pipeline", [])
    # the hop before the edge, where recorded (results before it lack the columns)
    lag = any(recorded(r.get("announce_p50_ms")) for r in pipeline)
    # why edge → host took what it did, where hosts recorded it (``stats.spin_catches``)
    spin = any(recorded(r.get(f)) for r in pipeline for f in SPIN_COLUMNS)
    lines += _section(
        "Pipeline: harvest, cost, latency",
        ["run", "case", "mode", "harvest", "of theory limit", "idle (measured)",
         "of measured idle", "saving published", "corrected", "edge → step p50 ms", "p99 ms",
         "of which edge → host p50 ms", "p99 ms",
         *(("before it, device → edge p50 ms", "p99 ms") if lag else ()),
         "end → last late step p99 ms", *(SPIN_HEADERS if spin else ())],
        [
            [r["run"], r["case"], r["mode"], fmt_frac_interval(r, "harvest", 1),
             f"{fmt_frac_interval(r, 'harvest_of_theory_limit', 0)} "
             f"(of {fmt_pct(r['bubble_limit_frac'], 1)})",
             fmt_pct(r["idle_frac"], 1), fmt_frac_interval(r, "harvest_of_measured_idle", 0),
             fmt_frac_interval(r, "saving_published", 1),
             fmt_frac_interval(r, "saving_corrected", 1),
             *(fmt_ms_interval(r, f)
               for f in ("latency_p50", "latency_p99", "wake_p50", "wake_p99",
                         *(("announce_p50", "announce_p99") if lag else ()), "pause_p99")),
             *(spin_cells(r) if spin else ())]
            for r in pipeline
        ],
    )  # fmt: skip
    lines += _section(
        "Goals (met only when the 95% interval clears the goal)",
        ["run", "case", "mode", "goal", "figure [95%]", "met"],
        [_goal_cells(c) for c in result.get("goal_checks", [])],
        omit_empty=True,
    )
    lines += _section(
        "Placement: each policy's assignment, its harvest read off the measured cells",
        PLACEMENT_HEADERS,
        [placement_cells(r) for r in result.get("placement", [])],
        note="A run that measured every task on every stage; the hindsight rows are chosen on "
        "the same blocks (the best is an optimistic bound, not a policy).",
        omit_empty=True,
    )
    lines += _section(
        "Per stage (one stage harvesting at a time)",
        ["run", "case", "stage", "task", "mode", "blocks", "step ms", "overhead [95%]",
         "median (min..max)", "throughput", "bubble used", "idle", "harvest [95%]",
         "of theory limit", "of measured idle", "overruns (blocks)", "SM MHz", "W"],
        [
            [r["run"], r["case"], r["stage"], bs.side_work(r) or "-", r["mode"],
             r["blocks"], fmt_num(r["step_ms_median"], ".1f"), *_overhead_cells(r),
             fmt_throughput(r),
             fmt_pct(r["bubble_used_frac"], 0), fmt_pct(r["idle_frac"], 0),
             fmt_frac_interval(r, "harvest", 1),
             fmt_frac_interval(r, "harvest_of_theory_limit", 0),
             fmt_frac_interval(r, "harvest_of_measured_idle", 0),
             f"{r['overruns']} of {r['side_steps']}",
             fmt_num(r["sm_clock_mhz"], ".0f"), fmt_num(r["power_w"], ".0f")]
            for r in result.get("summary", [])
        ],
    )  # fmt: skip
    lines += _section(
        "Dedicated speeds (each segment's own, alone on the device)",
        ["run", "case", "stage · task", "before", "after", "used", "spread", "flagged",
         "solo s before / after", "task's steps in the run: overran"],
        [_dedicated_cells(d) for d in result.get("dedicated", [])],
        note=f"Flagged: before and after differ by more than {bs.SPREAD_FLAG_FRAC:.0%}.",
        omit_empty=True,
    )  # fmt: skip
    lines += ["", "## Runs", ""]
    for run in result.get("runs", []):
        if "skipped" in run and isinstance(run["skipped"], str):
            lines.append(f"- {run['name']}: skipped ({run['skipped']})")
            continue
        lines.append(
            f"- {run['name']} (M={run.get('microbatches')}, MPS {run.get('mps')}): state "
            f"{run.get('state')}, start-up {run.get('startup_s')} s; "
            f"calibration {fmt_calibration(run.get('calibration', []))}"
        )
        memory = ", ".join(
            f"rank {m['rank']} {m['peak_reserved_bytes'] / 2**30:.1f} GiB"
            for m in run.get("stage_memory", [])
        )
        if memory:
            lines.append(f"  - peak reserved memory: {memory}")
        for note in [*run.get("skipped", []), *run.get("errors", [])]:
            lines.append(f"  - {note}")
    return "\n".join(lines + _idle_use_lines(result.get("summary", []))) + "\n"


#: The unused bubbles split by why (``core.idle_use``): summary column, table header.
UNUSED_WHY: tuple[tuple[str, str], ...] = (
    ("idle_unused_fit_frac", "of which the shortest step fitted"),
    ("idle_unused_silent_frac", "of those never announced"),
    ("idle_unused_short_frac", "announced, predicted too short for it"),
    ("idle_unused_guard_frac", "announced, predicted within the guard"),
    ("idle_unused_held_frac", "announced, room, the host checkpointing"),
)

#: The time after the last step that lay past the bubble's predicted end: column, header.
TAIL_PAST: tuple[str, str] = ("idle_tail_unpromised_frac", "of which past the predicted end")


def recorded(value: object) -> bool:
    """Whether a result holds ``value`` (a number, not NaN: older results lack newer columns)."""
    return isinstance(value, int | float) and not math.isnan(value)


def _idle_use_lines(summary: list[dict[str, Any]]) -> list[str]:
    """Where each gated mode's bubble time went (``core.idle_use``), where it was recorded."""
    rows = [r for r in summary if r["mode"] in bs.GATED_MODES and recorded(r.get("idle_tail_frac"))]
    if not rows:
        return []
    # the unused bubbles split by why, where recorded (results before it lack the columns)
    # fit and silent came in one result version, short in a later one
    why = [
        (column, header)
        for column, header in UNUSED_WHY
        if any(recorded(r.get(column)) for r in rows)
    ]
    # the tail's part past the predicted end, where recorded (a later result version)
    tail = [TAIL_PAST] if any(recorded(r.get(TAIL_PAST[0])) for r in rows) else []
    shares = (
        "bubble_used_frac",
        "idle_lead_frac",
        "idle_between_frac",
        "idle_tail_frac",
        *(column for column, _ in tail),
        "idle_unused_frac",
        *(column for column, _ in why),
        "unused_bubbles_frac",
        "step_speed_of_solo_frac",
    )
    return _section(
        "Where the idle time went (share of each block set's bubble time)",
        ["run", "case", "stage", "task", "mode", "side-task steps", "before the first step",
         "between steps", "after the last step", *(header for _, header in tail),
         "in unused bubbles", *(header for _, header in why), "bubbles unused",
         "its steps' speed, of the task alone"],
        [
            [r["run"], r["case"], r["stage"], bs.side_work(r) or "-", r["mode"],
             *(fmt_pct(r.get(c, math.nan), 1) for c in shares)]
            for r in rows
        ],
    )  # fmt: skip
