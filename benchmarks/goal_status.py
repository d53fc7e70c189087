"""Where each harvest and overhead goal stands: one row per goal over every committed result.

``goal_rows(sources)`` reads each goal's figure out of every result it is handed (a bench result
with today's arithmetic, or a ``bench_timing_overhead.py`` result), one candidate per result,
run and mode, each with its 95% interval; ``goal_table`` writes them as BENCHMARKS.md's "Where
each goal stands". It takes the results as an argument, so a test can hand it a small synthetic
one; ``make_tables.py`` hands it the committed files its other tables report.

The rule for the two figures of a row, stated once under the table (``SELECTION_RULE``):

- **best**: the candidate whose deciding bound (the upper bound under a maximum, the lower bound
  over a minimum) is closest to meeting the goal; a figure without an interval ranks last;
- **latest**: the same choice among the candidates of the newest result (its recorded
  ``date``) that has the figure; a result merged from several calls carries the date of its
  last call.

A goal is **met** only when the whole interval clears it (``bench.results.clears_goal``).
A goal that is about every stage is judged on a result's deciding stage (the one whose interval
is furthest from the goal); it and the goals about the whole pipeline read only results that
measured every stage.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from freeride_lab.bench.markdown import fmt_interval, fmt_pct, md_table, run_label
from freeride_lab.bench.profiles import GOALS as RECORDED_GOALS
from freeride_lab.bench.results import clears_goal
from freeride_lab.bench.stats import GATED_MODES, overhead_interval

#: The mark of a figure from an emulated-peer result recorded before the peers lasted what they
#: stand for: its measured idle includes the peers' overrun.
PEER_FIX_NOTE = "(before the peer fix)"
NOT_RECORDED = "not recorded"
SELECTION_RULE = (
    "Best is the figure whose deciding bound (the upper bound of a maximum, the lower bound of a "
    "minimum) is closest to meeting the goal; latest is the same choice within the newest result, "
    "by its recorded date, that has the figure; a goal about every stage is judged on a result's "
    "deciding stage, and a goal about every stage or the whole pipeline only on results that "
    "measured every stage."
)


@dataclass(frozen=True)
class Source:
    """One committed result: its name as cited, its recorded date (ISO 8601), its data."""

    name: str
    date: str
    data: Mapping[str, Any]


@dataclass(frozen=True)
class Candidate:
    """One figure a goal can be judged on, with its 95% interval (NaN bounds: none)."""

    source: Source
    what: str
    value: float
    lo: float
    hi: float


@dataclass(frozen=True)
class Goal:
    """A goal: "max" (met when the upper bound is under ``threshold``) or "min" (lower bound
    over it); ``unit`` "frac", "ms" or "cap" (a fraction above a recorded cap); ``figures``
    finds its candidates in one result."""

    name: str
    kind: str
    threshold: float
    unit: str
    figures: Callable[[Source], list[Candidate]]
    hindrance: str


@dataclass(frozen=True)
class GoalStatus:
    """A goal with the best and the latest of its candidates (None: never measured)."""

    goal: Goal
    best: Candidate | None
    latest: Candidate | None

    @property
    def met(self) -> bool:
        return self.best is not None and clears(self.goal, self.best)


def _num(v: Any) -> float:
    return math.nan if v is None else float(v)


def clears(goal: Goal, c: Candidate) -> bool:
    """Whether ``c``'s whole interval clears ``goal`` (False without an interval)."""
    return bool(clears_goal(goal.kind, goal.threshold, c.lo, c.hi))


def _rank(goal: Goal, c: Candidate) -> tuple[int, float]:
    """Sort key, smallest first: with an interval before without, then how far the deciding
    bound is from the goal (a negative distance clears it)."""
    bound = c.hi if goal.kind == "max" else c.lo
    if not math.isfinite(bound):
        return 1, -c.value if goal.kind == "min" else c.value
    return 0, bound - goal.threshold if goal.kind == "max" else goal.threshold - bound


