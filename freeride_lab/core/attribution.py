"""Bubble attribution: why a rank's measured bubble time is above the schedule's theory.

Every idle instant of a rank is one of three things, and ``attribute_bubbles`` splits each
bubble of the ``extract_bubbles`` table into them; the parts are >= 0 and sum to the bubble:

- ``schedule_ms``: idle that the schedule itself leaves on the rank, given the run's own
  measured action costs (the planner simulates the plan with them; ``core.plan``);
- ``peer_ms``: the rank was ready but an input from another rank was missing, beyond what
  the schedule implies, plus the input's transfer time;
- ``host_ms``: the rank's own overhead between actions when nothing it needed was missing
  (Python dispatch, posting sends and receives, event emission, batch loading).

    >>> import pandas as pd
    >>> acts = pd.DataFrame({"step": 0, "rank": [0, 1, 1, 0], "stage": [0, 1, 1, 0],
    ...                      "action": ["F", "F", "B", "B"], "microbatch": 0,
    ...                      "start_ms": [0.0, 1.5, 2.5, 4.5], "end_ms": [1.0, 2.5, 4.5, 6.5]})
    >>> parts = attribute_bubbles(acts, schedule="GPipe", stages=2, microbatches=1)
    >>> parts[["rank", "start_ms", "schedule_ms", "peer_ms", "host_ms"]].values.tolist()
    [[0.0, 1.0, 3.0, 0.5, 0.0], [1.0, 0.0, 1.0, 0.5, 0.0], [1.0, 4.5, 2.0, 0.0, 0.0]]

Rank 1's input arrived 0.5 ms after the schedule allows (peer wait); rank 0 then waited for
rank 1's backward 0.5 ms longer than the schedule implies.

[Note: bubble attribution]
A rank's timeline is its busy items (actions, and the optimizer when the ``steps`` table is
given) with idle spans between them; each span ends at the item the rank was about to run
(``next``; none after its last item). The bubbles of ``extract_bubbles`` are pieces of these
spans (cut at window edges), so a span is split once and its pieces inherit the split by
time. A span is [t0, t1).

Two things the rank may need from other ranks, each with the time it was produced and the
idle the schedule implies for it (its ``budget``):

- across a step boundary (the span starts in step s and ends in a later step or never),
  the end of step s on every rank, ``N_agree``: the latest busy end of any rank in step s
  (its optimizer with ``steps``, else its last action, i.e. the window end), since no rank
  passes the stop agreement before every rank finished step s. Budget: the rank's simulated
  wait for the slowest rank (last simulated end + median optimizer time, against the
  maximum of that over ranks);
- the data dependency of ``next`` if it ran on another rank, ``N_data``: the end of F of
  the same micro-batch on stage s-1 for an F on stage s, of B or I on stage s+1 for a B or
  I (``core.plan`` [Note: planner semantics]; a W, or a dependency on the rank itself
  as in V schedules, needs nothing from a peer). Budget: the simulated gap before ``next``
  on its rank (to the window start for a step's first action).

The simulation is ``simulate`` of the plan with the run's per-(stage, kind) median costs
(``Costs.from_actions``, no comm or dispatch). ``h``, the rank's dispatch time, is the
median of its spans inside a step that end at an action needing nothing from a peer
(fallback: the same over all ranks; 0 if none).

In time order the span is: the wait for the agreement, then the wait for the data, then
the rest. A wait lasts from where the span stands to the need's time (none if that time has
passed: nothing was missing); if there is one, its last ``min(budget, room left)`` ms are
schedule idle and what comes before is peer wait (the schedule idle sits at the end since
it is when the producer computes what the rank needs; at the boundary that keeps the
schedule's fill of step s+1 in step s+1's leading bubble). The schedule idle is the budget
even if the wait was shorter: a transfer that delayed the rank in one gap shortens its next
wait, and that shorter wait is still the schedule's idle, not a gain. A span in which
nothing was missing has no schedule idle, whatever the simulation says (the rank was behind
it). The rest of the span is the rank's own time if ``next`` needs no data from a peer
(everything was there: host overhead; this includes the agreement's own latency and event
emission after every rank finished the step); otherwise the rank's dispatch ran from t0
under the waits, so host overhead is only the part of ``h`` they did not hide, and the
rest is the input's transfer (send posting on the producer, the wire, the receive): peer.
A sleep on the producer between its action's end and its send lands in that transfer.

Consequences: a perfectly fed run (every action starts the moment the schedule allows it,
no overheads) is all schedule idle; a producer's host overhead shows as its own host time
and as peer wait on the ranks it feeds; a rank's own overhead that overlaps a wait is part
of the wait (the wait would have happened anyway). Busy items that overlap are merged.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from freeride_lab.core.bubbles import (  # one table toolkit for core
    _ACTION_COLUMNS,
    _empty,
    _require,
    _typed,
    extract_bubbles,
)
from freeride_lab.core.plan import Costs, simulate
from freeride_lab.core.schedule import Schedule
from freeride_lab.core.theory import NO_FORMULA, theory_bubble_fraction

__all__ = [
    "PART_COLUMNS",
    "attribute_bubbles",
    "attribution_by_rank",
    "attribution_by_step",
    "with_attribution",
]

PART_COLUMNS: tuple[str, ...] = ("schedule_ms", "peer_ms", "host_ms")
# ends of a span's segments: peer, schedule (agreement); peer, schedule (data); host
_SEGMENTS = ("agree_peer_end", "agree_end", "data_peer_end", "data_end", "host_end")

_BY_STEP_SCHEMA: dict[str, str] = {
    "step": "int64",
    "rank": "int64",
    "bubble_ms": "float64",
    "schedule_ms": "float64",
    "peer_ms": "float64",
    "host_ms": "float64",
}
_BY_RANK_SCHEMA: dict[str, str] = {
    "rank": "int64",
    "steps": "int64",
    "bubble_ms": "float64",
    "schedule_ms": "float64",
    "peer_ms": "float64",
    "host_ms": "float64",
    "span_ms": "float64",
    "measured_frac": "float64",
    "schedule_frac": "float64",
    "theory_frac": "float64",
}


def attribute_bubbles(
    actions: pd.DataFrame,
    bubbles: pd.DataFrame | None = None,
    *,
    steps: pd.DataFrame | None = None,
    schedule: str,
    stages: int,
    microbatches: int,
    chunks: int | None = None,
) -> pd.DataFrame:
    """The bubbles table with each bubble split into schedule, peer and host ms.

    See [Note: bubble attribution]. ``schedule_ms + peer_ms + host_ms == duration_ms`` for
    every row (up to float rounding), each part >= 0.

    Args:
        actions: the run's actions (columns step, rank, stage, action, microbatch, start_ms,
            end_ms), every rank on one clock.
        bubbles: ``extract_bubbles`` of the same ``actions`` and ``steps`` (any ``min_ms``);
            None computes it with ``min_ms=0`` (every idle instant).
        steps: the run's steps table (optimizer spans); None keeps to the step windows.
        schedule, stages, microbatches, chunks: the run's shape (``RunConfig``).

    Returns:
        ``bubbles``' columns, then schedule_ms, peer_ms, host_ms (float64). The parts are NaN
        when the schedule cannot be simulated from ``actions`` (e.g. a stage has not run an
        action yet).

    Raises:
        ValueError: missing columns or an invalid schedule / sizes.
    """
    _require(actions, _ACTION_COLUMNS, "actions")
    spec = Schedule.from_name(schedule)
    v = spec.resolve_chunks(chunks)
    if bubbles is None:
        bubbles = extract_bubbles(
            actions,
            steps=steps,
            schedule=spec.name,
            stages=stages,
            microbatches=microbatches,
            chunks=chunks,
        )
    _require(bubbles, ("rank", "start_ms", "end_ms", "duration_ms"), "bubbles")
    out = bubbles.copy()
    for c in PART_COLUMNS:
        out[c] = np.nan
    if out.empty or actions.empty:
        return out.astype(dict.fromkeys(PART_COLUMNS, "float64"))
    sim = _simulated_gaps(actions, spec, stages, microbatches, v)
    if sim is None:
        return out
    spans = _spans(actions, steps, sim)
    rows = out.reset_index(drop=True)
    rows["_order"] = np.arange(len(rows))
    rows = rows.sort_values("start_ms", kind="stable")
    spans = spans.sort_values(["t0", "t1"], kind="stable")
    joined = pd.merge_asof(
        rows[["_order", "rank", "start_ms", "end_ms", "duration_ms"]].astype(
            {"rank": "int64", "start_ms": "float64"}
        ),
        spans,
        left_on="start_ms",
        right_on="t0",
        by="rank",
        direction="backward",
    ).sort_values("_order")
    x, y = joined["start_ms"].to_numpy(), joined["end_ms"].to_numpy()
    t0 = joined["t0"].to_numpy()
    e = [joined[name].to_numpy() for name in _SEGMENTS]
    sched = _overlap(x, y, e[0], e[1]) + _overlap(x, y, e[2], e[3])
    peer = _overlap(x, y, t0, e[0]) + _overlap(x, y, e[1], e[2]) + _overlap(x, y, e[4], np.inf)
    dur = joined["duration_ms"].to_numpy(dtype=float)
    host = np.clip(dur - sched - peer, 0.0, None)
    found = ~np.isnan(t0)
    result = out.reset_index(drop=True)
    result["schedule_ms"] = np.where(found, sched, np.nan)
    result["peer_ms"] = np.where(found, peer, np.nan)
    result["host_ms"] = np.where(found, host, np.nan)
    result.index = out.index
    return result


def attribution_by_step(attributed: pd.DataFrame) -> pd.DataFrame:
    """Bubble ms and its three parts per (step, rank), from ``attribute_bubbles``' table.

    Columns, in order: step, rank (int64); bubble_ms, schedule_ms, peer_ms, host_ms
    (float64; the parts sum to bubble_ms). Sorted by step, rank.
    """
    _require(attributed, ("step", "rank", "duration_ms", *PART_COLUMNS), "attributed")
    if attributed.empty:
        return _empty(_BY_STEP_SCHEMA)
    g = attributed.groupby(["step", "rank"], sort=True)
    f = g[list(PART_COLUMNS)].sum(min_count=1)
    f["bubble_ms"] = g["duration_ms"].sum()
    return _typed(f.reset_index(), _BY_STEP_SCHEMA)


def attribution_by_rank(
    actions: pd.DataFrame,
    *,
    steps: pd.DataFrame | None = None,
    schedule: str,
    stages: int,
    microbatches: int,
    chunks: int | None = None,
    skip_steps: int = 1,
) -> pd.DataFrame:
    """Each rank's bubble ms and its parts summed over the steps after ``skip_steps``.

    The bubbles cover each step's whole span (window start to the next window start with
    ``steps``; the window otherwise), so ``measured_frac`` here (bubble_ms / span_ms) counts
    the boundary too and can exceed ``bubbles.summary``'s window fraction. ``schedule_frac``
    is schedule_ms / span_ms: what the schedule alone leaves idle with this run's costs;
    ``theory_frac`` is the uniform-cost formula (``theory_bubble_fraction``; NaN where there
    is none).

    Columns, in order: rank, steps (int64); bubble_ms, schedule_ms, peer_ms, host_ms (sums
    over the kept steps), span_ms (the kept steps' summed span), measured_frac,
    schedule_frac, theory_frac (float64). Sorted by rank.

    Raises:
        ValueError: ``skip_steps`` < 0, missing columns, an invalid schedule or sizes.
    """
    if skip_steps < 0:
        raise ValueError(f"skip_steps={skip_steps} must be >= 0; use 0 to keep every step")
    spec = Schedule.from_name(schedule)
    parts = attribute_bubbles(
        actions,
        steps=steps,
        schedule=spec.name,
        stages=stages,
        microbatches=microbatches,
        chunks=chunks,
    )
    if parts.empty:
        return _empty(_BY_RANK_SCHEMA)
    recorded = np.sort(actions["step"].unique())
    kept_steps = recorded[min(skip_steps, max(len(recorded) - 1, 0)) :]
    by_step = attribution_by_step(parts[parts["step"].isin(kept_steps)])
    busy = _busy_ms(actions[actions["step"].isin(kept_steps)], steps)
    by_step = by_step.merge(busy, on=["step", "rank"], how="left").fillna({"busy_ms": 0.0})
    by_step["span_ms"] = by_step["bubble_ms"] + by_step["busy_ms"]
    g = by_step.groupby("rank", sort=True)
    f = g[["bubble_ms", *PART_COLUMNS, "span_ms"]].sum(min_count=1)
    f["steps"] = g.size()
    span = f["span_ms"].where(f["span_ms"] > 0)
    f["measured_frac"] = f["bubble_ms"] / span
    f["schedule_frac"] = f["schedule_ms"] / span
    f["theory_frac"] = (
        math.nan
        if spec.name in NO_FORMULA
        else theory_bubble_fraction(spec.name, stages, microbatches, chunks)
    )
    return _typed(f.reset_index(), _BY_RANK_SCHEMA)


def with_attribution(summary: pd.DataFrame, by_rank: pd.DataFrame) -> pd.DataFrame:
    """``summary`` (one row per rank) with the bubble split per step beside its fractions.

    Appends bubble_ms_per_step, schedule_ms_per_step, peer_ms_per_step, host_ms_per_step
    (float64: ``attribution_by_rank``'s sums over its ``steps``; NaN for a rank it lacks).
    """
    _require(summary, ("rank",), "summary")
    _require(by_rank, ("rank", "steps", "bubble_ms", *PART_COLUMNS), "by_rank")
    per_step = by_rank.set_index("rank")
    n = per_step["steps"].where(per_step["steps"] > 0)
    out = summary.copy()
    for c in ("bubble_ms", *PART_COLUMNS):
        out[c.replace("_ms", "_ms_per_step")] = out["rank"].map(per_step[c] / n).astype("float64")
    return out


# --------------------------------------------------------------------------------------------
# the spans and their split (see [Note: bubble attribution])


def _simulated_gaps(
    actions: pd.DataFrame, spec: Schedule, stages: int, microbatches: int, chunks: int
) -> tuple[pd.Series, pd.Series] | None:
    """Simulated gap before each action (by stage, action, microbatch), last ends per rank."""
    a = actions[list(_ACTION_COLUMNS)].copy()
    a["duration_ms"] = a["end_ms"] - a["start_ms"]
    a["start_ns"] = np.rint(a["start_ms"] * 1e6).astype("int64")
    a["end_ns"] = np.rint(a["end_ms"] * 1e6).astype("int64")
    try:
        costs = Costs.from_actions(a, stages=stages * chunks, comm_ms=0.0, dispatch_ms=0.0)
        sim = simulate(spec, stages, microbatches, chunks, costs=costs)
    except ValueError:  # a stage without actions yet (a live run's first step), odd sizes
        return None
    prev_end = sim.groupby("rank")["end_ms"].shift(1).fillna(0.0)
    sim = sim.assign(gap_ms=(sim["start_ms"] - prev_end).clip(lower=0.0))
    gaps = sim.set_index(["stage", "action", "microbatch"])["gap_ms"]
    last = sim.groupby("rank")["end_ms"].max()
    return gaps[~gaps.index.duplicated()], last


def _busy(actions: pd.DataFrame, steps: pd.DataFrame | None) -> pd.DataFrame:
    """Actions and optimizer spans, one row each: rank, step, start_ms, end_ms, is_action…"""
    a = actions[list(_ACTION_COLUMNS)].copy()
    a["action"] = a["action"].astype(str)
    a["is_action"] = True
    if steps is None or steps.empty:
        return a
    o = pd.DataFrame(
        {
            "step": steps["step"],
            "rank": steps["rank"],
            "start_ms": pd.to_numeric(steps["optimizer_start_ms"], errors="coerce"),
            "end_ms": pd.to_numeric(steps["optimizer_end_ms"], errors="coerce"),
        }
    )
    o = o[o["start_ms"].notna() & (o["end_ms"] >= o["start_ms"])]
    have = pd.MultiIndex.from_frame(a[["step", "rank"]].drop_duplicates())
    o = o[pd.MultiIndex.from_frame(o[["step", "rank"]]).isin(have)]
    o = o.assign(stage=-1, action="optimizer", microbatch=-1, is_action=False)
    return pd.concat([a, o[a.columns]], ignore_index=True)


def _busy_ms(actions: pd.DataFrame, steps: pd.DataFrame | None) -> pd.DataFrame:
    """Merged busy ms per (step, rank): actions plus the optimizer (overlaps counted once)."""
    b = _busy(actions, steps).sort_values(["step", "rank", "start_ms"], kind="stable")
    keys = [b["step"], b["rank"]]
    prev = b["end_ms"].groupby(keys).cummax().groupby(keys).shift(1)
    own = (b["end_ms"] - np.maximum(b["start_ms"], prev.fillna(-np.inf))).clip(lower=0.0)
    return own.groupby(keys).sum().rename("busy_ms").reset_index()


def _spans(
    actions: pd.DataFrame, steps: pd.DataFrame | None, sim: tuple[pd.Series, pd.Series]
) -> pd.DataFrame:
    """Every idle span of every rank with its split lengths: rank, t0, t1, schedule_len,
    wait_len, host_len (ms); the rest of a span after wait + host is peer time."""
    b = _busy(actions, steps).sort_values(["rank", "start_ms", "end_ms"], kind="stable")
    b = b.reset_index(drop=True)
    windows = actions.groupby("step")["start_ms"].min()
    step_end = b.groupby("step")["end_ms"].max()  # every rank's step s is over by then
    rank = b["rank"]
    # Without optimizer spans the time between two windows is in no bubble: each (rank, step)
    # is then a timeline of its own, from the window start to the window end.
    group = [rank] if steps is not None else [rank, b["step"]]
    reach = b["end_ms"].groupby(group).cummax()
    first = ~b.duplicated([c.name for c in group])
    prev_step = b["step"].groupby(rank).shift(1)
    t0 = reach.groupby(group).shift(1).where(~first, b["step"].map(windows))

    # the next item's data dependency on another rank
    producer_stage = np.where(
        b["action"].eq("F"),
        b["stage"] - 1,
        np.where(b["action"].isin(["B", "I"]), b["stage"] + 1, -9),
    )
    producer_kind = np.where(b["action"].eq("F"), "F", "back")
    prod = actions[list(_ACTION_COLUMNS)].copy()
    prod["kind2"] = np.where(prod["action"].astype(str).eq("F"), "F", "back")
    prod = prod[prod["action"].astype(str).isin(["F", "B", "I"])]
    prod = prod.drop_duplicates(["step", "stage", "kind2", "microbatch"], keep="last")
    prod = prod.set_index(["step", "stage", "kind2", "microbatch"])[["rank", "end_ms"]]
    key = pd.MultiIndex.from_arrays([b["step"], producer_stage, producer_kind, b["microbatch"]])
    found = prod.reindex(key)
    dep_end = found["end_ms"].to_numpy()
    remote = (
        b["is_action"].to_numpy()
        & ~np.isnan(dep_end)
        & (found["rank"].to_numpy() != rank.to_numpy())
    )

    crosses = ~first & (b["step"] > prev_step)
    n_agree = np.where(crosses, prev_step.map(step_end).to_numpy(), -np.inf)
    n_data = np.where(remote, dep_end, -np.inf)

    # schedule budgets: the boundary's wait for the slowest rank, the gap before the action
    gap, last = sim
    akey = pd.MultiIndex.from_arrays([b["stage"], b["action"], b["microbatch"]])
    sim_gap = gap.reindex(akey).fillna(0.0).to_numpy() * b["is_action"].to_numpy()
    opt = _optimizer_ms(steps)
    done = last + (opt.reindex(last.index).fillna(0.0) if len(opt) else 0.0)
    boundary_wait = (float(done.max()) - rank.map(done)).fillna(0.0).clip(lower=0.0)

    spans = pd.DataFrame(
        {
            "rank": rank,
            "t0": t0,
            "t1": b["start_ms"],
            "n_agree": n_agree,
            "b_agree": np.where(crosses, boundary_wait.to_numpy(), 0.0),
            "n_data": n_data,
            "b_data": sim_gap,
            "remote": remote,
            "inner": ~first & ~crosses & b["is_action"],
        }
    )
    # after each rank's last item: the trailing span, which waits for the last step to end
    tail = b[~b.duplicated([c.name for c in group], keep="last")]
    spans = pd.concat(
        [
            spans,
            pd.DataFrame(
                {
                    "rank": tail["rank"],
                    "t0": reach[tail.index],
                    "t1": np.inf if steps is not None else tail["step"].map(step_end),
                    "n_agree": tail["step"].map(step_end),
                    "b_agree": boundary_wait[tail.index].to_numpy(),
                    "n_data": -np.inf,
                    "b_data": 0.0,
                    "remote": False,
                    "inner": False,
                }
            ),
        ],
        ignore_index=True,
    )
    h = _dispatch_ms(spans)  # zero-length spans count: a rank that was fed at once
    spans = spans[(spans["t1"] > spans["t0"]) & spans["t0"].notna()].reset_index(drop=True)
    t0, g = spans["t0"].to_numpy(), (spans["t1"] - spans["t0"]).to_numpy()
    # the wait for the agreement, then the wait for the data; each: peer, then schedule
    peer1, sched1 = _wait(g, spans["n_agree"].to_numpy() - t0, spans["b_agree"].to_numpy())
    used = peer1 + sched1
    peer2, sched2 = _wait(
        g - used, spans["n_data"].to_numpy() - t0 - used, spans["b_data"].to_numpy()
    )
    used = used + peer2 + sched2
    rest = g - used
    h_r = spans["rank"].map(h).to_numpy()
    dispatch_left = np.clip(h_r - used, 0.0, None)  # the dispatch the waits did not hide
    host = np.where(spans["remote"], np.minimum(dispatch_left, rest), rest)
    # segment lengths in time order: peer, schedule, peer, schedule, host, then peer
    lengths = np.stack([peer1, sched1, peer2, sched2, host], axis=1)
    ends = t0[:, None] + np.cumsum(lengths, axis=1)
    out = spans[["rank", "t0", "t1"]].copy()
    for i, name in enumerate(_SEGMENTS):
        out[name] = ends[:, i]
    return out


def _wait(room: np.ndarray, until: np.ndarray, budget: np.ndarray) -> tuple[np.ndarray, ...]:
    """(peer, schedule) ms of one wait that starts a span's free ``room``: ``until`` ms long
    (<= 0: nothing missing), of which the schedule implies ``budget`` ms (at its end)."""
    wait = np.clip(until, 0.0, room)
    schedule = np.where(wait > 0, np.minimum(budget, room), 0.0)
    peer = np.clip(wait - schedule, 0.0, None)
    return peer, schedule


def _optimizer_ms(steps: pd.DataFrame | None) -> pd.Series:
    """Median optimizer ms per rank (empty without a steps table)."""
    if steps is None or steps.empty:
        return pd.Series(dtype=float)
    d = pd.to_numeric(steps["optimizer_end_ms"], errors="coerce") - pd.to_numeric(
        steps["optimizer_start_ms"], errors="coerce"
    )
    return d.groupby(steps["rank"]).median().dropna()


def _dispatch_ms(spans: pd.DataFrame) -> pd.Series:
    """``h`` per rank: median span before an in-step action needing nothing from a peer."""
    fed = spans[spans["inner"] & ~spans["remote"]]
    length = (fed["t1"] - fed["t0"]).clip(lower=0.0)
    g = length.groupby(fed["rank"]).median()
    fallback = float(length.median()) if len(fed) else 0.0
    ranks = spans["rank"].unique()
    return g.reindex(ranks).fillna(fallback)


def _overlap(x: np.ndarray, y: np.ndarray, a: np.ndarray, b: np.ndarray | float) -> np.ndarray:
    """Length of [x, y) ∩ [a, b), elementwise (0 where they do not meet)."""
    with np.errstate(invalid="ignore"):
        length: np.ndarray = np.clip(np.minimum(y, b) - np.maximum(x, a), 0.0, None)
    return length
