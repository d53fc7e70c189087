"""The planner's engines: one step of a plan from per-action costs, as event arrays.

[Note: planner semantics]
Each rank runs its compute actions strictly in plan order, one at a time. F(s, j) waits for
F(s-1, j); B or I of (s, j) waits for F(s, j) and for the B or I of (s+1, j); W(s, j) waits for
I(s, j). A full backward B satisfies whatever I would. A dependency produced on another rank
arrives ``comm_ms`` after it ends; before each action a rank spends ``dispatch_ms`` (posting
sends and receives, Python dispatch), which overlaps with waiting for data:
``start = max(previous end on the rank + dispatch_ms, dependency end + comm_ms)``.
Costs depend on (stage, kind) only, so every step is identical; step k+1 starts
``optimizer_ms`` after step k's last action ends anywhere.

[Note: vectorised rounds]
The generic engine keeps one pointer per rank. Each round gathers, for all ranks at once, the
end times of the next action's dependencies from a (stage, F|backward-input, micro-batch) table;
every rank whose dependencies ended in earlier rounds runs its action. Rounds visit actions in a
topological order, so times are exact; a round count is the longest chain of actions (about
2·(M + S) for 1F1B). A round in which no waiting rank can start is a deadlock.
For GPipe and 1F1B ``simulate_summary`` uses closed-form levels instead (F(r, j) at level r + 2j
and B(r, j) at 2S - 1 - r + 2j for 1F1B; r + j and 2S + M - 2 - r + j for GPipe), in which every
dependency sits one level earlier on a neighbouring rank: each level is a few slice operations
and no plan arrays are built, which is what makes 1,024 stages x 8,192 micro-batches fast.

"""

from __future__ import annotations

import numpy as np
import pandas as pd

from freeride_lab.core.plan.arrays import PlanArrays, check_plan, deadlock_message
from freeride_lab.core.plan.costs import _B, _F, _I, _W, SUMMARY_COLUMNS, Costs

__all__ = ["levels_summary", "run_plan", "summary_frame"]


# --------------------------------------------------------------------------------------------
# the generic engine (see [Note: vectorised rounds])


def run_plan(pa: PlanArrays, costs: Costs) -> tuple[np.ndarray, np.ndarray]:
    """Start and end ms of every action of one step, as ``(ranks, width)`` arrays (NaN pads)."""
    stage_rank = check_plan(pa)
    N, M = pa.stages, pa.microbatches
    table = costs.table(N)
    R, L = pa.kind.shape
    width = L + 1  # one pad column, so a finished rank points at a never-ready slot
    kind = np.full((R, width), -1, np.int64)
    kind[:, :L] = pa.kind
    kind[np.arange(width)[None, :] >= pa.length[:, None]] = -1
    stage = np.zeros((R, width), np.int64)
    stage[:, :L] = np.maximum(pa.stage, 0)
    mb = np.zeros((R, width), np.int64)
    mb[:, :L] = np.maximum(pa.microbatch, 0)
    kind, stage, mb = kind.ravel(), stage.ravel(), mb.ravel()
    rank = np.repeat(np.arange(R), width)
    none_i, inf_i, dummy_i = 2 * N * M, 2 * N * M + 1, 2 * N * M + 2
    is_f, is_back, is_w = kind == _F, (kind == _B) | (kind == _I), kind == _W
    dep_stage = np.where(is_f, stage - 1, stage + 1)
    has_dep = (is_f & (stage > 0)) | (is_back & (stage < N - 1))
    dep_a = np.where(has_dep, (dep_stage * 2 + is_back) * M + mb, none_i)
    dep_a[kind < 0] = inf_i
    remote = has_dep & (stage_rank[np.clip(dep_stage, 0, N - 1)] != rank)
    comm_a = np.where(remote, costs.comm_ms, 0.0)
    dep_b = np.where(is_back, stage * 2 * M + mb, np.where(is_w, (stage * 2 + 1) * M + mb, none_i))
    write = np.where(is_f | is_back, (stage * 2 + is_back) * M + mb, dummy_i)
    dur = np.where(kind >= 0, table[stage, np.maximum(kind, 0)], 0.0)
    done = np.full(2 * N * M + 3, np.inf)  # when a result is ready on its own rank
    done[none_i] = -np.inf
    held = np.zeros(R * width, bool)
    if pa.held is not None:
        held.reshape(R, width)[:, :L] = pa.held
    sent = done.copy()  # when it reaches other ranks ([Note: held sends] in core/schedule.py)
    remote = has_dep & (stage_rank[np.clip(dep_stage, 0, N - 1)] != rank)
    start, end = np.full(R * width, np.nan), np.full(R * width, np.nan)
    base, ptr, free = np.arange(R) * width, np.zeros(R, np.int64), np.zeros(R)
    remaining = int(pa.length.sum())
    while remaining:
        idx = base + ptr
        dep_a_end = np.where(remote[idx], sent[dep_a[idx]], done[dep_a[idx]])
        dep = np.maximum(dep_a_end + comm_a[idx], done[dep_b[idx]])
        rr = np.flatnonzero(dep < np.inf)
        if rr.size == 0:
            raise ValueError(deadlock_message(pa, ptr, dep_a_end == np.inf))
        ri = idx[rr]
        st = np.maximum(free[rr] + costs.dispatch_ms, dep[rr])
        en = st + dur[ri]
        done[write[ri]] = en
        now = ~held[ri]
        sent[write[ri[now]]] = en[now]
        after = (ptr[rr] > 0) & held[ri - 1]  # the previous action's held result leaves now
        sent[write[ri[after] - 1]] = en[after]
        free[rr] = en
        start[ri], end[ri] = st, en
        ptr[rr] += 1
        remaining -= rr.size
    return start.reshape(R, width)[:, :L], end.reshape(R, width)[:, :L]