def _microbatches(run: str) -> int | None:
    m = run.partition("-")[0]
    return int(m[1:]) if m[1:].isdigit() else None


def _every_stage(data: Mapping[str, Any], row: Mapping[str, Any]) -> bool:
    return int(row.get("stages_covered", 0)) >= int(data["config"]["stages"])


def _is_bench(s: Source) -> bool:
    return s.data.get("benchmark") == "bench"


def before_peer_fix(s: Source, peer_fix_date: str | None) -> bool:
    """Whether ``s`` is an emulated-peer bench result recorded before ``peer_fix_date`` (the
    date of the first result whose peers last what they stand for): its measured idle holds
    the peers' overrun."""
    return (
        peer_fix_date is not None
        and _is_bench(s)
        and s.date < peer_fix_date
        and "--emulate-peers" in str(s.data.get("command", ""))
    )


# -- what each goal reads ---------------------------------------------------------------------


def _pipeline(
    figure: str, *, every_stage: bool, m: int | None = None
) -> Callable[[Source], list[Candidate]]:
    """Candidates from the pipeline rows (the mix, the product's modes) of a bench result."""

    def figures(s: Source) -> list[Candidate]:
        if not _is_bench(s):
            return []
        out = []
        for r in s.data.get("pipeline", []):
            if r["case"] != "mix" or r["mode"] not in GATED_MODES or r.get(figure) is None:
                continue
            if (every_stage and not _every_stage(s.data, r)) or (
                m is not None and _microbatches(r["run"]) != m
            ):
                continue
            base = figure.removesuffix("_frac").removesuffix("_ms")
            unit = figure[len(base) :]
            n = int(s.data["config"]["stages"])
            stages = "" if every_stage else f", {r.get('stages_covered', '?')} of {n} stages"
            out.append(
                Candidate(s, f"{run_label(r['run'])}, {r['mode']}{stages}", _num(r[figure]),
                          _num(r.get(f"{base}_lo{unit}")), _num(r.get(f"{base}_hi{unit}")))
            )  # fmt: skip
        return out

    return figures


def _deciding_stage(
    kind: str, figure: str, *, every_stage: bool, m: int | None = None,
    keep: Callable[[Source], bool] = _is_bench,
) -> Callable[[Source], list[Candidate]]:  # fmt: skip
    """Per (run, mode) of a bench result, the stage whose ``figure`` interval is furthest from
    the goal: the highest upper bound of a maximum, the lowest lower bound of a minimum."""

    def figures(s: Source) -> list[Candidate]:
        if not keep(s):
            return []
        groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
        for r in s.data.get("summary", []):
            if r["case"] == "mix" and r["mode"] in GATED_MODES and r.get("task"):
                groups.setdefault((r["run"], r["mode"]), []).append(r)
        out = []
        stages = int(s.data["config"]["stages"])
        for (run, mode), rows in groups.items():
            rows = [r for r in rows if r.get(f"{figure}_frac") is not None]
            covered = sorted({int(r["stage"]) for r in rows})
            if not rows or (every_stage and len(covered) < stages):
                continue
            if m is not None and _microbatches(run) != m:
                continue
            side, sign = ("hi", 1.0) if kind == "max" else ("lo", -1.0)
            worst = max(rows, key=lambda r: _distance(sign, r.get(f"{figure}_{side}_frac")))
            where = (
                ""
                if len(covered) == stages
                else f", stage{'s' if len(covered) > 1 else ''} {', '.join(map(str, covered))}"
            )
            out.append(
                Candidate(s, f"{run_label(run)}, {mode}{where}; deciding stage {worst['stage']} · "
                          f"{worst['task']}", _num(worst[f"{figure}_frac"]),
                          _num(worst.get(f"{figure}_lo_frac")),
                          _num(worst.get(f"{figure}_hi_frac")))
            )  # fmt: skip
        return out

    return figures


def _distance(sign: float, bound: Any) -> float:
    """How far a deciding bound lies on the failing side (``sign`` +1 for a maximum, -1 for a
    minimum); a figure without an interval is the furthest from any goal."""
    v = _num(bound)
    return sign * v if math.isfinite(v) else math.inf


