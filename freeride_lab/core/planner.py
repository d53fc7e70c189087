"""The planner: a discrete-event simulator of pipeline schedules from per-action costs.

It runs a plan (torch's order for each rank) against per-(stage, kind) costs and returns an
actions table with exactly the schema of a real run, so the bubble analyses work on it unchanged.

    >>> costs = Costs(forward_ms=1.0, backward_ms=2.0)
    >>> summary = simulate_summary("1F1B", stages=4, microbatches=4, costs=costs)
    >>> float(summary.idle_frac[0])  # (S-1)/(M+S-1) = 3/7
    0.42857142857142855

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

1F1B follows what torch executes, as ``torch_plan`` does ([Note: 1F1B plan] in
``core/schedule.py``): torch's own ``pipeline_order`` misnumbers the last rank's forwards.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from freeride_lab.core.config import MAX_COST_MS
from freeride_lab.core.schedule import (
    Action,
    ActionKind,
    Schedule,
    torch_plan_with_held_sends,
)

if TYPE_CHECKING:
    from freeride_lab.core.config import RunConfig

__all__ = [
    "ACTION_COLUMNS",
    "KIND_CODES",
    "SUMMARY_COLUMNS",
    "Costs",
    "PlanArrays",
    "compare_with_run",
    "plan_arrays",
    "simulate",
    "simulate_summary",
]

ACTION_COLUMNS = [
    "step",
    "rank",
    "stage",
    "action",
    "microbatch",
    "start_ns",
    "end_ns",
    "start_ms",
    "end_ms",
    "duration_ms",
]
SUMMARY_COLUMNS = [
    "rank",
    "busy_ms",
    "idle_ms",
    "window_ms",
    "idle_frac",
    "first_start_ms",
    "last_end_ms",
]
KIND_CODES: dict[str, int] = {"F": 0, "B": 1, "I": 2, "W": 3}  # ActionKind letter -> code
_LETTERS = np.array(list(KIND_CODES))
_F, _B, _I, _W = range(4)

PerStage = float | tuple[float, ...]
PlanLike = Mapping[int, Sequence[Action | None]]


# --------------------------------------------------------------------------------------------
# costs


@dataclass(frozen=True, slots=True, kw_only=True)
class Costs:
    """Action costs in ms: a scalar for every stage or one value per global stage.

    Args:
        forward_ms, backward_input_ms, backward_weight_ms: F, I and W per micro-batch.
        backward_ms: full backward B; None means ``backward_input_ms + backward_weight_ms``.
        comm_ms: added to every dependency produced on another rank.
        dispatch_ms: time a rank spends before each action (overlaps waiting for data).
        optimizer_ms: gap between one step's last action and the next step's start.
    """

    forward_ms: PerStage = 1.0
    backward_ms: PerStage | None = None
    backward_input_ms: PerStage = 1.0
    backward_weight_ms: PerStage = 1.0
    comm_ms: float = 0.0
    dispatch_ms: float = 0.0
    optimizer_ms: float = 0.0

    def __post_init__(self) -> None:
        lengths = set()
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if f.name in ("comm_ms", "dispatch_ms", "optimizer_ms") or np.ndim(value) == 0:
                if isinstance(value, bool) or not isinstance(value, int | float | np.number):
                    raise TypeError(f"{f.name}={value!r} must be a number of ms")
                try:
                    value = float(value)
                except OverflowError:  # an int too large for a float
                    value = math.inf
                if not np.isfinite(value) or not 0 <= value <= MAX_COST_MS:
                    raise ValueError(
                        f"{f.name}={value!r} must be a finite number of ms in 0..{MAX_COST_MS:g} "
                        "(an hour)"
                    )
            else:
                arr = np.asarray(value, dtype=float)
                if arr.ndim != 1 or arr.size == 0:
                    raise ValueError(
                        f"{f.name} has shape {arr.shape}; give a scalar or one value per stage"
                    )
                if not np.all(np.isfinite(arr)) or np.any(arr < 0) or np.any(arr > MAX_COST_MS):
                    raise ValueError(
                        f"{f.name}={arr.tolist()} must be finite numbers of ms in "
                        f"0..{MAX_COST_MS:g} (an hour)"
                    )
                lengths.add(arr.size)
                value = tuple(float(x) for x in arr)
            object.__setattr__(self, f.name, value)
        if len(lengths) > 1:
            raise ValueError(
                f"per-stage costs have different lengths {sorted(lengths)}; "
                "give every per-stage field one value per global stage"
            )

    def table(self, stages: int) -> np.ndarray:
        """Costs as a ``(stages, 4)`` float array in ms, columns F, B, I, W."""
        inp, wgt = np.asarray(self.backward_input_ms), np.asarray(self.backward_weight_ms)
        values = {
            "forward_ms": np.asarray(self.forward_ms),
            "backward_ms": inp + wgt if self.backward_ms is None else np.asarray(self.backward_ms),
            "backward_input_ms": inp,
            "backward_weight_ms": wgt,
        }
        for name, arr in values.items():
            if arr.ndim == 1 and arr.size != stages:
                raise ValueError(
                    f"{name} has {arr.size} per-stage values but the plan has {stages} stages; "
                    "give one value per global stage (ranks * chunks) or a scalar"
                )
        return np.stack(
            [np.broadcast_to(a.astype(float), (stages,)) for a in values.values()], axis=1
        )

    @classmethod
    def from_config(
        cls,
        config: RunConfig,
        *,
        comm_ms: float = 0.0,
        dispatch_ms: float = 0.0,
        optimizer_ms: float = 0.0,
    ) -> Costs:
        """The synthetic workload's costs per global stage (``RunConfig.stage_costs_ms``): a
        scalar ``t_*_ms`` is one rank's cost split evenly over its chunks, a sequence one
        value per stage chunk. The one conversion from a config to costs.

        Follows the first-stage quirk in [Note: putting the sleeps on the right half of the
        backward] (``pipeline/synthetic.py``): on stage 0, I costs 0 and W costs I + W.
        """
        f, i, w = (np.array(col, dtype=float) for col in zip(*config.stage_costs_ms(), strict=True))
        b = i + w
        inp, wgt = i.copy(), w.copy()
        inp[0], wgt[0] = 0.0, b[0]
        return cls(
            forward_ms=tuple(f),
            backward_ms=tuple(b),
            backward_input_ms=tuple(inp),
            backward_weight_ms=tuple(wgt),
            comm_ms=comm_ms,
            dispatch_ms=dispatch_ms,
            optimizer_ms=optimizer_ms,
        )

    @classmethod
    def from_actions(
        cls,
        actions: pd.DataFrame,
        *,
        stages: int | None = None,
        skip_steps: int = 0,
        comm_ms: float | None = None,
        dispatch_ms: float | None = None,
        optimizer_ms: float = 0.0,
    ) -> Costs:
        """Per-stage median durations of a measured actions table (schema ``ACTION_COLUMNS``).

        A missing B becomes I + W; missing I and W become half of B each.

        Args:
            stages: global stage count; None takes the largest stage in the table plus one.
            skip_steps: leading steps to leave out (warm-up).
            comm_ms, dispatch_ms: None estimates them from the table (see ``_estimate_overheads``).
        """
        missing = [c for c in ACTION_COLUMNS if c not in actions.columns]
        if missing:
            raise ValueError(f"actions table lacks columns {missing}; expected {ACTION_COLUMNS}")
        df = actions[actions["step"] >= actions["step"].min() + skip_steps]
        if df.empty:
            raise ValueError(
                f"no actions left after skip_steps={skip_steps} "
                f"(table has steps {sorted(actions['step'].unique().tolist())}); lower skip_steps"
            )
        n = int(df["stage"].max()) + 1 if stages is None else stages
        med = df.groupby(["stage", "action"])["duration_ms"].median()
        table = np.full((n, 4), np.nan)
        for (stage, letter), value in med.items():
            if int(stage) >= n:
                raise ValueError(f"stage {stage} in the table but stages={n}; raise stages")
            table[int(stage), KIND_CODES[str(letter)]] = value
        f, b, i, w = table.T
        b = np.where(np.isnan(b), i + w, b)
        i = np.where(np.isnan(i), b / 2, i)
        w = np.where(np.isnan(w), b / 2, w)
        for name, col in (("F", f), ("B, I or W", b)):
            if np.isnan(col).any():
                absent = np.flatnonzero(np.isnan(col)).tolist()
                raise ValueError(
                    f"no {name} actions for stages {absent} in the table; measure every stage "
                    "or pass stages= matching the run"
                )
        if comm_ms is None or dispatch_ms is None:
            est_comm, est_dispatch = _estimate_overheads(df)
            comm_ms = est_comm if comm_ms is None else comm_ms
            dispatch_ms = est_dispatch if dispatch_ms is None else dispatch_ms
        return cls(
            forward_ms=tuple(f),
            backward_ms=tuple(b),
            backward_input_ms=tuple(i),
            backward_weight_ms=tuple(w),
            comm_ms=comm_ms,
            dispatch_ms=dispatch_ms,
            optimizer_ms=optimizer_ms,
        )


def _estimate_overheads(actions: pd.DataFrame) -> tuple[float, float]:
    """(comm_ms, dispatch_ms) of a measured actions table; 0 where nothing shows them.

    dispatch_ms: mean gap before actions that were ready when the rank became free (every
    dependency on their own rank, or a remote one that ended before the rank's previous action).
    comm_ms: median delay from a producer's end on another rank to the consumer's start, over
    consumers that started later than dispatch alone explains.
    """
    df = actions.sort_values(["step", "rank", "start_ns"]).reset_index(drop=True)
    prev_end = df.groupby(["step", "rank"])["end_ms"].shift(1)
    df = df.assign(gap_ms=df["start_ms"] - prev_end)
    n_last = int(df["stage"].max())
    is_f, is_back = df["action"] == "F", df["action"].isin(["B", "I"])
    dep_stage = np.where(is_f, df["stage"] - 1, np.where(is_back, df["stage"] + 1, -1))
    dep_stage = np.where((dep_stage < 0) | (dep_stage > n_last), -1, dep_stage)  # -1: none
    slot = np.where(is_f, "F", np.where(is_back, "back", "W"))
    df = df.assign(slot=slot, dep_stage=dep_stage, dep_slot=np.where(is_f, "F", "back"))
    names = {"stage": "dep_stage", "slot": "dep_slot", "rank": "dep_rank", "end_ms": "dep_end_ms"}
    producers = df[["step", "stage", "slot", "microbatch", "rank", "end_ms"]].rename(columns=names)
    joined = df.merge(producers, on=["step", "dep_stage", "dep_slot", "microbatch"], how="left")
    local = joined["dep_rank"].isna() | (joined["dep_rank"] == joined["rank"])
    lag = joined["start_ms"] - joined["dep_end_ms"]
    # Ready when the rank became free: a local dependency, or a remote one that ended before the
    # rank's previous action did. The mean, not the median: the simulator adds dispatch_ms before
    # every action, and real gaps are right-skewed (a median made real runs ~5% idler than planned).
    ready = local | (lag > joined["gap_ms"])
    gaps = joined.loc[ready, "gap_ms"].dropna()
    gaps = gaps[gaps >= 0]
    dispatch = float(gaps.mean()) if len(gaps) else 0.0
    tol = max(1e-6, 0.05 * dispatch)
    bound = ~local & (joined["gap_ms"] > dispatch + tol) & (lag <= joined["gap_ms"] + tol)
    lags = lag[bound & (lag >= 0)]
    comm = float(lags.median()) if len(lags) else 0.0
    return comm, dispatch


# --------------------------------------------------------------------------------------------
# plans as arrays


@dataclass(frozen=True, eq=False)
class PlanArrays:
    """A plan as per-rank arrays, padded with -1 after each rank's ``length`` actions.

    ``kind`` holds ``KIND_CODES`` (0..3 = F, B, I, W); ``stage`` global stage indices;
    ``microbatch`` micro-batch indices. All three are ``(ranks, width)``.
    """

    kind: np.ndarray  # (ranks, width) int8
    stage: np.ndarray  # (ranks, width) int32
    microbatch: np.ndarray  # (ranks, width) int32
    length: np.ndarray  # (ranks,) int64
    stages: int  # global stages (ranks * chunks)
    microbatches: int
    # (ranks, width) bool: the action's result reaches other ranks only when the rank's next
    # action ends (torch's held sends, [Note: held sends] in core/schedule.py); None: never
    held: np.ndarray | None = None

    @property
    def ranks(self) -> int:
        """Pipeline ranks."""
        return int(self.kind.shape[0])

    def to_plan(self) -> dict[int, list[Action | None]]:
        """The plan as ``{rank: [Action, …]}`` (no ``None`` slots)."""
        kinds = [ActionKind(x) for x in KIND_CODES]
        return {
            r: [
                Action(int(s), kinds[int(k)], int(j))
                for k, s, j in zip(
                    self.kind[r, :n], self.stage[r, :n], self.microbatch[r, :n], strict=True
                )
            ]
            for r, n in enumerate(self.length.tolist())
        }

    @classmethod
    def from_plan(cls, plan: PlanLike, microbatches: int | None = None) -> PlanArrays:
        """Arrays of a ``{rank: [Action | None]}`` plan (``torch_plan`` output); drops ``None``."""
        ranks = sorted(plan)
        if ranks != list(range(len(ranks))) or not ranks:
            raise ValueError(f"plan ranks {ranks} must be 0..R-1 with R >= 1")
        rows = [[a for a in plan[r] if a is not None] for r in ranks]
        width = max(1, max(len(row) for row in rows))
        kind = np.full((len(ranks), width), -1, np.int8)
        stage = np.full((len(ranks), width), -1, np.int32)
        mb = np.full((len(ranks), width), -1, np.int32)
        for r, row in enumerate(rows):
            kind[r, : len(row)] = [KIND_CODES[a.kind.value] for a in row]
            stage[r, : len(row)] = [a.stage for a in row]
            mb[r, : len(row)] = [a.microbatch for a in row]
        length = np.array([len(row) for row in rows], np.int64)
        m = int(mb.max()) + 1 if microbatches is None else microbatches
        return cls(kind, stage, mb, length, int(stage.max()) + 1, max(m, 1))


def plan_arrays(
    schedule: Schedule | str, ranks: int, microbatches: int, chunks: int | None = None
) -> PlanArrays:
    """The schedule's plan as arrays, in the order torch runs it.

    GPipe, 1F1B and Interleaved1F1B are generated with array arithmetic (no per-action Python
    objects); the other schedules convert ``torch_plan``.

    Raises:
        ValueError: the schedule cannot run these sizes.
    """
    spec = Schedule.from_name(schedule) if isinstance(schedule, str) else schedule
    S, M, v = _sizes(spec, ranks, microbatches, chunks)
    r = np.arange(S)[:, None]
    if spec.name == "GPipe":
        p = np.arange(2 * M)[None, :]
        kind = np.broadcast_to(np.where(p < M, _F, _B), (S, 2 * M))
        return _arrays(
            kind, np.broadcast_to(r, (S, 2 * M)), np.broadcast_to(p % M, (S, 2 * M)), S, M
        )
    if spec.name == "1F1B":
        kind, j = _one_f_one_b(np.minimum(M, S - r), M, backward_first=True)
        return _arrays(kind, np.broadcast_to(r, kind.shape), j, S, M)
    if spec.name == "Interleaved1F1B":
        rounds = max(1, M // S)
        per_round = M // rounds
        warmup = np.minimum((v - 1) * per_round + 2 * (S - 1 - r), M * v)
        kind, q = _one_f_one_b(warmup, M * v, backward_first=False)
        block = q // per_round  # forward/backward op index -> (local stage, micro-batch)
        local = np.where(kind == _F, block % v, v - 1 - block % v)
        j = (q // (per_round * v)) * per_round + q % per_round
        return _arrays(kind, local * S + r, j, S * v, M)
    plan, held = torch_plan_with_held_sends(spec, S, M, v)
    arrays = PlanArrays.from_plan(plan, M)
    if any(held.values()):
        mask = np.zeros(arrays.kind.shape, bool)
        for rank, positions in held.items():
            mask[rank, sorted(positions)] = True
        arrays = dataclasses.replace(arrays, held=mask)
    return arrays


def _sizes(
    spec: Schedule, ranks: int, microbatches: int, chunks: int | None
) -> tuple[int, int, int]:
    """(S, M, v) checked against the schedule's own limits."""
    v = spec.resolve_chunks(chunks)
    for name, value in (("ranks", ranks), ("microbatches", microbatches)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            raise ValueError(f"{name}={value!r} must be an integer >= 1")
    S, M = int(ranks), int(microbatches)
    if spec.name == "1F1B" and M < S:
        raise ValueError(
            f"1F1B needs microbatches >= stages, got microbatches={M} < stages={S}; "
            "raise microbatches or use GPipe"
        )
    rounds = max(1, M // S)
    if spec.name == "Interleaved1F1B" and M % rounds:
        raise ValueError(
            f"Interleaved1F1B needs microbatches={M} to be a multiple of its rounds "
            f"max(1, microbatches // stages)={rounds}; pick a multiple of stages={S}"
        )
    return S, M, v


def _one_f_one_b(warmup: np.ndarray, n: int, *, backward_first: bool) -> tuple[np.ndarray, ...]:
    """Kinds and op indices of ``warmup`` forwards, then F/B pairs, then the remaining B's."""
    p = np.arange(2 * n)[None, :]
    k = p - warmup
    steady = 2 * (n - warmup)
    pair_is_b = (k % 2 == 0) if backward_first else (k % 2 == 1)
    is_f = (p < warmup) | ((k < steady) & ~pair_is_b)
    f_index = np.where(p < warmup, p, warmup + k // 2)
    b_index = np.where(k < steady, k // 2, k - (n - warmup))
    return np.where(is_f, _F, _B), np.where(is_f, f_index, b_index)


def _arrays(kind: Any, stage: Any, mb: Any, stages: int, microbatches: int) -> PlanArrays:
    kind = np.ascontiguousarray(kind, dtype=np.int8)
    length = np.full(kind.shape[0], kind.shape[1], np.int64)
    return PlanArrays(
        kind,
        np.ascontiguousarray(stage, dtype=np.int32),
        np.ascontiguousarray(mb, dtype=np.int32),
        length,
        stages,
        microbatches,
    )


def _resolve_plan(
    schedule: Schedule | str,
    stages: int,
    microbatches: int,
    chunks: int | None,
    plan: PlanLike | PlanArrays | None,
) -> PlanArrays:
    if plan is None:
        return plan_arrays(schedule, stages, microbatches, chunks)
    pa = plan if isinstance(plan, PlanArrays) else PlanArrays.from_plan(plan, microbatches)
    if pa.ranks != stages:
        raise ValueError(f"plan has {pa.ranks} ranks but stages={stages}; pass matching sizes")
    return pa


def _check_plan(pa: PlanArrays) -> np.ndarray:
    """Stage → rank map of a runnable plan; raises naming the first problems in short form."""
    N, M = pa.stages, pa.microbatches
    valid = np.arange(pa.kind.shape[1])[None, :] < pa.length[:, None]
    k, s, j = pa.kind[valid], pa.stage[valid], pa.microbatch[valid]
    rank = np.broadcast_to(np.arange(pa.ranks)[:, None], valid.shape)[valid]
    problems: list[str] = []
    bad = np.flatnonzero((k < 0) | (k > 3) | (s < 0) | (s >= N) | (j < 0) | (j >= M))
    if bad.size:
        i = int(bad[0])
        problems.append(
            f"rank {rank[i]} has {s[i]}{_LETTERS[k[i] % 4]}{j[i]} outside "
            f"stages 0..{N - 1} or micro-batches 0..{M - 1}"
        )
    else:
        stage_rank = np.full(N, -1)
        stage_rank[s] = rank
        split = np.flatnonzero(stage_rank[s] != rank)
        if split.size:
            i = int(split[0])
            problems.append(f"stage {s[i]} runs on ranks {stage_rank[s[i]]} and {rank[i]}")
        counts = np.zeros((N, 4, M), np.int64)
        np.add.at(counts, (s, k, j), 1)
        f, b, ii, w = (counts[:, c, :] for c in range(4))
        ok = (f == 1) & (((b == 1) & (ii == 0) & (w == 0)) | ((b == 0) & (ii == 1) & (w == 1)))
        for st, mbi in np.argwhere(~ok)[:5]:
            problems.append(
                f"(stage {st}, micro-batch {mbi}) has {f[st, mbi]}xF "
                f"{b[st, mbi]}xB {ii[st, mbi]}xI {w[st, mbi]}xW"
            )
        if not problems:
            return stage_rank
    raise ValueError(
        f"plan is not runnable: {'; '.join(problems[:5])}; every (stage, micro-batch) needs one "
        "F and either one B or one I and one W, and each stage belongs to one rank"
    )


# --------------------------------------------------------------------------------------------
# the generic engine (see [Note: vectorised rounds])


def _run(pa: PlanArrays, costs: Costs) -> tuple[np.ndarray, np.ndarray]:
    """Start and end ms of every action of one step, as ``(ranks, width)`` arrays (NaN pads)."""
    stage_rank = _check_plan(pa)
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
            raise ValueError(_deadlock_message(pa, ptr, dep_a_end == np.inf))
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


def _deadlock_message(pa: PlanArrays, ptr: np.ndarray, waits_upstream: np.ndarray) -> str:
    """Each stuck rank's wait in short form: "rank 0 waits on 1B0 before 0B0".

    Args:
        waits_upstream: per rank, whether the missing dependency is on another stage (F of
            s-1, B or I of s+1) rather than the rank's own F or I.
    """
    back = {
        (int(s), int(j)): _LETTERS[k]
        for k, s, j in zip(pa.kind.ravel(), pa.stage.ravel(), pa.microbatch.ravel(), strict=True)
        if k in (_B, _I)
    }
    waits = []
    for r in np.flatnonzero(ptr < pa.length):
        k, s, j = (int(a[r, ptr[r]]) for a in (pa.kind, pa.stage, pa.microbatch))
        if k == _F:
            need = f"{s - 1}F{j}"
        elif k == _W:
            need = f"{s}I{j}"
        elif waits_upstream[r]:
            need = f"{s + 1}{back.get((s + 1, j), 'B')}{j}"
        else:
            need = f"{s}F{j}"
        waits.append(f"rank {r} waits on {need} before {s}{_LETTERS[k]}{j}")
    return (
        f"deadlock: no rank can start its next action ({'; '.join(waits)}); each rank runs its "
        "actions strictly in plan order, so reorder the plan so every dependency can finish"
    )


# --------------------------------------------------------------------------------------------
# closed-form levels for GPipe and 1F1B (see [Note: vectorised rounds])


def _levels_summary(name: str, S: int, M: int, costs: Costs) -> pd.DataFrame:
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
        return _summary_frame(M * (t_f + t_b), first, last)
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
    return _summary_frame(M * (t_f + t_b), first, ready - disp)


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


def _summary_frame(busy: np.ndarray, first: np.ndarray, last: np.ndarray) -> pd.DataFrame:
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


# --------------------------------------------------------------------------------------------
# public simulators


def simulate(
    schedule: Schedule | str,
    stages: int,
    microbatches: int,
    chunks: int | None = None,
    *,
    costs: Costs | None = None,
    steps: int = 1,
    plan: PlanLike | PlanArrays | None = None,
) -> pd.DataFrame:
    """Simulated actions table of ``steps`` steps, in a real run's schema (``ACTION_COLUMNS``).

    Rows are ordered by step, rank and plan order; times are from the start of step 0. See
    [Note: planner semantics].

    Args:
        stages: pipeline ranks S (as in ``RunConfig``).
        costs: None means F = I = W = 1 ms, B = 2 ms, no overheads.
        plan: run this plan (``torch_plan`` output or ``PlanArrays``) instead of the schedule's.

    Raises:
        ValueError: the plan is incomplete or deadlocks (the message names each rank's wait).
    """
    costs = Costs() if costs is None else costs
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r} must be an integer >= 1")
    pa = _resolve_plan(schedule, stages, microbatches, chunks, plan)
    start, end = _run(pa, costs)
    valid = np.arange(pa.kind.shape[1])[None, :] < pa.length[:, None]
    n = int(valid.sum())
    rank = np.broadcast_to(np.arange(pa.ranks)[:, None], valid.shape)[valid]
    start, end = start[valid], end[valid]
    period_ms = float(end.max()) + costs.optimizer_ms
    offset = np.repeat(np.arange(steps) * period_ms, n)
    start_ns = np.rint((np.tile(start, steps) + offset) * 1e6).astype(np.int64)
    end_ns = np.rint((np.tile(end, steps) + offset) * 1e6).astype(np.int64)
    frame = pd.DataFrame(
        {
            "step": np.repeat(np.arange(steps, dtype=np.int64), n),
            "rank": np.tile(rank.astype(np.int64), steps),
            "stage": np.tile(pa.stage[valid].astype(np.int64), steps),
            "action": np.tile(_LETTERS[pa.kind[valid]], steps),
            "microbatch": np.tile(pa.microbatch[valid].astype(np.int64), steps),
            "start_ns": start_ns,
            "end_ns": end_ns,
            "start_ms": start_ns / 1e6,
            "end_ms": end_ns / 1e6,
        }
    )
    frame["duration_ms"] = frame["end_ms"] - frame["start_ms"]
    return frame[ACTION_COLUMNS]


def simulate_summary(
    schedule: Schedule | str,
    stages: int,
    microbatches: int,
    chunks: int | None = None,
    *,
    costs: Costs | None = None,
    plan: PlanLike | PlanArrays | None = None,
) -> pd.DataFrame:
    """Per-rank busy and idle ms of one step in the global window (``SUMMARY_COLUMNS``).

    The window runs from the step's earliest action start to its latest action end on any rank;
    ``idle_ms = window_ms - busy_ms``. Every simulated step is identical. GPipe and 1F1B without
    a ``plan`` take the closed-form level path; the rest run the generic engine.
    """
    costs = Costs() if costs is None else costs
    spec = Schedule.from_name(schedule) if isinstance(schedule, str) else schedule
    if plan is None and spec.name in ("GPipe", "1F1B"):
        S, M, _ = _sizes(spec, stages, microbatches, chunks)
        return _levels_summary(spec.name, S, M, costs)
    pa = _resolve_plan(spec, stages, microbatches, chunks, plan)
    start, end = _run(pa, costs)
    dur = np.nan_to_num(end - start)
    last = end[np.arange(pa.ranks), np.maximum(pa.length - 1, 0)]
    return _summary_frame(dur.sum(axis=1), start[:, 0], last)


def compare_with_run(
    actions_measured: pd.DataFrame,
    schedule: Schedule | str,
    stages: int,
    microbatches: int,
    chunks: int | None = None,
    *,
    skip_steps: int = 0,
) -> pd.DataFrame:
    """Measured vs simulated idle fraction per rank: ``rank, measured_idle_frac,
    simulated_idle_frac, rel_diff``.

    The simulation uses ``Costs.from_actions`` of the same table (medians per stage and kind,
    estimated comm and dispatch). Measured fractions are ``bubbles.bubble_fraction`` (each
    step's global window), averaged over the steps kept. ``rel_diff = (simulated - measured) /
    measured`` (0 when both are 0, NaN when only measured is).

    Args:
        skip_steps: leading steps to leave out of both (warm-up); real runs want at least 1.
    """
    from freeride_lab.core.bubbles import bubble_fraction

    df = actions_measured[actions_measured["step"] >= actions_measured["step"].min() + skip_steps]
    spec = Schedule.from_name(schedule) if isinstance(schedule, str) else schedule
    costs = Costs.from_actions(df, stages=stages * spec.resolve_chunks(chunks))
    sim = simulate_summary(spec, stages, microbatches, chunks, costs=costs)
    frac = bubble_fraction(df).groupby("rank")["idle_frac"].mean()
    measured = frac.reindex(range(stages)).to_numpy(dtype=float)
    simulated = sim["idle_frac"].to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(
            measured > 0, (simulated - measured) / measured, np.where(simulated == 0, 0.0, np.nan)
        )
    return pd.DataFrame(
        {
            "rank": np.arange(stages, dtype=np.int64),
            "measured_idle_frac": measured,
            "simulated_idle_frac": simulated,
            "rel_diff": rel,
        }
    )
