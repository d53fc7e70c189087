"""Plans as arrays: each rank's actions as (kind, stage, micro-batch) rows, and their checks.

``plan_arrays`` builds GPipe, 1F1B and Interleaved1F1B with array arithmetic (no per-action
Python objects) and converts ``torch_plan`` for the rest; ``check_plan`` proves a plan runnable
(every dependency present, one rank per stage) before the simulator runs it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from freeride_lab.core.plan.costs import _B, _F, _I, _LETTERS, _W, KIND_CODES, PlanLike
from freeride_lab.core.schedule import Action, ActionKind, Schedule, torch_plan_with_held_sends

__all__ = ["SEND_AFTER_NEXT", "SEND_AT_END", "SEND_WITH_NEXT", "PlanArrays", "plan_arrays"]

SEND_AT_END, SEND_WITH_NEXT, SEND_AFTER_NEXT = 0, 1, 2  # PlanArrays.send_wait codes


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
    # (ranks, width) int8: when the rank waits for the action's sends to complete (a gloo send
    # completes only once the receiver has posted its receive; [Note: rendezvous] in
    # core/plan/simulate.py): SEND_AT_END (0) at the end of the step, SEND_WITH_NEXT (1) together
    # with the next action's receive, SEND_AFTER_NEXT (2) once the next action has ended. None:
    # all at the end of the step.
    send_wait: np.ndarray | None = None

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
    S, M, v = sizes(spec, ranks, microbatches, chunks)
    r = np.arange(S)[:, None]
    if spec.name == "GPipe":
        p = np.arange(2 * M)[None, :]
        kind = np.broadcast_to(np.where(p < M, _F, _B), (S, 2 * M))
        return _arrays(
            kind, np.broadcast_to(r, (S, 2 * M)), np.broadcast_to(p % M, (S, 2 * M)), S, M
        )
    if spec.name == "1F1B":
        kind, j = _one_f_one_b(np.minimum(M, S - r), M, backward_first=True)
        arrays = _arrays(kind, np.broadcast_to(r, kind.shape), j, S, M)
        return dataclasses.replace(arrays, send_wait=_one_f_one_b_send_wait(arrays.kind))
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


def sizes(
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


def _one_f_one_b_send_wait(kind: np.ndarray) -> np.ndarray:
    """``send_wait`` of torch's ``Schedule1F1B``: a warm-up forward's send is waited after the
    next forward, the last warm-up forward's and every steady-state send together with the next
    action's receive (torch fuses them into one batch), a cool-down backward's send after the next
    backward, and the last one at the end of the step."""
    wait = np.full(kind.shape, SEND_AT_END, np.int8)
    here, after = kind[:, :-1], kind[:, 1:]
    wait[:, :-1] = np.where(here == after, SEND_AFTER_NEXT, SEND_WITH_NEXT)
    return wait


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


def resolve_plan(
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


def check_plan(pa: PlanArrays) -> np.ndarray:
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


def deadlock_message(pa: PlanArrays, ptr: np.ndarray, waits_upstream: np.ndarray) -> str:
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