def _clock_loss(s: Source) -> list[Candidate]:
    """Per (run, mode) of a result that measured every stage: the SM clock lost against the
    neighbouring vanilla blocks (paired, as overheads are), on the stage whose upper bound is
    highest."""
    if not _is_bench(s):
        return []
    segments: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for b in s.data.get("blocks", []):
        if b.get("case") == "mix" and _num(b.get("sm_clock_mhz")) > 0:
            segments.setdefault((b["run"], int(b["stage"])), []).append(b)
    worst: dict[tuple[str, str], tuple[float, float, float, int]] = {}
    for (run, stage), blocks in segments.items():
        order = [int(b["order"]) for b in blocks]
        modes = [str(b["mode"]) for b in blocks]
        clock = [float(b["sm_clock_mhz"]) for b in blocks]
        for mode in sorted(set(modes) & set(GATED_MODES)):
            iv = overhead_interval(order, modes, clock, mode)  # clock change, paired
            loss = (-iv.value, -iv.hi, -iv.lo, stage)
            key = (run, mode)
            if key not in worst or _key_hi(loss) > _key_hi(worst[key]):
                worst[key] = loss
    stages = int(s.data["config"]["stages"])
    covered = {run: {st for r, st in segments if r == run} for run, _ in segments}
    return [
        Candidate(s, f"{run_label(run)}, {mode}; deciding stage {st}", v, lo, hi)
        for (run, mode), (v, lo, hi, st) in worst.items()
        if len(covered[run]) >= stages
    ]


def _key_hi(loss: tuple[float, float, float, int]) -> float:
    return loss[2] if math.isfinite(loss[2]) else math.inf


def _board_power_cap(s: Source) -> list[Candidate]:
    """The highest gated block's median board power over the board's recorded power cap, minus
    1 (only a result that records ``machine.power_limit_w``). "Within the cap" is about every
    block, not an average, so the figure is that one block's reading, its own bounds."""
    cap = _num((s.data.get("machine") or {}).get("power_limit_w")) if _is_bench(s) else math.nan
    if not math.isfinite(cap) or cap <= 0:
        return []
    blocks = [
        b for b in s.data.get("blocks", [])
        if b.get("mode") in GATED_MODES and math.isfinite(_num(b.get("power_w")))
    ]  # fmt: skip
    if not blocks:
        return []
    top = max(blocks, key=lambda b: _num(b["power_w"]))
    frac = _num(top["power_w"]) / cap - 1.0
    what = (
        f"{run_label(top['run'])}, the highest of {len(blocks)} gated blocks "
        f"({top['mode']}, stage {top['stage']}): {_num(top['power_w']):.0f} W of {cap:.0f} W"
    )
    return [Candidate(s, what, frac, frac, frac)]


def _instrumentation(s: Source) -> list[Candidate]:
    """The instrument's cost of a step in ``bench_timing_overhead.py``'s paired blocks (those
    with an interval: 50-100 block pairs). A bench run's own timed-vs-plain row (five blocks
    of one stage, beside peers whose pace drifts) is a sanity check, not read here."""
    out = []
    if s.data.get("benchmark") == "timing_overhead":
        for case in s.data.get("cases", []):
            o, cfg = case.get("overhead_frac"), case.get("config", {})
            if isinstance(o, dict):
                out.append(Candidate(
                    s, f"one-stage GPT, d_model {cfg.get('d_model')}, seq {cfg.get('seq_len')}",
                    _num(o["value"]), _num(o["lo"]), _num(o["hi"])))  # fmt: skip
    return out


def _zero_bubble(s: Source) -> bool:
    return _is_bench(s) and "ZeroBubble" in str(s.data["config"].get("schedule", ""))


def _bubble_schedule(s: Source) -> bool:
    """A bench result of a schedule with bubbles (1F1B and the like): the harvest goals' own.
    A zero-bubble schedule's residual idle has its goal."""
    return _is_bench(s) and not _zero_bubble(s)


