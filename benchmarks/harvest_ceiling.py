"""What stands between a stage's harvest and all of its bubble time: its bubbles replayed.

A stage's harvest of its announced bubbles falls short of 100% for four reasons, and the idle
split (``core.idle_use``) cannot tell them apart. This replays each bubble of a bench run's
bubble ledger (``benchmarks/bubble_ledger.py``: every announced bubble of a gated block, its
length, the rank's prediction and the steps in it) through the task host's rule for choosing
steps, with the steps' own times from the same block, and changes one thing at a time:

1. **the rank's prediction** (the model's check): each task steps as its host does, to the end
   the rank predicted; set beside what the block really harvested, it says how far the model
   is to be trusted;
2. **each bubble's true end**: a prediction that is never wrong. Its gain over (1) is what the
   prediction costs (a bubble that outlived its prediction, one shorter than it);
3. **and no margin**: each step guarded by its own time only, not by the budget's margin. Its
   gain over (2) is what the guard costs (an upper bound: a replayed step lasts its mean, so
   none overruns; a real step longer than its mean would, and the replay does not charge it);
4. **at the task's speed alone**: the time under (3)'s steps valued at the task's dedicated
   speed. Its gain over (3) is what the steps' own speed costs (a small step pays a fixed part
   a large one spreads; negative where steps run faster in bubbles than alone);

and 100% less (4) is what no step rule reaches: the edge's latency before the first step, the
host's gaps between steps, and each bubble's last milliseconds, too short for the smallest
step.

The rule replayed is ``sidetasks.host.iterative`` [Note: step sizes] and [Note: leftovers]: at
each launch the largest size whose guard fits what is left of the bubble, the smallest size's
guard checked first (``core.budget.should_step``); a size's guard is the smallest size's guard
at entry scaled by the sizes' median step times (``core.budget.sized_budget_ns``'s proportion);
launching stops once the bubble has ended; the stage's main task goes first and, where it stops
with the bubble still open, the task on its leftovers takes the rest, after the block's median
hand-on gap. A task of one step size (a segment's task whose largest size is 1, or, for a task
on the leftovers, one whose records covered several calls, where the ledger says, else one
whose steps' progress does not double from size to size) steps in groups by [Note: step
groups]: as many steps as the group's length holds by the median step, and as the bubble holds
with the last one's guard kept, a group of n lasting a line fitted to the block's groups. Per
block and task, each step size's time is the mean of that block's steps of the size (sizes with
at least three steps), the first step starts at the block's median offset, and steps follow
each other after the median gap between them. Each step counts its progress, valued at the
task's speed alone (the segment's dedicated speed): harvest = that time over the bubbles' time.
Not modelled: a batch's end, which may hold a vision task to a smaller size than fits; the
guard's drift within a block (the median is taken); profiling. A step is counted in the bubble
it started in.

Every replay also counts, in the arm to the rank's prediction, the share of the stage's
replayed steps (both tasks') that end past their bubble's end (``predicted_overrun``; each step
lasting its block's mean, so an estimate of the overruns a rule lets through, not of what they
would cost training). With ``--guard-ms TASK=MS`` the named task is replayed on that guard at
entry instead of its block's (its larger sizes' in proportion): another guard's harvest, and
its overruns.

Figures are per block (each gated block of a stage: at least 5), with their mean and 95%
t-interval over the blocks (``core.intervals.mean_interval``). Arithmetic over recorded
bubbles and steps: no task runs.

    python benchmarks/harvest_ceiling.py RESULT.json LEDGER.json --out ceiling.json
    python benchmarks/harvest_ceiling.py RESULT LEDGER --guard-ms pagerank=0.68 --out c.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_output import command_line, write_results

from freeride_lab.bench.results import segment_tasks
from freeride_lab.core.intervals import mean_interval

#: The arms, in the order they change one thing each (see the module's docstring).
ARMS = ("observed", "predicted", "true_end", "no_margin", "at_speed_alone")
#: What each arm's gain over the one before it measures, per block: (from, to).
COSTS = {
    "the model's error": ("observed", "predicted"),
    "the prediction": ("predicted", "true_end"),
    "the guard's margin": ("true_end", "no_margin"),
    "the steps' speed": ("no_margin", "at_speed_alone"),
}
#: What the last arm leaves: 100% less its time under steps.
BEYOND = "beyond any rule"
#: The share of the ``predicted`` arm's steps that end past their bubble's end.
OVERRUN = "predicted_overrun"


@dataclass(frozen=True, slots=True)
class Size:
    """One step size of a task in a block: its progress, mean time and guard (ms)."""

    progress: float
    ms: float
    guard_ms: float


@dataclass(frozen=True, slots=True)
class Groups:
    """A task that steps in groups (one step size): a group of n steps lasts ``base_ms`` +
    n x ``step_ms`` (fitted to the block's groups) and is at most ``group_ms`` long by the
    median step (``median_ms``), keeping its last step's guard."""

    unit: float  # one step's progress
    base_ms: float
    step_ms: float
    median_ms: float
    group_ms: float


@dataclass(frozen=True, slots=True)
class Menu:
    """A task's steps in one block, as the replay takes them."""

    sizes: tuple[Size, ...]  # smallest first
    first_ms: float  # the first step's offset from the bubble's start
    gap_ms: float  # from one step's end to the next one's start
    per_ms: float  # its speed alone, progress per ms
    groups: Groups | None = None  # a task of one size stepping in groups


def _own_steps(bubble: Mapping[str, Any]) -> list[list[Any]]:
    """The steps that started in ``bubble`` (a step that spans several bubbles is listed in
    each: it counts in its first)."""
    return [s for s in bubble["steps"] if 0 <= s[1] < bubble["length_ms"]]


def steps_by_task(bubble: Mapping[str, Any]) -> dict[str, list[list[Any]]]:
    """Each task's steps that started in ``bubble``, in time order."""
    by_task: dict[str, list[list[Any]]] = defaultdict(list)
    for s in sorted(_own_steps(bubble), key=lambda s: s[1]):
        by_task[s[0]].append(s)
    return by_task


def gaps_ms(steps: Sequence[Sequence[Any]]) -> list[float]:
    """From each of one task's steps in a bubble (in time order) to the next: end → start."""
    return [z[1] - a[2] for a, z in itertools.pairwise(steps)]


def menus(
    bubbles: Sequence[Mapping[str, Any]],
    main: str,
    per_s: Mapping[str, float],
    grouped: Mapping[str, bool],
    group_ms: float,
    guard_ms: Mapping[str, float] | None = None,
) -> tuple[dict[str, Menu], float | None]:
    """Each task's ``Menu`` in one block's ``bubbles`` (tasks with no size of three steps, or no
    speed alone, are left out), and the median hand-on gap (ms; None if never seen).
    ``grouped`` says which tasks step in groups (a task it does not name: whether a record
    covered several calls, where the ledger says, else ``steps_in_groups``); ``guard_ms`` puts
    a task it names on that guard at entry instead of the block's (its larger sizes' in
    proportion, as the host's)."""
    times: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    guards: dict[str, list[float]] = defaultdict(list)
    calls: dict[str, int] = {}  # the most calls one record covered, where the ledger says
    gaps: dict[str, list[float]] = defaultdict(list)
    firsts: dict[str, list[float]] = defaultdict(list)
    handons: list[float] = []
    for b in bubbles:
        by_task = steps_by_task(b)
        for task, steps in by_task.items():
            for s in steps:
                times[task][s[4]].append(s[2] - s[1])
                guards[task].append(s[3])
                if len(s) > 5:
                    calls[task] = max(calls.get(task, 1), int(s[5]))
            gaps[task].extend(gaps_ms(steps))
        for task, steps in by_task.items():
            if task == main or main not in by_task:
                firsts[task].append(steps[0][1])
            else:
                handons.append(steps[0][1] - by_task[main][-1][2])
    out = {}
    for task, by_progress in times.items():
        first = firsts[task] or firsts[main]  # a leftovers task never alone: as the main's
        if not per_s.get(task) or not first:
            continue
        guard = (guard_ms or {}).get(task) or statistics.median(guards[task])
        in_groups = grouped.get(task, calls[task] > 1 if task in calls else None)
        if in_groups is None:  # a ledger without calls: read from the steps' progress
            in_groups = steps_in_groups(by_progress)
        groups = _groups(by_progress, group_ms) if in_groups else None
        if groups is not None:
            sizes: tuple[Size, ...] = (Size(groups.unit, groups.median_ms, guard),)
        else:
            timed = sorted((p, ms) for p, ms in by_progress.items() if len(ms) >= 3)
            if not timed:
                continue
            smallest = statistics.median(timed[0][1])
            sizes = tuple(
                Size(p, statistics.fmean(ms), guard * statistics.median(ms) / smallest)
                for p, ms in timed
            )
        out[task] = Menu(
            sizes,
            statistics.median(first),
            statistics.median(gaps[task]) if gaps[task] else 0.0,
            per_s[task] / 1e3,
            groups,
        )
    return out, (statistics.median(handons) if handons else None)


def steps_in_groups(ms_by_progress: Mapping[float, Sequence[float]]) -> bool:
    """True where a task's steps look like groups of one step size: a progress that is not
    the smallest's times a power of two (a sized task's steps double: 1, 2, 4 slices)."""
    smallest = min(ms_by_progress)
    ratios = [p / smallest for p in ms_by_progress]
    return any(abs(r - 2 ** round(math.log2(r))) > 1e-6 for r in ratios)


def _groups(ms_by_progress: Mapping[float, Sequence[float]], group_ms: float) -> Groups | None:
    """A grouped task's ``Groups`` from its groups' progress and times; None for fewer than
    three groups."""
    unit = min(ms_by_progress)
    points = [(p / unit, ms) for p, times in ms_by_progress.items() for ms in times]
    if len(points) < 3:
        return None
    n, ms = [x for x, _ in points], [y for _, y in points]
    if len(set(n)) > 1:
        step_ms, base_ms = statistics.linear_regression(n, ms)
    else:
        step_ms, base_ms = statistics.fmean(ms) / n[0], 0.0
    median_ms = statistics.median(y / x for x, y in points)
    return Groups(unit, base_ms, step_ms, median_ms, group_ms)


def pack(
    menu: Menu, start_ms: float, end_ms: float, length_ms: float, *, margin: bool = True
) -> tuple[float, float, float, tuple[int, int]]:
    """One task's steps in a bubble from ``start_ms``, planned to ``end_ms``, launched while
    the bubble (``length_ms``) lasts: (when the last step ended, or ``start_ms`` without one;
    the time under steps within the bubble; their work, in ms of the task's speed alone; the
    steps launched and how many of them end past the bubble's end, overruns of a step that
    lasts its mean). ``margin=False`` guards each step by its own time."""
    now, last, under, work, launched, crossed = start_ms, None, 0.0, 0.0, 0, 0
    sizes, groups = menu.sizes, menu.groups
    guard = [s.guard_ms if margin else s.ms for s in sizes]
    while now < length_ms and end_ms - now > guard[0]:
        if groups is not None:  # [Note: step groups]: the group's last step keeps its guard
            by_length = _whole(groups.group_ms / groups.median_ms)
            by_bubble = 1 + _whole((end_ms - now - guard[0]) / groups.median_ms)
            n = max(1, min(by_length, by_bubble))
            ms, progress = groups.base_ms + n * groups.step_ms, n * groups.unit
        else:
            i = max(k for k in range(len(sizes)) if k == 0 or end_ms - now > guard[k])
            ms, progress = sizes[i].ms, sizes[i].progress
        under += min(now + ms, length_ms) - now
        work += progress / menu.per_ms
        launched, crossed = launched + 1, crossed + (now + ms > length_ms)
        last = now + ms
        now = last + menu.gap_ms
    return (start_ms if last is None else last), under, work, (launched, crossed)


def _whole(x: float) -> int:
    """``x`` rounded down, a ratio of times in ms read as the host's integer ns would."""
    return math.floor(x + 1e-9)


def replay_block(
    bubbles: Sequence[Mapping[str, Any]],
    per_s: Mapping[str, float],
    main: str,
    leftovers: str | None,
    grouped: Mapping[str, bool],
    group_ms: float,
    guard_ms: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Harvest (work over bubble time) of one block under each arm, the time under steps of
    the ``at_speed_alone`` arm, and the share of the ``predicted`` arm's steps that end past
    their bubble's end (``OVERRUN``)."""
    menus_, handon_ms = menus(bubbles, main, per_s, grouped, group_ms, guard_ms)
    total = sum(b["length_ms"] for b in bubbles)
    observed = sum(s[4] / per_s[s[0]] * 1e3 for b in bubbles for s in _own_steps(b)
                   if per_s.get(s[0]))  # fmt: skip
    out = {"observed": observed / total}
    for arm in ARMS[1:4]:
        work = under = 0.0
        steps = [0, 0]  # launched, crossed the bubble's end
        for b in bubbles:
            length, predicted = b["length_ms"], b["predicted_ms"]
            if arm == "predicted" and predicted is None:
                continue  # no step without a prediction
            end = predicted if arm == "predicted" else length
            margin = arm != "no_margin"
            now, used = 0.0, False
            if main in menus_:
                m = menus_[main]
                last, u, w, (n, x) = pack(m, m.first_ms, end, length, margin=margin)
                now, used, under, work = last, w > 0, under + u, work + w
                steps = [steps[0] + n, steps[1] + x]
            if leftovers in menus_ and now < length:
                m = menus_[leftovers]
                start = now + (handon_ms or 0.0) if used else m.first_ms
                _, u, w, (n, x) = pack(m, start, end, length, margin=margin)
                under, work = under + u, work + w
                steps = [steps[0] + n, steps[1] + x]
        out[arm] = work / total
        if arm == "predicted":
            out[OVERRUN] = steps[1] / steps[0] if steps[0] else 0.0
        if arm == "no_margin":
            out["at_speed_alone"] = under / total
    return out


def stage_ceiling(
    stage: Mapping[str, Any],
    main: str,
    leftovers: str | None,
    per_s: Mapping[str, float],
    grouped: Mapping[str, bool],
    group_ms: float,
    guard_ms: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Per gated block of one stage's ledger, the arms' figures; and their means [95%] and
    the paired differences between them (``COSTS``)."""
    blocks: dict[tuple[str, int], list[Mapping[str, Any]]] = defaultdict(list)
    for b in stage["bubbles"]:
        blocks[(b["mode"], int(b["repeat"]))].append(b)
    rows = []
    for (mode, repeat), bubbles in sorted(blocks.items()):
        figures = replay_block(bubbles, per_s, main, leftovers, grouped, group_ms, guard_ms)
        rows.append({"mode": mode, "repeat": repeat, "bubbles": len(bubbles),
                     **{k: round(v, 4) for k, v in figures.items()}})  # fmt: skip
    summary = {arm: mean_interval([r[arm] for r in rows]).record() for arm in (*ARMS, OVERRUN)}
    costs = {what: mean_interval([r[b] - r[a] for r in rows]).record()
             for what, (a, b) in COSTS.items()}  # fmt: skip
    costs[BEYOND] = mean_interval([1.0 - r[ARMS[-1]] for r in rows]).record()
    return {"main": main, "leftovers": leftovers, "blocks": rows, "summary": summary,
            "costs": costs}  # fmt: skip


def speeds_alone(result: Mapping[str, Any]) -> dict[tuple[int, str], float]:
    """(stage, task) → its dedicated speed (progress per second), for each segment's task
    and the task on its leftovers."""
    return {(int(seg["stage"]), one["task"]): float(one["dedicated_per_s"])
            for seg in _segments(result) for one in segment_tasks(seg)
            if one.get("task") and one.get("dedicated_per_s")}  # fmt: skip


def _segments(result: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [s for run in result["runs"] for s in run["segments"] if s.get("task")]


def ceiling(
    result: Mapping[str, Any],
    ledger: Mapping[str, Any],
    guard_ms: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """``stage_ceiling`` for every run and stage of ``ledger`` (the ledger of ``result``),
    with the tasks ``guard_ms`` names on those guards at entry."""
    alone = speeds_alone(result)
    group_ms = float(result["config"].get("step_group_ms") or 0.0)
    # a segment's task of one step size steps in groups; a leftovers task: by its steps
    grouped = {(int(s["stage"]), s["task"]): group_ms > 0 and int(s.get("top_step_size") or 1) == 1
               for s in _segments(result) if "top_step_size" in s}  # fmt: skip
    tasks = {(b["run"], int(b["stage"])): (b["task"], b.get("leftovers_task") or None)
             for b in result["blocks"]}  # fmt: skip
    out = {}
    for key, stage in ledger["stages"].items():
        run, r = key.rsplit("/", 1)
        if (run, int(r)) not in tasks:
            raise SystemExit(
                f"the ledger's stage {key} has no block in the result: pass the bench result "
                "the ledger was read from (bubble_ledger.py's first argument)"
            )
        main, leftovers = tasks[(run, int(r))]
        per_s = {task: s for (at, task), s in alone.items() if at == int(r)}
        mine = {task: g for (at, task), g in grouped.items() if at == int(r)}
        out[key] = stage_ceiling(stage, main, leftovers, per_s, mine, group_ms, guard_ms)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", type=Path, help="a freeride-lab bench result (JSON)")
    parser.add_argument("ledger", type=Path, help="its bubble ledger (bubble_ledger.py)")
    parser.add_argument("--out", type=Path, required=True, help="write the figures as JSON here")
    parser.add_argument("--guard-ms", action="append", default=[], metavar="TASK=MS",
                        help="replay TASK with this guard at entry instead of its block's "
                        "(repeatable)")  # fmt: skip
    args = parser.parse_args(argv)
    guard_ms = {}
    for given in args.guard_ms:
        task, _, ms = given.partition("=")
        try:
            guard_ms[task] = float(ms)
        except ValueError:
            parser.error(f"--guard-ms {given!r}: TASK=MS, e.g. pagerank=0.68")
        if not task or not 0 < guard_ms[task] < math.inf:
            parser.error(f"--guard-ms {given!r}: TASK=MS with MS > 0, e.g. pagerank=0.68")
    found = ceiling(
        json.loads(args.result.read_text()), json.loads(args.ledger.read_text()), guard_ms
    )
    for key, one in found.items():
        s = one["summary"]
        print(key, one["main"], one["leftovers"] or "-",
              " ".join(f"{arm} {s[arm]['value']:.1%}" for arm in ARMS))  # fmt: skip
    record = {"command": command_line(), "result": args.result.name,
              "ledger": args.ledger.name, "guard_ms": guard_ms, "stages": found}  # fmt: skip
    write_results(record, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
