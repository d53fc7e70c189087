"""What each lever bought: every lever against itself switched off, read from the committed JSON.

A *lever* is something built to harvest more of the idle time at less training overhead (the
governed mode, finer side-task steps, trickle gating, ...). ``lever_table(levers, measured)``
writes BENCHMARKS.md's "What each lever bought": per lever, each A/B that measured it (the
lever on beside the lever off in one call: two invocations back to back, or two modes of one
segment), per stage · task, with the harvest of the measured idle and the training overhead of
both arms and their difference, and a verdict; a lever without an A/B says what would measure
it. It takes the A/Bs as an argument, so a test can hand it a small synthetic result;
``make_tables.py`` hands it the committed files its other tables report.

[Note: the difference of two arms]
Each arm's figure is the result's own (``bench.results.fill_tables``: the per-stage table).
Their difference, on − off, takes the two as independent figures: variances add, degrees of
freedom by Welch-Satterthwaite (``core.intervals.sum_interval`` of on and −off, the arithmetic
of the all-stage estimate). Two invocations are independent. Two modes of one segment
(governed vs managed, trickle vs governed) share the vanilla blocks their overheads are paired
with and their harvest is divided by, which correlates the arms positively; taking them as
independent then makes the interval of the difference wider than it is, never narrower. A
benchmark that records a figure's bounds without its standard error (the edge-watcher and
timing benchmarks) gets no difference: its arms stand side by side.

[Note: verdict]
An effect is clear when the interval of on − off lies wholly on one side of 0; without a
difference, when the two arms' intervals do not overlap (a stricter test). A lever **helps**
where a clear effect is in its favour (more harvest, or less overhead) and none against it,
*hurts* where the reverse, is a *trade-off* where both; anything else is "no clear effect".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from goal_status import PEER_FIX_NOTE, Source, before_peer_fix

from freeride_lab.bench.markdown import fmt_interval, md_table, run_label
from freeride_lab.bench.stats import side_work
from freeride_lab.core.intervals import Interval, quotient_interval, sum_interval

__all__ = [
    "LEVERS",
    "Arm",
    "Comparison",
    "Effect",
    "Lever",
    "Source",
    "bench_comparisons",
    "clear",
    "difference",
    "lever_rows",
    "lever_table",
    "paired_comparison",
    "pipeline_comparisons",
    "verdict",
]

NOT_MEASURED = "not measured on the GPU"
BACKED_OUT = "backed out"
NO_OFF_ARM = "no A/B: nothing to switch off"
_NAN = math.nan


@dataclass(frozen=True)
class Arm:
    """One side of an A/B: a bench result, the mode whose blocks are read, the side in words."""

    source: Source
    mode: str
    label: str


@dataclass(frozen=True)
class Effect:
    """One figure of an A/B: each arm's 95% interval, and on − off where it can be computed
    (None: the arms stand side by side; ``off`` None: there is no off arm)."""

    on: Interval
    off: Interval | None
    diff: Interval | None


@dataclass(frozen=True)
class Comparison:
    """One A/B of a lever at one place: the A/B in words, where (stage · task, mode), the two
    effects (None: not measured by it) and the results it reads."""

    ab: str
    where: str
    harvest: Effect | None
    overhead: Effect | None
    sources: tuple[Source, ...]


@dataclass(frozen=True)
class Lever:
    """A lever: its name, what it changes, and, for a lever with no A/B, why and what would
    measure it (``backed_out``: it was tried and taken out of the product)."""

    key: str
    name: str
    changes: str
    unmeasured: str
    backed_out: bool = False


# -- arithmetic and the rule ------------------------------------------------------------------


def difference(on: Interval, off: Interval) -> Interval:
    """on − off for two independent figures: variances add, df by Welch-Satterthwaite (see
    [Note: the difference of two arms]); no interval when either figure has none."""
    return sum_interval([on, off.scaled(-1.0)])


def clear(effect: Effect) -> int:
    """+1 when the lever clearly raised the figure, -1 when it clearly lowered it, 0 when the
    intervals do not say (see [Note: verdict])."""
    d = effect.diff
    if d is not None and d.has_bounds:
        return 1 if d.lo > 0 else -1 if d.hi < 0 else 0
    on, off = effect.on, effect.off
    if off is not None and on.has_bounds and off.has_bounds:
        return 1 if on.lo > off.hi else -1 if on.hi < off.lo else 0
    return 0


def verdict(harvest: Effect | None, overhead: Effect | None) -> str:
    """The verdict of one A/B from its harvest and overhead effects (see [Note: verdict])."""
    effects = [e for e in (harvest, overhead) if e is not None]
    if not effects:
        return NOT_MEASURED
    if all(e.off is None for e in effects):
        return NO_OFF_ARM
    h = clear(harvest) if harvest is not None else 0
    o = clear(overhead) if overhead is not None else 0
    good = [what for what, yes in (("more harvest", h > 0), ("less overhead", o < 0)) if yes]
    bad = [what for what, yes in (("less harvest", h < 0), ("more overhead", o > 0)) if yes]
    if good and bad:
        return "trade-off: " + ", ".join(good + bad)
    if good:
        return "**helps**: " + ", ".join(good)
    if bad:
        return "hurts: " + ", ".join(bad)
    return "no clear effect"


# -- reading the A/Bs -------------------------------------------------------------------------


def _num(v: Any) -> float:
    return _NAN if v is None else float(v)


def _overhead(row: Mapping[str, Any]) -> Interval:
    """A per-stage row's overhead with the standard error and df the table kept."""
    return Interval(_num(row["overhead_frac"]), _num(row.get("overhead_lo_frac")),
                    _num(row.get("overhead_hi_frac")), _num(row.get("overhead_se_frac")),
                    _num(row.get("overhead_df")), int(row.get("blocks", 0)))  # fmt: skip