_WHERE_IDLE = (
    "2026-12-04, latest: where the idle time goes, and two levers against it; on the H100, "
    "2026-12-06, afternoon: finer steps and a narrower guard with the peers held fixed, and "
    "where the tail goes; evening: past the predicted end, and the feedback predictor at "
    "M = 8; and night: a second task on the leftovers; 2026-12-07, later: every stage at M = 8 "
    "and M = 4 with a task on the leftovers (each step size's speed in the bubbles); a replay: "
    "what stands between the harvest and all of the bubble time; late morning: a guard that "
    "collapsed and what it cost, a group's guard; early afternoon: a step group's guard per "
    "call on the GPU, and which bubbles' ends training waits on; late afternoon: the image "
    "task's band step, in blocks and graphed; night: the first checkpoint's hold, in the "
    "ledgers and out of the blocks; 2026-12-08: every stage at M = 8 with the first "
    "checkpoints out of the blocks"
)
_OVERHEAD = '2026-12-03, "Overhead with every stage harvesting" and "Worst stage"'
_TAILS = "2026-12-04, last: the restructured tree, tails and energy, quiet slots side by side"
_EDGES = (
    '2026-12-03, "Bubble-edge latency on the GPU host"; 2026-12-04, later, "Waiting for '
    "edges: sleeping or polling\"; on the H100, 2026-12-07, early afternoon: the host's "
    "path run cold"
)

#: One row per goal. The five thresholds each bench result records (``bench.profiles.GOALS``)
#: are read from there; the rest are the goals BENCHMARKS.md states beside its results.
GOALS: tuple[Goal, ...] = (
    *(
        Goal(f"harvest of the measured idle, every stage, M = {m}", "min",
             RECORDED_GOALS["harvest_of_limit_frac_min"], "frac",
             _deciding_stage("min", "harvest_of_measured_idle", every_stage=True, m=m,
                             keep=_bubble_schedule),
             _WHERE_IDLE)
        for m in (4, 8)
    ),
    Goal("training overhead, mean per stage", "max", RECORDED_GOALS["overhead_mean_frac_max"],
         "frac", _pipeline("overhead_one_stage_mean_frac", every_stage=True), _OVERHEAD),
    Goal("training overhead, worst stage", "max", RECORDED_GOALS["overhead_worst_frac_max"],
         "frac", _deciding_stage("max", "overhead", every_stage=True), _OVERHEAD),
    Goal("training overhead, all stages at once (estimate)", "max",
         RECORDED_GOALS["overhead_all_stages_frac_max"], "frac",
         _pipeline("overhead_all_stages_estimate_frac", every_stage=True), _OVERHEAD),
    Goal("p99 step-time inflation, every stage", "max", 0.005, "frac",
         _deciding_stage("max", "step_p99_inflation", every_stage=True), _TAILS),
    Goal("SM clock loss against vanilla, every stage", "max", 0.01, "frac", _clock_loss, _TAILS),
    Goal("board power", "max", 0.0, "cap", _board_power_cap,
         "each gated block's board power (NVML) against the cap its result records "
         "(machine.power_limit_w; results before 2026-12-05 did not record the cap)"),
    Goal("bubble edge → side-task step, p50 (end to end)", "max", 0.050, "ms",
         _pipeline("latency_p50_ms", every_stage=False), _EDGES),
    Goal("bubble edge → side-task step, p99 (end to end)", "max", 0.200, "ms",
         _pipeline("latency_p99_ms", every_stage=False), _EDGES),
    Goal("bubble end → no new side-task step, p99", "max", 0.200, "ms",
         _pipeline("pause_p99_ms", every_stage=False), _EDGES),
    Goal("FreeRide-formula saving, overhead-corrected", "min",
         RECORDED_GOALS["saving_corrected_frac_min"], "frac",
         _pipeline("saving_corrected_frac", every_stage=True),
         "2026-12-03, \"FreeRide's cost formula\""),
    Goal("zero-bubble residual idle harvested", "min", 0.60, "frac",
         _deciding_stage("min", "harvest_of_measured_idle", every_stage=False,
                         keep=_zero_bubble),
         "2026-12-04, newest, \"Zero-bubble peers, and peers that last what they stand for\"; "
         "on the H100, 2026-12-07, last: the zero-bubble schedule with a task on the leftovers "
         "(its bubbles replayed); late afternoon: the image task's band step, in blocks and "
         "graphed"),
    Goal("instrumentation, share of step time (timing benchmark)", "max", 0.002, "frac",
         _instrumentation,
         "2026-12-04, later, \"What timing costs a CUDA rank\" and \"Quiet slots, and the cost "
         "on a compute-bound stage\""),
)  # fmt: skip


