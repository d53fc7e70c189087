"""Which bubbles' ends training waits on: each announced bubble's float, from a bench run.

A side task's step that runs past its bubble's end delays the action after the bubble. The
step pays for that only if that action is on the step's critical path; otherwise the delay is
absorbed by a wait further on. This reads a bench result and its run directories (every rank's
timed actions, the real stage's announced bubbles) and, step by step, computes each action's
float with ``core.plan.critical.action_floats``: how much later it could have ended before
the next step would start later. A bubble's float is that of the real rank's first action after
the bubble's end: how far past its end a side-task step could have run for free.

Per step the deadlines come from the step boundary: every rank starts its next step right after
the all-reduce that agrees on it, so the barrier is the earliest next-step start of any rank,
and a rank's last action may end no later than the barrier less the rank's own work after it
(the real rank's optimizer step as its step record times it; a sleeping rank's calibrated
optimizer time, which it sleeps before the all-reduce). The lags are measured from the run: a
rank's least gap between two of its actions (dispatch) and the least time from an action's end
to the start of the action on another rank that waits for it (a message's trip), each the 5th
percentile over the run. Sends tie their rank to the receiver's where the planner says the
schedule waits for them before the step's end (1F1B's: gloo completes a send once the receiver
has posted its receive, ``core.plan.critical``). An action that started later than all of
that allows (2-3 ms at the median on the middle ranks of an H100 run at M = 8: trips longer
than the least one, host work no record times) is read as held by its latest dependency
([Note: as run] there), so the floats are the room the schedule as it ran left, not room made
of waits the model cannot explain. The step boundary
takes more than the optimizer (the all-reduce, the real rank's events: 2-6 ms in an H100 run at
M = 8), which no record times; the step's least float is taken to be that and subtracted from
every float of the step, so the actions of its critical path have none.

Per run, real stage and mode (vanilla blocks: the schedule as it runs without side tasks;
gated blocks: as it ran with them): per slot, its bubbles' length and float (p10, p50, ms), and
over the stage: the share of bubble time in bubbles whose float is at least 1, 2 and 5 ms; and
in gated blocks with a bubble ledger (``bubble_ledger.py``) beside it, each step that ran past
its bubble's end: how many ran past by no more than their bubble's float.

Run it where the bench ran, before the run directories go:

    python benchmarks/bubble_floats.py r.json --run-root /tmp/runs --ledger ledger.json --out f.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
from bench_output import add_run_arguments, bench_runs, command_line, write_results

from freeride_lab.bench.stats import GATED_MODES
from freeride_lab.core.announced import announced_spans
from freeride_lab.core.plan import plan_arrays
from freeride_lab.core.plan.critical import action_floats, send_waits_of
from freeride_lab.lab.frames import actions_frame

LONGEST_MS = 1000.0  # longer bubbles are the bench's pauses (solo phases), not training's
FLOAT_MARKS_MS = (1.0, 2.0, 5.0)
_AFTER_NS = 200_000  # an action that starts this much before a bubble's end stamp still follows it


def lags_ns(actions: pd.DataFrame) -> tuple[int, int]:
    """(dispatch, comm) in ns: the 5th percentile of a rank's gaps between two consecutive
    actions of one step, and of the time from an action's end to the start of the action on
    another rank that waits for it (a negative time, clocks apart, does not count).

    >>> a = pd.DataFrame([(0, 0, 0, "F", 0, 0, 10), (0, 0, 0, "F", 1, 12, 20),
    ...                   (0, 1, 1, "F", 0, 15, 25), (0, 1, 1, "F", 1, 27, 35)],
    ...                  columns=["step", "rank", "stage", "action", "microbatch",
    ...                           "start_ns", "end_ns"])
    >>> lags_ns(a)
    (2, 5)
    """
    a = actions.sort_values(["step", "rank", "start_ns"], kind="stable")
    same = (a["step"].to_numpy()[1:] == a["step"].to_numpy()[:-1]) & (
        a["rank"].to_numpy()[1:] == a["rank"].to_numpy()[:-1]
    )
    gaps = (a["start_ns"].to_numpy()[1:] - a["end_ns"].to_numpy()[:-1])[same]
    fwd = a[a["action"] == "F"]
    pairs = fwd.merge(fwd.assign(stage=fwd["stage"] + 1), on=["step", "stage", "microbatch"],
                      suffixes=("", "_up"))  # fmt: skip
    trips = (pairs["start_ns"] - pairs["end_ns_up"]).to_numpy()
    trips = trips[(trips >= 0) & (pairs["rank"] != pairs["rank_up"]).to_numpy()]
    gaps = gaps[gaps >= 0]
    dispatch = int(np.percentile(gaps, 5)) if gaps.size else 0
    comm = int(np.percentile(trips, 5)) if trips.size else 0
    return dispatch, comm


def step_deadlines_ns(
    steps: pd.DataFrame,
    actions: pd.DataFrame,
    step: int,
    real: int,
    optimizer_ns: Mapping[int, int],
) -> dict[int, int] | None:
    """Per rank, the latest its last action of ``step`` may end (see the module's text); None
    where the next step's start is not recorded."""
    nxt = steps[steps["step"] == step + 1]
    if nxt.empty:
        return None
    barrier = int(nxt["start_ns"].min())
    mine = steps[steps["step"] == step].set_index("rank")
    last_end = actions[actions["step"] == step].groupby("rank")["end_ns"].max()
    out = {}
    for rank, end in last_end.items():
        r = int(rank)
        if r == real and r in mine.index:
            tail = int(mine.at[r, "optimizer_end_ns"]) - int(end)
        else:
            tail = int(optimizer_ns.get(r, 0))
        out[r] = barrier - max(tail, 0)
    return out


class RunTimes(NamedTuple):
    """What every stage's floats of one run read: its actions and step records, its lags, each
    rank's calibrated optimizer time and the plan's send waits."""

    actions: pd.DataFrame
    steps: pd.DataFrame
    dispatch_ns: int
    comm_ns: int
    optimizer_ns: Mapping[int, int]
    waits: Mapping[tuple[int, str, int], int]


def run_times(
    result: Mapping[str, Any], run: Mapping[str, Any], events: Sequence[Mapping[str, Any]]
) -> RunTimes:
    """``RunTimes`` of one run of ``result`` from its events."""
    actions = actions_frame(events)
    steps = pd.DataFrame(
        [(int(e["step"]), int(e["rank"]), int(e["start_ns"]), int(e["optimizer_end_ns"]))
         for e in events if e.get("kind") == "step"],
        columns=["step", "rank", "start_ns", "optimizer_end_ns"],
    )  # fmt: skip
    optimizer_ns = {int(c["rank"]): round(float(c["optimizer_ms"]) * 1e6)
                    for c in run.get("calibration") or []}  # fmt: skip
    plan = plan_arrays(str(run["schedule"]), int(result["config"]["stages"]),
                       int(run["microbatches"]), run.get("chunks"))  # fmt: skip
    return RunTimes(actions, steps, *lags_ns(actions), optimizer_ns, send_waits_of(plan))


def stage_floats(
    events: Sequence[Mapping[str, Any]],
    blocks: Sequence[Mapping[str, Any]],
    stage: int,
    times: RunTimes,
) -> list[dict[str, Any]]:
    """One row per bubble ``stage`` announced in ``blocks`` (any mode): its mode, step, slot,
    length, and float as run and with the least lags (ms; None where no action of the step
    follows it)."""
    actions, steps = times.actions, times.steps
    starts = {int(e["step"]): int(e["start_ns"]) for e in events
              if e.get("kind") == "step" and e.get("rank") == stage}  # fmt: skip
    spans = announced_spans(events, stage).spans
    rows = []
    for b in blocks:
        if int(b["stage"]) != stage:
            continue
        first = int(b["first_step"])
        lo, hi = starts.get(first), starts.get(first + int(b["steps"]))
        if lo is None or hi is None:
            continue
        for step in range(first, first + int(b["steps"])):
            one = actions[actions["step"] == step].reset_index(drop=True)
            deadlines = step_deadlines_ns(steps, actions, step, stage, times.optimizer_ns)
            if one.empty or deadlines is None:
                continue
            kwargs = {"deadlines_ns": deadlines, "dispatch_ns": times.dispatch_ns,
                      "comm_ns": times.comm_ns, "send_wait": times.waits}  # fmt: skip
            low = action_floats(one, as_run=True, **kwargs)  # type: ignore[arg-type]
            high = action_floats(one, **kwargs)  # type: ignore[arg-type]
            low -= low.min()  # the boundary's own time: the critical path has none
            high -= high.min()
            own = one.index[one["rank"] == stage]
            own_starts = one.loc[own, "start_ns"].to_numpy()
            for s in spans:
                if s.step != step or not lo <= s.start_ns < hi:
                    continue
                if (s.end_ns - s.start_ns) / 1e6 > LONGEST_MS:
                    continue
                after = np.flatnonzero(own_starts >= s.end_ns - _AFTER_NS)
                follows = int(own[after[0]]) if after.size else None
                rows.append({
                    "mode": b["mode"], "step": step, "slot": s.slot,
                    "length_ms": round((s.end_ns - s.start_ns) / 1e6, 3),
                    "float_ms": _ms(low, follows), "float_least_lags_ms": _ms(high, follows),
                })  # fmt: skip
    return rows


def _ms(floats: np.ndarray, i: int | None) -> float | None:
    """Action ``i``'s float in ms; None for no action or no deadline after it."""
    if i is None or not np.isfinite(floats[i]):
        return None
    return round(float(floats[i]) / 1e6, 3)


def summary(
    rows: Sequence[Mapping[str, Any]], overruns: Sequence[tuple[float, float]]
) -> dict[str, Any]:
    """Per slot, its bubbles' length and float quantiles (as run); the share of bubble time
    whose float is at least each of ``FLOAT_MARKS_MS``, as run and with the least lags (the
    lower and the upper bound); and of the steps that ran past their bubble's end
    (``overruns``: (how far past, the bubble's float as run) in ms), how many stayed within it."""
    known = [r for r in rows if r["float_ms"] is not None]
    total = sum(r["length_ms"] for r in known) or 1.0
    slots: dict[int, list[Mapping[str, Any]]] = {}
    for r in known:
        slots.setdefault(int(r["slot"]), []).append(r)
    return {
        "bubbles": len(rows),
        "with_float": len(known),
        "slots": {
            str(slot): {
                "bubbles": len(rs),
                "length_ms_p50": round(statistics.median(r["length_ms"] for r in rs), 3),
                "float_ms_p10": _p10([r["float_ms"] for r in rs]),
                "float_ms_p50": round(statistics.median(r["float_ms"] for r in rs), 3),
            }
            for slot, rs in sorted(slots.items())
        },
        "time_frac_float_at_least_ms": _shares(known, "float_ms", total),
        "time_frac_float_least_lags_at_least_ms": _shares(known, "float_least_lags_ms", total),
        "overruns": len(overruns),
        "overruns_within_float": sum(1 for past, room in overruns if past <= room),
    }


def _shares(rows: Sequence[Mapping[str, Any]], key: str, total: float) -> dict[str, float]:
    """The share of ``total`` bubble time in ``rows`` whose ``key`` float is at least each of
    ``FLOAT_MARKS_MS``."""
    return {
        f"{m:g}": round(sum(r["length_ms"] for r in rows if (r[key] or 0.0) >= m) / total, 4)
        for m in FLOAT_MARKS_MS
    }


def _p10(xs: Sequence[float]) -> float:
    xs = sorted(xs)
    return round(xs[int(0.1 * (len(xs) - 1))], 3)


def _overruns(
    ledger_rows: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]]
) -> list[tuple[float, float]]:
    """From a stage's bubble ledger: each gated bubble whose last side-task step ended past the
    bubble's end, as (how far past, the bubble's float) in ms, where its float is known."""
    room = {(r["step"], r["slot"]): r["float_ms"] for r in rows if r["float_ms"] is not None}
    out = []
    for b in ledger_rows:
        if not b["steps"] or (b["step"], b["slot"]) not in room:
            continue
        past = max(s[2] for s in b["steps"]) - b["length_ms"]
        if past > 0:
            out.append((past, room[(b["step"], b["slot"])]))
    return out