def _harvest(row: Mapping[str, Any]) -> Interval:
    """A per-stage row's harvest of the measured idle. The table keeps its bounds, not its
    standard error; that comes from the same quotient the table took (harvest ÷ the vanilla
    blocks' idle, ``bench.tables``), and is used only when it gives the table's own figure."""
    n = int(row.get("blocks", 0))
    shown = Interval(_num(row["harvest_of_measured_idle_frac"]),
                     _num(row.get("harvest_of_measured_idle_lo_frac")),
                     _num(row.get("harvest_of_measured_idle_hi_frac")), _NAN, _NAN, n)  # fmt: skip
    harvest = Interval(_num(row.get("harvest_frac")), _num(row.get("harvest_lo_frac")),
                       _num(row.get("harvest_hi_frac")), _num(row.get("harvest_se_frac")),
                       _num(row.get("harvest_df")), n)  # fmt: skip
    idle = Interval.of(_num(row.get("vanilla_idle_frac")), _num(row.get("vanilla_idle_se_frac")),
                       _num(row.get("vanilla_idle_df")), n)  # fmt: skip
    again = quotient_interval(harvest, idle)
    same = all(
        math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
        for a, b in ((again.value, shown.value), (again.lo, shown.lo), (again.hi, shown.hi))
    )
    return again if same else shown


def _effect(on: Interval, off: Interval | None) -> Effect:
    return Effect(on, off, None if off is None else difference(on, off))


def _stage_rows(arm: Arm) -> dict[tuple[str, str, int, str], Mapping[str, Any]]:
    """The arm's per-stage rows with a task, by (run, case, stage, task)."""
    return {
        (r["run"], r["case"], int(r["stage"]), r["task"]): r
        for r in arm.source.data.get("summary", [])
        if r["mode"] == arm.mode and r.get("task")
    }


def _ab_text(on: Arm, off: Arm | None, shown: str) -> str:
    if off is None:
        head = f"`{on.source.name}` ({on.label}), alone"
    elif off.source is on.source:
        head = f"`{on.source.name}`: {on.label} vs {off.label}"
    else:
        head = f"`{on.source.name}` ({on.label}) vs `{off.source.name}` ({off.label})"
    return f"{head}; {shown}"


def bench_comparisons(on: Arm, off: Arm | None, shown: str) -> list[Comparison]:
    """One comparison per stage · task both arms measured (every one of ``on``'s when ``off``
    is None), in the result's order, from the results' per-stage tables; ``shown`` says where
    BENCHMARKS.md shows the two (e.g. "table `h200-12-04d-levers`")."""
    off_rows = _stage_rows(off) if off is not None else {}
    out = []
    for key, row in _stage_rows(on).items():
        other = off_rows.get(key)
        if off is not None and other is None:
            continue
        run, _, stage, _ = key
        mode = "" if off is not None and off.mode != on.mode else f", {on.mode}"
        out.append(
            Comparison(
                _ab_text(on, off, shown), f"{stage} · {side_work(row)}{mode} ({run_label(run)})",
                _effect(_harvest(row), None if other is None else _harvest(other)),
                _effect(_overhead(row), None if other is None else _overhead(other)),
                (on.source,) if off is None else (on.source, off.source),
            )
        )  # fmt: skip
    return out