# -- choosing and writing ---------------------------------------------------------------------


def goal_rows(sources: Sequence[Source], goals: Sequence[Goal] = GOALS) -> list[GoalStatus]:
    """Each goal with its best and latest candidate over ``sources`` (see the module doc)."""
    out = []
    for goal in goals:
        found = [c for s in sources for c in goal.figures(s)]
        if not found:
            out.append(GoalStatus(goal, None, None))
            continue
        best = min(found, key=lambda c: _rank(goal, c))
        newest = max(c.source.date for c in found)
        latest = min((c for c in found if c.source.date == newest), key=lambda c: _rank(goal, c))
        out.append(GoalStatus(goal, best, latest))
    return out


def _threshold(goal: Goal) -> str:
    sign = "≤" if goal.kind == "max" else "≥"
    if goal.unit == "ms":
        return f"{sign} {goal.threshold * 1e3:.0f} µs"
    if goal.unit == "cap":
        return "within the board's power cap"
    return f"{sign} {fmt_pct(goal.threshold, 1)}"


def _figure(goal: Goal, c: Candidate | None, peer_fix_date: str | None) -> str:
    if c is None:
        return NOT_RECORDED
    if goal.unit == "ms":
        v, lo, hi = (x * 1e3 for x in (c.value, c.lo, c.hi))
        figure = fmt_interval(v, lo, hi, 0, pct=False) + " µs"
    elif goal.unit == "cap":  # one block's reading: no interval to show
        figure = fmt_pct(c.value, 2, signed=True) + " against the cap"
    else:
        figure = fmt_interval(c.value, c.lo, c.hi, 2, signed=goal.kind == "max")
    when = c.source.date[:16].replace("T", " ")
    fix = f" {PEER_FIX_NOTE}" if before_peer_fix(c.source, peer_fix_date) else ""
    return f"{figure}: {c.what}; `{c.source.name}`, {when}{fix}"


def _met(status: GoalStatus) -> str:
    if status.best is None:
        return NOT_RECORDED
    best = "**yes**" if status.met else "no"
    if status.latest is not None and status.latest is not status.best:
        best += " (latest: " + ("**yes**" if clears(status.goal, status.latest) else "no") + ")"
    return best


def goal_table(sources: Sequence[Source], *, peer_fix_date: str | None = None) -> list[str]:
    """BENCHMARKS.md's "Where each goal stands": one row per goal, then the selection rule.

    Args:
        peer_fix_date: the recorded date of the first result with fixed emulated peers; a
            figure from an emulated-peer bench result recorded before it is marked
            "(before the peer fix)".
    """
    rows = [
        [f"{s.goal.name} {_threshold(s.goal)}", _figure(s.goal, s.best, peer_fix_date),
         _figure(s.goal, s.latest, peer_fix_date), _met(s), s.goal.hindrance]
        for s in goal_rows(sources)
    ]  # fmt: skip
    return [
        *md_table(
            [
                "goal",
                "best figure so far [95%]: where from",
                "latest figure [95%]: where from",
                "met?",
                "what stands in the way is measured in",
            ],
            rows,
        ),
        "",
        *textwrap.wrap(SELECTION_RULE, 100),
    ]
