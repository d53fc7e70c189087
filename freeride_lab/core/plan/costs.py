"""Action costs of the planner: per-(stage, kind) durations and the overheads around them.

``Costs`` holds what the simulator charges for each action (F, B, I, W per stage, plus
communication, dispatch and optimizer time); ``Costs.from_actions`` measures them from a real
run's actions table (schema ``ACTION_COLUMNS``), ``Costs.from_config`` from a synthetic config.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Literal

import numpy as np
import pandas as pd

from freeride_lab.core.config import MAX_COST_MS
from freeride_lab.core.schedule import Action

if TYPE_CHECKING:
    from freeride_lab.core.config import RunConfig

__all__ = ["ACTION_COLUMNS", "KIND_CODES", "SUMMARY_COLUMNS", "Costs"]

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


@dataclass(frozen=True, slots=True, kw_only=True)
class Costs:
    """Action costs in ms: a scalar for every stage or one value per global stage.

    Args:
        forward_ms, backward_input_ms, backward_weight_ms: F, I and W per micro-batch.
        backward_ms: full backward B; None means ``backward_input_ms + backward_weight_ms``.
        comm_ms: added to every dependency produced on another rank.
        dispatch_ms: time a rank spends before each action (overlaps waiting for data).
        optimizer_ms: gap between one step's last action and the next step's start.
        rendezvous: model gloo's point-to-point ([Note: rendezvous] in ``core/plan/simulate.py``):
            a message passes ``comm_ms`` after both its send and its receive are posted, and a
            rank that waits on its send blocks until then.
    """

    forward_ms: PerStage = 1.0
    backward_ms: PerStage | None = None
    backward_input_ms: PerStage = 1.0
    backward_weight_ms: PerStage = 1.0
    comm_ms: float = 0.0
    dispatch_ms: float = 0.0
    optimizer_ms: float = 0.0
    rendezvous: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.rendezvous, bool):
            raise TypeError(f"rendezvous={self.rendezvous!r} must be True or False")
        lengths = set()
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or f.name == "rendezvous":
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
        return cls._of_columns((f, b, inp, wgt), comm_ms, dispatch_ms, optimizer_ms)

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
        statistic: Literal["median", "mean"] = "median",
        rendezvous: bool = False,
    ) -> Costs:
        """Per-stage durations of a measured actions table (schema ``ACTION_COLUMNS``).

        A missing B becomes I + W; missing I and W become half of B each.

        Args:
            stages: global stage count; None takes the largest stage in the table plus one.
            skip_steps: leading steps to leave out (warm-up).
            comm_ms, dispatch_ms: None estimates them from the table (``_estimate_overheads``,
                or with ``rendezvous`` ``_estimate_rendezvous``).
            statistic: each (stage, kind)'s median duration (what a stage costs, robust to a
                busy box) or mean (what predicts a step: a step is a sum of durations along its
                critical path, and the expected sum is the sum of the means).
            rendezvous: costs for the rendezvous model of [Note: rendezvous]
                (``core/plan/simulate.py``), as a real gloo run communicates.
        """
        if statistic not in ("median", "mean"):
            raise ValueError(f"statistic={statistic!r} must be 'median' or 'mean'")
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
        med = df.groupby(["stage", "action"])["duration_ms"].agg(statistic)
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
            estimate = _estimate_rendezvous if rendezvous else _estimate_overheads
            est_comm, est_dispatch = estimate(df)
            comm_ms = est_comm if comm_ms is None else comm_ms
            dispatch_ms = est_dispatch if dispatch_ms is None else dispatch_ms
        return cls._of_columns((f, b, i, w), comm_ms, dispatch_ms, optimizer_ms, rendezvous)

    @classmethod
    def _of_columns(
        cls,
        per_stage: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
        comm_ms: float,
        dispatch_ms: float,
        optimizer_ms: float,
        rendezvous: bool = False,
    ) -> Costs:
        """Costs from per-stage F, B, I and W columns in ms and the scalar overheads: what
        ``from_config`` and ``from_actions`` build once they have the columns."""
        f, b, i, w = (tuple(col) for col in per_stage)
        return cls(
            forward_ms=f,
            backward_ms=b,
            backward_input_ms=i,
            backward_weight_ms=w,
            comm_ms=comm_ms,
            dispatch_ms=dispatch_ms,
            optimizer_ms=optimizer_ms,
            rendezvous=rendezvous,
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


def _estimate_rendezvous(actions: pd.DataFrame) -> tuple[float, float]:
    """(comm_ms, dispatch_ms) of a measured actions table for the rendezvous model; 0 where
    nothing shows them.

    An action's wait is its start less the later of the rank's previous end and, for an input
    from another rank, that input's end. comm_ms: the mean wait of actions with such an input
    (post the receive, meet the send, move the data); dispatch_ms: the mean wait of the others.
    Means, not medians: the simulator adds them to every action, and real waits are skewed.
    Actions whose rank also waited on a send of its last two actions to a receiver that posted
    later are left out: the model adds that wait itself.
    """
    df = actions.sort_values(["step", "rank", "start_ns"]).reset_index(drop=True)
    by_rank = df.groupby(["step", "rank"])
    df = df.assign(prev_end=by_rank["end_ms"].shift(1))
    n_last = int(df["stage"].max())
    is_f, is_back = df["action"] == "F", df["action"].isin(["B", "I"])
    slot = np.where(is_f, "F", np.where(is_back, "back", "W"))
    dep = np.where(is_f, df["stage"] - 1, np.where(is_back, df["stage"] + 1, -1))
    to = np.where(is_f, df["stage"] + 1, np.where(is_back, df["stage"] - 1, -1))
    df = df.assign(
        slot=slot,
        dep_stage=np.where((dep < 0) | (dep > n_last), -1, dep),
        to_stage=np.where((to < 0) | (to > n_last), -1, to),
    )
    key = ["step", "stage", "slot", "microbatch"]
    produced = df[[*key, "rank", "end_ms", "prev_end"]]
    inputs = produced.rename(
        columns={"stage": "dep_stage", "rank": "dep_rank", "end_ms": "dep_end", "prev_end": "_"}
    ).drop(columns="_")
    df = df.merge(inputs, on=["step", "dep_stage", "slot", "microbatch"], how="left")
    # when the receiver of each action's result posted its receive (its previous end)
    posted = produced.rename(
        columns={"stage": "to_stage", "rank": "to_rank", "prev_end": "posted", "end_ms": "_"}
    ).drop(columns="_")
    df = df.merge(posted, on=["step", "to_stage", "slot", "microbatch"], how="left")
    df = df.sort_values(["step", "rank", "start_ns"]).reset_index(drop=True)
    remote = df["dep_rank"].notna() & (df["dep_rank"] != df["rank"])
    free = df["prev_end"].fillna(-np.inf)
    ready = np.fmax(free, df["dep_end"].where(remote))
    late = pd.Series(False, index=df.index)
    sends_out = df["to_rank"].notna() & (df["to_rank"] != df["rank"])
    by_rank = df.assign(posted=df["posted"].where(sends_out))
    for back in (1, 2):
        posted_then = by_rank.groupby(["step", "rank"])["posted"].shift(back)
        late |= posted_then > ready
    wait = (df["start_ms"] - ready)[np.isfinite(ready) & ~late].clip(lower=0.0)
    comm = wait[remote]
    local = wait[~remote]
    return (
        float(comm.mean()) if len(comm) else 0.0,
        float(local.mean()) if len(local) else 0.0,
    )
