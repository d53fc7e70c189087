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

[Note: rendezvous]
gloo passes a point-to-point message only once both sides have posted it: a send completes, and
the matching receive returns, after the receiver has posted its receive. With
``Costs.rendezvous`` the engine models that: a rank posts the receive of an action's remote
input when it is free for the action (its previous action ended and the sends it waits on
there completed), and the input arrives ``comm_ms`` after the later of that post and the send;
a send completes ``comm_ms`` after the later of its own post and the receiver's. A rank waits on
its sends where ``PlanArrays.send_wait`` says (torch's ``Schedule1F1B``: a warm-up forward's send
after the next forward, steady-state sends together with the next action's receive, a cool-down
backward's after the next backward); other plans wait on theirs at the end of the step. So a
fast stage in warm-up runs at most about one micro-batch ahead of a slower neighbour. Because
torch fuses each steady-state send with the receive its rank waits on next, that block rarely
lengthens a 1F1B step; the receive side does: every action fed by another rank pays
``comm_ms`` after its rank is free. The closed-form levels model no rendezvous, so such costs
take the generic engine.

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

from freeride_lab.core.plan.arrays import (
    SEND_AFTER_NEXT,
    SEND_AT_END,
    SEND_WITH_NEXT,
    PlanArrays,
    check_plan,
    deadlock_message,
)
from freeride_lab.core.plan.costs import _B, _F, _I, _W, SUMMARY_COLUMNS, Costs

__all__ = ["levels_summary", "run_plan", "summary_frame"]


# --------------------------------------------------------------------------------------------
# the generic engine (see [Note: vectorised rounds])


def run_plan(pa: PlanArrays, costs: Costs) -> tuple[np.ndarray, np.ndarray]:
    """Start and end ms of every action of one step, as ``(ranks, width)`` arrays (NaN pads).

    See [Note: planner semantics] and, with ``costs.rendezvous``, [Note: rendezvous].
    """
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
    dep_b = np.where(is_back, stage * 2 * M + mb, np.where(is_w, (stage * 2 + 1) * M + mb, none_i))
    write = np.where(is_f | is_back, (stage * 2 + is_back) * M + mb, dummy_i)
    dur = np.where(kind >= 0, table[stage, np.maximum(kind, 0)], 0.0)
    done = np.full(2 * N * M + 3, np.inf)  # when a result is ready on its own rank
    done[none_i] = -np.inf
    held = np.zeros(R * width, bool)
    if pa.held is not None:
        held.reshape(R, width)[:, :L] = pa.held
    sent = done.copy()  # when it reaches other ranks ([Note: held sends] in core/schedule.py)
    meet = _Rendezvous(pa, costs, stage, mb, write, dep_a, remote, stage_rank, width)
    start, end = np.full(R * width, np.nan), np.full(R * width, np.nan)
    base, ptr = np.arange(R) * width, np.zeros(R, np.int64)
    remaining = int(pa.length.sum())
    while remaining or meet.pending(base, ptr):
        idx = base + ptr
        progress = meet.settle(idx, ptr, end)
        free = meet.free(idx, ptr)
        dep_a_end = np.where(remote[idx], meet.arrival(idx, free, sent), done[dep_a[idx]])
        dep = np.maximum(dep_a_end + meet.comm[idx], done[dep_b[idx]])
        dep = np.maximum(dep, meet.send_done(idx, ptr))
        rr = np.flatnonzero((dep < np.inf) & (free < np.inf) & (kind[idx] >= 0))
        if rr.size == 0:
            if progress:
                continue
            raise ValueError(deadlock_message(pa, ptr, dep_a_end == np.inf))
        ri = idx[rr]
        st = np.maximum(free[rr] + costs.dispatch_ms, dep[rr])
        en = st + dur[ri]
        done[write[ri]] = en
        now = ~held[ri]
        sent[write[ri[now]]] = en[now]
        after = (ptr[rr] > 0) & held[ri - 1]  # the previous action's held result leaves now
        sent[write[ri[after] - 1]] = en[after]
        start[ri], end[ri] = st, en
        meet.ran(ri, en)
        ptr[rr] += 1
        remaining -= rr.size
    return start.reshape(R, width)[:, :L], end.reshape(R, width)[:, :L]


class _Rendezvous:
    """The waits of [Note: rendezvous], per flat action index; without ``costs.rendezvous`` a
    rank is free when its previous action ends and inputs arrive ``comm_ms`` after they leave.
    """

    def __init__(
        self,
        pa: PlanArrays,
        costs: Costs,
        stage: np.ndarray,
        mb: np.ndarray,
        write: np.ndarray,
        dep_a: np.ndarray,
        remote: np.ndarray,
        stage_rank: np.ndarray,
        width: int,
    ) -> None:
        R, L = pa.kind.shape
        n = R * width
        self.on = costs.rendezvous
        self.c = costs.comm_ms
        self.comm = np.where(remote, costs.comm_ms, 0.0)
        if self.on:
            self.comm[:] = 0.0  # arrival() adds it from the later of send and receive
        self.ready = np.full(n + 1, np.inf)  # rank free after the action (its send waits done)
        self.ready[n] = 0.0  # a rank's first action: free at the step's start
        pos = np.arange(n) % width
        self.prev = np.where(pos > 0, np.arange(n) - 1, n)
        self.wait = np.zeros(n, np.int64)
        self.by_key = np.full(write.max() + 1, n, np.int64)  # result key -> its action
        results = write < write.max()  # the last key collects W and pads (no result)
        self.by_key[write[results]] = np.flatnonzero(results)
        # the action that receives this action's result on another rank, else -1
        N, M = pa.stages, pa.microbatches
        grid = np.full((R, width), -1, np.int64)
        grid[:, :L] = np.where(np.arange(L)[None, :] < pa.length[:, None], pa.kind, -1)
        kind = grid.ravel()
        is_f, is_back = kind == _F, (kind == _B) | (kind == _I)
        to = np.where(is_f, stage + 1, stage - 1)
        ok = (is_f | is_back) & (to >= 0) & (to < N)
        key = np.where(ok, (np.clip(to, 0, N - 1) * 2 + is_back) * M + mb, 0)
        cons = np.where(ok, self.by_key[key], n)
        rank = np.repeat(np.arange(R), width)
        ok &= cons < n
        ok &= stage_rank[np.clip(to, 0, N - 1)] != rank
        self.consumer = np.where(ok, cons, -1)
        if self.on and pa.send_wait is not None:
            self.wait.reshape(R, width)[:, :L] = pa.send_wait
            self.wait[self.consumer < 0] = SEND_AT_END
        self.dep_a = dep_a

    def _done(self, a: np.ndarray) -> np.ndarray:
        """When the send of actions ``a`` completes (inf: not yet known)."""
        post = self.ready[self.prev[self.consumer[a]]]
        done: np.ndarray = np.maximum(self.ready[a], post) + self.c
        return done

    def pending(self, base: np.ndarray, ptr: np.ndarray) -> bool:
        """Whether a finished rank's last action still waits on its sends."""
        last = base + ptr - 1
        return bool(self.on and np.any((ptr > 0) & np.isinf(self.ready[last])))

    def settle(self, idx: np.ndarray, ptr: np.ndarray, end: np.ndarray) -> bool:
        """Free each rank after its previous action where its sends allow; any newly free."""
        p = idx - 1
        todo = np.flatnonzero((ptr > 0) & np.isinf(self.ready[p]))
        if todo.size == 0:
            return False
        a = p[todo]
        when = end[a]
        two = (ptr[todo] > 1) & (self.wait[np.maximum(a - 1, 0)] == SEND_AFTER_NEXT)
        if two.any():
            w = a[two] - 1
            when[two] = np.maximum(when[two], self._done(w))
        known = np.isfinite(when)
        self.ready[a[known]] = when[known]
        return bool(known.any())

    def free(self, idx: np.ndarray, ptr: np.ndarray) -> np.ndarray:
        """When each rank is free for its next action (inf: its sends still wait)."""
        return np.where(ptr > 0, self.ready[self.prev[idx]], 0.0)

    def arrival(self, idx: np.ndarray, free: np.ndarray, sent: np.ndarray) -> np.ndarray:
        """When each rank's remote input has arrived, less ``comm`` (used where it is remote)."""
        key = self.dep_a[idx]
        if not self.on:
            left: np.ndarray = sent[key]
            return left
        leaves = np.maximum(sent[key], self.ready[self.by_key[key]])
        arrived: np.ndarray = np.maximum(leaves, free) + self.c
        return arrived

    def send_done(self, idx: np.ndarray, ptr: np.ndarray) -> np.ndarray:
        """The previous action's send, where the rank waits on it with this action's receive."""
        out = np.full(idx.size, -np.inf)
        if not self.on:
            return out
        p = idx - 1
        w = np.flatnonzero((ptr > 0) & (self.wait[np.maximum(p, 0)] == SEND_WITH_NEXT))
        out[w] = self._done(p[w])
        return out

    def ran(self, ri: np.ndarray, en: np.ndarray) -> None:
        if not self.on:
            self.ready[ri] = en


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