def _bounds_only(row: Mapping[str, Any], name: str) -> Interval:
    return Interval(_num(row.get(f"{name}_frac")), _num(row.get(f"{name}_lo_frac")),
                    _num(row.get(f"{name}_hi_frac")), _NAN, _NAN,
                    int(row.get("blocks_min", 0)))  # fmt: skip


def pipeline_comparisons(on: Arm, off: Arm, shown: str) -> list[Comparison]:
    """One comparison per run and case whose pipeline rows both arms hold over the same
    stages: the harvest of the measured idle (mean over the stages) and the mean one-stage
    overhead. The pipeline table keeps their bounds only, so the arms stand side by side."""

    def rows(arm: Arm) -> dict[tuple[str, str], Mapping[str, Any]]:
        return {(r["run"], r["case"]): r for r in arm.source.data.get("pipeline", [])
                if r["mode"] == arm.mode}  # fmt: skip

    off_rows = rows(off)
    out = []
    for (run, case), row in rows(on).items():
        other = off_rows.get((run, case))
        if other is None or other.get("stages_covered") != row.get("stages_covered"):
            continue
        mode = "" if off.mode != on.mode else f", {on.mode}"
        out.append(
            Comparison(
                _ab_text(on, off, shown),
                f"{case}, {row.get('stages_covered')} stages: mean{mode} ({run_label(run)})",
                Effect(_bounds_only(row, "harvest_of_measured_idle"),
                       _bounds_only(other, "harvest_of_measured_idle"), None),
                Effect(_bounds_only(row, "overhead_one_stage_mean"),
                       _bounds_only(other, "overhead_one_stage_mean"), None),
                (on.source, off.source),
            )
        )  # fmt: skip
    return out


def placement_comparisons(source: Source, shown: str) -> list[Comparison]:
    """Lever 6 from a result that measured every task on every stage (``bench.placement``):
    per run and mode, the harvest-aware placement's pipeline harvest of the measured idle
    and all-stage overhead estimate beside FreeRide's placement. Both are read off the same
    cells, so the arms stand side by side; where the two placed the tasks alike, they are one
    measurement and differ by exactly nothing."""
    rows = {(r["run"], r["mode"], r["policy"]): r for r in source.data.get("placement", [])}
    out = []
    for (run, mode, policy), on in rows.items():
        off = rows.get((run, mode, "freeride"))
        if policy != "harvest" or off is None:
            continue

        def effect(name: str, on: Mapping[str, Any] = on, off: Mapping[str, Any] = off) -> Effect:
            a, b = _bounds_only(on, name), _bounds_only(off, name)
            alike = on["tasks"] == off["tasks"] and math.isfinite(a.value)
            return Effect(a, b, Interval(0.0, 0.0, 0.0, 0.0, math.inf, 0) if alike else None)

        out.append(
            Comparison(
                f"`{source.name}`: harvest-aware ({on['tasks']}) vs FreeRide's placement "
                f"({off['tasks']}); {shown}",
                f"{on['stages_covered']} stages: pipeline, {mode} ({run_label(run)})",
                effect("harvest_of_measured_idle"),
                effect("overhead_all_stages_estimate"),
                (source,),
            )
        )
    return out


def paired_comparison(
    ab: str, where: str, on: Mapping[str, Any], off: Mapping[str, Any], sources: tuple[Source, ...]
) -> Comparison:
    """An A/B a benchmark records as two overhead figures with bounds only (``{"value", "lo",
    "hi"}``, each against its own baseline blocks): side by side, no difference, no harvest."""

    def iv(f: Mapping[str, Any]) -> Interval:
        return Interval(float(f["value"]), _num(f.get("lo")), _num(f.get("hi")), _NAN, _NAN,
                        int(f.get("blocks", 0)))  # fmt: skip

    return Comparison(ab, where, None, Effect(iv(on), iv(off), None), sources)


# -- writing ----------------------------------------------------------------------------------


def _points(d: Interval, digits: int) -> str:
    return f"{100 * d.value:+.{digits}f} [{100 * d.lo:+.{digits}f}, {100 * d.hi:+.{digits}f}] pts"