# --------------------------------------------------------------------------------------------
# closed-form levels for GPipe and 1F1B (see [Note: vectorised rounds])


def levels_summary(name: str, S: int, M: int, costs: Costs) -> pd.DataFrame:
    table = costs.table(S)
    t_f, t_b = table[:, _F].copy(), table[:, _B].copy()
    comm, disp = costs.comm_ms, costs.dispatch_ms
    # In-place updates on slices keep each level to a handful of ufunc calls.
    ready = np.full(S, disp)  # previous end on the rank + dispatch_ms
    dep_f = np.full(S + 1, -np.inf)  # dep_f[r]: rank r-1's latest F end + comm (0: none)
    dep_b = np.full(S + 1, -np.inf)  # dep_b[r]: rank r's latest B end + comm (S: none)
    first = np.zeros(S)
    if name == "1F1B":
        first, last = _levels_1f1b(S, M, t_f, t_b, comm, disp)
        return summary_frame(M * (t_f + t_b), first, last)
    b0, step = 2 * S + M - 2, 1  # GPipe: F(r, j) at level r + j, B(r, j) at b0 - r + j
    maximum, add = np.maximum, np.add
    for t in range(2 * S + 2 * M - 2):
        lo, hi = max(0, t - step * (M - 1)), min(t, S - 1)
        if lo <= hi:
            sl, out = slice(lo, hi + 1, step), slice(lo + 1, hi + 2, step)
            now = ready[sl]
            maximum(now, dep_f[sl], out=now)  # start
            if t < S:
                first[t] = now[-1]
            add(now, t_f[sl], out=now)  # end
            add(now, comm, out=dep_f[out])
            add(now, disp, out=now)
        lo, hi = max(0, b0 - t), min(S - 1, b0 - t + step * (M - 1))
        if lo <= hi:
            sl, src = slice(lo, hi + 1, step), slice(lo + 1, hi + 2, step)
            now = ready[sl]
            maximum(now, dep_b[src], out=now)
            add(now, t_b[sl], out=now)
            add(now, comm, out=dep_b[sl])
            add(now, disp, out=now)
    return summary_frame(M * (t_f + t_b), first, ready - disp)


def _levels_1f1b(
    S: int, M: int, t_f: np.ndarray, t_b: np.ndarray, comm: float, disp: float
) -> tuple[np.ndarray, np.ndarray]:
    """First start and last end per rank of one 1F1B step, one level at a time.

    At level t, ranks with r = t (mod 2) run F((t - r) / 2), reading rank r-1's level t-1 end;
    the others run B((t - 2S + 1 + r) / 2), reading rank r+1's. Between levels 2S-1 and 2M-2
    every rank is active, so a level is one gather and four in-place ufuncs on full vectors.
    """
    r = np.arange(S)
    ready = np.full(S, disp)  # previous end on the rank + dispatch_ms
    ends = np.full(S + 2, -np.inf)  # ends[r + 1]: rank r's latest end + comm (0, S+1: none)
    inner = ends[1:-1]
    first, dep = np.zeros(S), np.empty(S)
    is_f = [r % 2 == p for p in (0, 1)]
    take = [np.where(f, r, r + 2) for f in is_f]  # rank r-1 for F, rank r+1 for B
    dur = [np.where(f, t_f, t_b) for f in is_f]
    lo_f, hi_b = -2 * M + 2, 2 * S + 2 * M - 3  # F active for t-2M+2 <= r <= t, B for
    for t in range(2 * S + 2 * M - 2):  # 2S-1-t <= r <= 2S+2M-3-t
        p = t % 2
        np.take(ends, take[p], out=dep)
        np.maximum(ready, dep, out=dep)  # start
        if 2 * S - 1 <= t <= 2 * M - 2:
            dep += dur[p]
            np.add(dep, comm, out=inner)
            np.add(dep, disp, out=ready)
            continue
        if t < S:
            first[t] = dep[t]
        active = np.where(
            is_f[p], (r >= t + lo_f) & (r <= t), (r >= 2 * S - 1 - t) & (r <= hi_b - t)
        )
        dep += dur[p]
        np.copyto(inner, dep + comm, where=active)
        np.copyto(ready, dep + disp, where=active)
    return first, ready - disp


def summary_frame(busy: np.ndarray, first: np.ndarray, last: np.ndarray) -> pd.DataFrame:
    window = float(last.max() - first.min())
    idle = window - busy
    return pd.DataFrame(
        {
            "rank": np.arange(busy.size, dtype=np.int64),
            "busy_ms": busy,
            "idle_ms": idle,
            "window_ms": np.full(busy.size, window),
            "idle_frac": idle / window if window > 0 else np.zeros(busy.size),
            "first_start_ms": first,
            "last_end_ms": last,
        }
    )[SUMMARY_COLUMNS]