def floats(
    result: Mapping[str, Any], run_root: Path, ledger: Mapping[str, Any] | None
) -> dict[str, Any]:
    """Per run, real stage and mode of ``result``: its bubbles' floats and their ``summary``."""
    out: dict[str, Any] = {}
    for run, blocks, events in bench_runs(result, run_root):
        times = run_times(result, run, events)
        for stage in sorted({int(b["stage"]) for b in blocks}):
            key = f"{run['name']}/{stage}"
            rows = stage_floats(events, blocks, stage, times)
            led = (ledger or {}).get("stages", {}).get(key, {}).get("bubbles", [])
            out[key] = {}
            for mode in sorted({r["mode"] for r in rows}):
                mine = [r for r in rows if r["mode"] == mode]
                gated = [b for b in led if b["mode"] == mode] if mode in GATED_MODES else []
                out[key][mode] = {"summary": summary(mine, _overruns(gated, mine)),
                                  "bubbles": mine}  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(parser)
    parser.add_argument(
        "--ledger",
        type=Path,
        default=None,
        help="the result's bubble ledger (bubble_ledger.py), for its overruns",
    )
    parser.add_argument("--out", type=Path, required=True, help="write the floats as JSON here")
    args = parser.parse_args(argv)  # fmt: skip
    result = json.loads(args.result.read_text())
    ledger = json.loads(args.ledger.read_text()) if args.ledger else None
    found = floats(result, args.run_root, ledger)
    for key, modes in found.items():
        for mode, f in modes.items():
            s = f["summary"]
            low, high = (s[f"time_frac_float{k}_at_least_ms"] for k in ("", "_least_lags"))
            print(f"{key} {mode}: {s['with_float']} of {s['bubbles']} bubbles, time with a float "
                  f"of >= 1/2/5 ms: " + "/".join(f"{100 * v:.0f}%" for v in low.values())
                  + " (least lags: " + "/".join(f"{100 * v:.0f}%" for v in high.values()) + ")"
                  + (f"; overruns {s['overruns']}, within their float "
                     f"{s['overruns_within_float']}" if s["overruns"] else ""))  # fmt: skip
    write_results({"command": command_line(), "result": args.result.name, "stages": found},
                  args.out)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