def _cell(e: Effect | None, digits: int, *, signed: bool) -> str:
    """The cell "on vs off; on − off Δ" (or side by side, or on alone); "not measured" when
    the A/B did not measure the figure."""
    if e is None:
        return "not measured"

    def one(iv: Interval) -> str:
        return fmt_interval(iv.value, iv.lo, iv.hi, digits, signed=signed)

    if e.off is None:
        return one(e.on)
    cell = f"{one(e.on)} vs {one(e.off)}"
    if e.diff is not None and e.diff.has_bounds:
        return f"{cell}; on − off {_points(e.diff, digits)}"
    return f"{cell} (side by side)"


def lever_rows(
    levers: Sequence[Lever],
    measured: Mapping[str, Sequence[Comparison]],
    *,
    peer_fix_date: str | None = None,
) -> list[list[str]]:
    """The table's rows: per lever its comparisons (the lever, what it changes and the A/B
    written on the first row they hold for), or one row saying why it has none.

    Raises:
        ValueError: ``measured`` names a lever that is not in ``levers``.
    """
    unknown = sorted(set(measured) - {lever.key for lever in levers})
    if unknown:
        raise ValueError(
            f"A/Bs given for unknown lever(s) {unknown}; known: "
            f"{', '.join(lever.key for lever in levers)}"
        )
    rows = []
    for lever in levers:
        comparisons = measured.get(lever.key, ())
        if not comparisons:
            rows.append([lever.name, lever.changes, lever.unmeasured, "—", "—", "—",
                         BACKED_OUT if lever.backed_out else NOT_MEASURED])  # fmt: skip
            continue
        last_ab = None
        for i, c in enumerate(comparisons):
            old = any(before_peer_fix(s, peer_fix_date) for s in c.sources)
            ab = c.ab + (f" {PEER_FIX_NOTE}" if old else "")
            rows.append(
                [lever.name if i == 0 else "", lever.changes if i == 0 else "",
                 "" if ab == last_ab else ab, c.where,
                 _cell(c.harvest, 0, signed=False), _cell(c.overhead, 2, signed=True),
                 (BACKED_OUT + "; " if lever.backed_out else "") + verdict(c.harvest, c.overhead)]
            )  # fmt: skip
            last_ab = ab
    return rows


def lever_table(
    measured: Mapping[str, Sequence[Comparison]],
    levers: Sequence[Lever] | None = None,
    *,
    peer_fix_date: str | None = None,
) -> list[str]:
    """BENCHMARKS.md's "What each lever bought" (``levers`` defaults to ``LEVERS``).

    Args:
        measured: each lever's comparisons by its key; a lever missing here has no A/B.
        peer_fix_date: the recorded date of the first result with fixed emulated peers; an
            A/B reading an emulated-peer bench result recorded before it is marked
            "(before the peer fix)".
    """
    rows = lever_rows(LEVERS if levers is None else levers, measured, peer_fix_date=peer_fix_date)
    return md_table(
        ["lever", "what it changes", "A/B (on vs off): results, table", "stage · task",
         "harvest of the measured idle [95%]: on vs off", "training overhead [95%]: on vs off",
         "verdict"],
        rows,
    )  # fmt: skip


_BENCH = "freeride-lab bench --quick --emulate-peers --device cuda --runs m4-timeslice"

#: Every lever, in the table's order: the governed mode the others build on, the seven levers,
#: then the new task and the zero-bubble schedules.
LEVERS: tuple[Lever, ...] = (
    Lever("governed", "governed mode (overhead governor)",
          "a tight step budget (p95 of the solo step × 1.1 + 0.5 ms) that the overhead governor "
          "widens when training slows; managed is FreeRide's (median rounded up to 10 ms × 1.2)",
          "every bench result runs governed beside managed blocks"),
    Lever("evidence", "governed mode: a change on evidence",
          "the overhead governor changes a limit only where the overhead since its last change "
          "is over the target (or under the low water) at one-sided 95% confidence, Student's t "
          "over the steps (off: `--governor-evidence 0.5`, on the mean alone, as the governor's "
          "moving average did before). Steps vary by a percent or two and the bench's target is "
          "0.5%: on the mean alone the governor widened guards on noise", ""),
    Lever("predictor", "1. predictor with feedback",
          "`--predictor feedback` (`RuntimeOptions.predictor`): a bubble's length predicted as "
          "a percentile of the slot's last 16, the percentile moved by the predictions' own "
          "misses towards one in ten (off: FreeRide's minimum of the last five)",
          ""),
    Lever("outlived", "1. predictor: past the predicted end",
          "`--outlived survivors` (`RuntimeOptions.outlived`): once a bubble outlives the "
          "rank's prediction, the side task's host plans to the end its slot's recent bubbles "
          "that lasted longer give (their shortest, one in five set aside) and goes on "
          "stepping while a step fits it, sleeping through lengths too close for one (off: "
          "`stop`, FreeRide's: no step past the prediction). With a task on the leftovers "
          "(second A/B) both hosts follow the rule, the leftovers task's on the bubbles' own "
          "lengths, and the stage's task hands a bubble on rather than sleep in it", ""),
    Lever("outlived_hand_on", "1. predictor: past the predicted end, the leftovers task's alone",
          "`--outlived hand-on`: as `survivors`, except that a stage's main task whose hand-ons "
          "a leftovers task reads never plans past the rank's prediction: it hands the bubble on "
          "there, and the leftovers task (the image task's graphed band steps) plans to the "
          "survivors; off: `stop`, the same package in the same call", ""),
    Lever("leftovers", "2. fit the tails: a second task on the leftovers",
          "`--leftovers image` (gating \"leftovers\"): the image task beside each stage's "
          "task takes the bubble time it leaves, the bubbles too short for its steps and the "
          "end of each bubble after its last step, handed on by its host (off: the stage's task "
          "alone, FreeRide's one side task per GPU). Harvest counts both tasks' work, each at "
          "its own speed alone; arms from two invocations back to back on one machine, the "
          "peers replaying one calibration", ""),
    Lever("micro_batches", "2. fit the tails: micro-batches",
          "a vision task's batch in K slices with gradient accumulation: shorter steps, the same "
          "optimizer steps", ""),
    Lever("step_sizes", "2. fit the tails: step sizes",
          "a vision task's batch in 4 graphed slices, each step taking 1, 2 or 4 of them, the "
          "largest whose guard fits what is left of the bubble (`fit_slices`; off: the bench's "
          "default, one slice a step: 4 for VGG-19, 2 for ResNet-18). The first H100 A/B ran "
          "a host with a defect fixed since; replayed over those bubbles on the CPU, the fixed "
          "host gains (table `step-sizes-cpu`). The second: the image task in 64 bands, 1, 2 or "
          "4 a step (`step_bands`), against 16 bands a band a step, its size alone changed; the "
          "vision tasks' arms there also differ by graphs (eager whole batches off), so their "
          "rows measure both; the harvest is a share of the idle time, not of work done. The "
          "third: 8 graphed slices against 4, ResNet-18 only, arms from two calls back to back "
          "on one machine. The fourth: at M = 8, ResNet-18 and VGG-19 in 8 graphed slices and "
          "the image task in 128 bands up to 8 a step, against 4 slices and 64 bands up to 4 "
          "(each step's largest size the same), two calls back to back on one machine", ""),
    Lever("guard", "2. fit the tails: a narrower guard",
          "governed blocks start from a guard of the solo step's p95 alone (`--governed-guard "
          "1.0,0`; off: p95 × 1.1 + 0.5 ms, the default), the governor left to widen it; the "
          "bubble's predicted length is already a low one (the minimum of the last five)", ""),
    Lever("step_groups", "2. fit the tails: step groups",
          "side-task steps much shorter than `--step-group-ms` (1 ms) launched several per "
          "device wait", ""),
    Lever("group_guard", "2. fit the tails: a step group's guard per call",
          "a group of a task's short steps starts where one call's guard fits (the solo guards "
          "governed blocks start from are one call's, `SideTaskStep.calls`); off: the whole "
          "group's, the tree before 6693dda", ""),
    Lever("image_bands", "2. fit the tails: the image task's band step graphed",
          "the image task's band step with its column pass as blocks of a banded matrix (one "
          "gather, one batched product) and replayed as a CUDA graph (`cuda_graphs`); off: tap by "
          "tap and eager, the tree before 8b65faa", ""),
    Lever("graphs", "2. fit the tails: steps as CUDA graphs",
          "a batch in slices, each slice's step replayed as a CUDA graph (`cuda_graphs`)", ""),
    Lever("sm_share", "3. SM share per bubble (MPS, green contexts)",
          "a task's steps on part of the SMs without a restart",
          "no committed A/B: stepping ResNet-18 in a 32-SM green context under the bench's MPS "
          "daemon ended in an illegal memory access that took a training rank down (\"trickle "
          "gating\" below), so it was taken out",
          backed_out=True),
    Lever("power", "4. power-aware governor",
          "NVML board power (above 95% of the board's power cap) and SM clock (10% below the "
          "highest seen) count as overload to the overhead governor before the step time moves "
          "(off: `--governor-signals off`, the step time alone). No gated block of the H100 "
          "results came within 10% of the board's cap (table `h100-goals-now`), so the signals "
          "had little to act on there", ""),
    Lever("trickle", "5. trickle gating",
          "`gating=\"trickle\"`: steps between bubbles too, at a duty the governor raises while "
          "training keeps its pace (the off arm: governed blocks)", ""),
    Lever("placement", "6. harvest-aware placement, priority preemption",
          "`placement=\"harvest\"` puts a task on the stage whose bubbles its steps fill most "
          "(off: FreeRide's rule, which with room everywhere places in submission order); a "
          "waiting priority-0 task preempts an active priority-1 one (not in the A/B). The A/B "
          "is read off one run that measured each of the mix's tasks on each stage "
          "(`bench.placement`): each policy's assignment of the four tasks, its pipeline "
          "harvest and all-stage overhead from those cells",
          "measuring it takes a run of each task on each stage: `freeride-lab bench --cases "
          "pagerank,resnet18,image,vgg19 --real-stage all`"),
    Lever("edge_waits", "7. faster edges: waiting for an edge",
          "the GPU task host spins into a predicted bubble start (on) instead of sleeping to it; "
          "the rank's edge watcher sleeps on a blocking-sync event instead of polling", ""),
    Lever("announce", "7. faster edges: announce threshold",
          "a rank announces live only the bubbles predicted ≥ 1 ms (`--announce-min-ms`; off: "
          "every gap), so fewer edges wake the watcher and the task", ""),
    Lever("launch_then_tell", "7. faster edges: launch, then tell",
          "a bubble's first step is launched before its RUNNING state is announced (an event and "
          "a message that wakes the worker); each first step records when its host saw the edge "
          "(`seen_ns`), which splits the signal latency into edge → host and the host's own path",
          "no GPU A/B: there is no switch back. The hop split it brought is measured on an H100 "
          "(table `h100-12-05-latency`): at the median, more than half of edge → step passes "
          "before the task's host sees the edge"),
    Lever("spin_window", "7. faster edges: the sleep before the spin, the spin's window",
          "the GPU task host sleeps until 300 µs before a predicted bubble start in `select` "
          "(to the microsecond) instead of `poll` (whole milliseconds, rounded up: it woke after "
          "most edges), and spins to the slot's 90th percentile of lateness (at most 2 ms) "
          "instead of 300 µs past the prediction. Its worth is in the signal latency (table "
          "`h100-12-05d-latency`: the off arm sets `FREERIDE_SPIN_LEAD_US=0`, hosts never "
          "spin); the harvest and overhead columns say what it cost. The path alone on the CPU: "
          "table `edge-latency-cpu`. Second A/B: the spin's cap per bubble start at 4 ms "
          "(`FREERIDE_SPIN_MOST_US=4000`) against 2 ms, two calls back to back on one machine "
          "(table `h100-12-06-latency`)", ""),
    Lever("edge_first", "7. faster edges: no system call before the edge",
          "the task host's edge reader returns a new edge before any system call and drains its "
          "wake-up FIFO only when nothing is new (off: it drained before every look, also right "
          "after its spin saw the edge; a system call lets the host's other threads take the "
          "GIL, for up to the interpreter's 5 ms switch interval). Its worth is in the signal "
          "latency's tail (table `h100-12-06-latency`); the harvest and overhead columns say "
          "what it cost", ""),
    Lever("inference", "seventh built-in task: inference",
          "text generation in the bubbles, counted in output tokens (no off arm: a task, not a "
          "switch)", ""),
    Lever("zero_bubble", "zero-bubble schedule (residual idle)",
          "InterleavedZeroBubble against Interleaved1F1B (S = 4, M = 4, V = 2): less idle for "
          "training, shorter bubbles left for the task", ""),
)  # fmt: skip
