"""Side-task accounting: progress per task, FreeRide's cost saving (both ways), harvest.

**FreeRide's cost model** (paper notes §13). T_v is the vanilla training time, T_f the time
with side tasks (both on stage 0), P_k the progress of task k summed over stages, θ_k its
throughput on a reference GPU (an RTX 3080) and R = c_srv / c_ref the price ratio of the
training server to that GPU (3.96 / 0.18 = 22):

- overhead = (T_f - T_v) / T_v
- x = Σ (P_k / T_f) / θ_k — reference GPUs' worth of work per second of training
- hourly_cost = R - x (in reference-GPU prices per hour)
- saving as published = Σ P_k/θ_k ÷ (R·T_v) (= (T_f/T_v)·x/R; the overhead cancels out)
- saving, overhead-corrected = published - overhead
  = 1 - (T_f·c_srv - Σ P_k/θ_k·c_ref) / (T_v·c_srv)

The rebuild reports both; the published one omits what the slowdown costs.

**Harvest** compares like with like: side-task work valued at the *same* GPU's dedicated speed
÷ GPU wall time — the share of the GPUs' time turned into side-task work, to hold against
``bubble_limit`` (the idle share 1F1B leaves).

    >>> s = cost_saving({"sgd": 3000.0}, vanilla_s=540.0, freeride_s=545.0)
    >>> round(s.saving_published_frac, 4), round(s.overhead_frac, 4)
    (0.1684, 0.0093)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from freeride_lab.core.budget import overrun_mask

if TYPE_CHECKING:  # the units table is read at launch; pandas only where a ledger is built
    import pandas as pd

__all__ = [
    "FREERIDE_REFERENCE_THROUGHPUT_PER_S",
    "FREERIDE_UNITS",
    "LEDGER_COLUMNS",
    "CostModel",
    "CostSaving",
    "bubble_limit",
    "cost_saving",
    "harvest_frac",
    "ledger",
    "progress_by_name",
]

#: FreeRide's side-task throughputs on an RTX 3080 (its AE notebook), in each task's unit per s.
FREERIDE_REFERENCE_THROUGHPUT_PER_S: Mapping[str, float] = MappingProxyType(
    {
        "resnet18": 998.7,
        "resnet50": 393.4,
        "vgg19": 161.8,
        "pagerank": 126.3,
        "sgd": 1.5,
        "image": 7.8,
    }
)

#: Progress units of FreeRide's side tasks: DL training counts samples, graphs iterations.
FREERIDE_UNITS: Mapping[str, str] = MappingProxyType(
    {
        "resnet18": "samples",
        "resnet50": "samples",
        "vgg19": "samples",
        "pagerank": "iterations",
        "sgd": "iterations",
        "image": "images",
    }
)


@dataclass(frozen=True, kw_only=True)
class CostModel:
    """Prices and reference throughputs; the defaults are FreeRide's.

    Args:
        reference_throughput_per_s: θ_k per task name, in the task's unit per second, on the
            reference GPU.
        reference_gpu: what θ was measured on (for reports).
        c_ref_usd_per_h: hourly price of the reference GPU.
        c_srv_usd_per_h: hourly price of the training server the side tasks share.
    """

    reference_throughput_per_s: Mapping[str, float] = field(
        default_factory=lambda: FREERIDE_REFERENCE_THROUGHPUT_PER_S
    )
    reference_gpu: str = "RTX 3080"
    c_ref_usd_per_h: float = 0.18
    c_srv_usd_per_h: float = 3.96

    def __post_init__(self) -> None:
        for name in ("c_ref_usd_per_h", "c_srv_usd_per_h"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name}={value!r} must be a finite price > 0")
        for task, theta in self.reference_throughput_per_s.items():
            if not math.isfinite(theta) or theta <= 0:
                raise ValueError(f"reference throughput of {task!r} is {theta!r}; it must be > 0")
        object.__setattr__(
            self,
            "reference_throughput_per_s",
            MappingProxyType(dict(self.reference_throughput_per_s)),
        )

    @property
    def price_ratio(self) -> float:
        """R = c_srv / c_ref (22 for FreeRide)."""
        return self.c_srv_usd_per_h / self.c_ref_usd_per_h

    def theta(self, name: str) -> float:
        """θ of task ``name``.

        Raises:
            KeyError: no reference throughput for ``name``; the message lists the known ones.
        """
        try:
            return self.reference_throughput_per_s[name]
        except KeyError:
            known = ", ".join(self.reference_throughput_per_s)
            raise KeyError(
                f"no reference throughput for task {name!r}; known: {known}. Pass "
                "CostModel(reference_throughput_per_s={...}) with it"
            ) from None


@dataclass(frozen=True, slots=True)
class CostSaving:
    """FreeRide's cost figures for one run (fractions are 0-1).

    ``reference_gpus`` is x; ``hourly_cost`` is R - x in reference-GPU prices per hour and
    ``hourly_cost_usd`` the same in dollars.
    """

    overhead_frac: float
    reference_gpus: float
    hourly_cost: float
    hourly_cost_usd: float
    saving_published_frac: float
    saving_corrected_frac: float


def cost_saving(
    progress: Mapping[str, float],
    *,
    vanilla_s: float,
    freeride_s: float,
    model: CostModel | None = None,
) -> CostSaving:
    """FreeRide's cost saving, published and overhead-corrected (see the module docstring).

    Args:
        progress: P_k per task name, summed over stages, in the task's unit.
        vanilla_s: T_v, training time without side tasks.
        freeride_s: T_f, the same training with side tasks.
    """
    model = model or CostModel()
    for name, value in (("vanilla_s", vanilla_s), ("freeride_s", freeride_s)):
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name}={value!r} must be a finite time in seconds > 0")
    reference_s = 0.0  # Σ P_k / θ_k: reference-GPU seconds of work done
    for name, p in progress.items():
        if not math.isfinite(p) or p < 0:
            raise ValueError(f"progress of {name!r} is {p!r}; it must be a finite number >= 0")
        reference_s += p / model.theta(name)
    r = model.price_ratio
    overhead = (freeride_s - vanilla_s) / vanilla_s
    x = reference_s / freeride_s
    published = reference_s / (r * vanilla_s)
    return CostSaving(
        overhead_frac=overhead,
        reference_gpus=x,
        hourly_cost=r - x,
        hourly_cost_usd=(r - x) * model.c_ref_usd_per_h,
        saving_published_frac=published,
        saving_corrected_frac=published - overhead,
    )


def harvest_frac(
    progress: Mapping[str, float],
    dedicated_throughput_per_s: Mapping[str, float],
    gpu_wall_s: float,
) -> float:
    """Side-task work at the same GPU's dedicated speed ÷ GPU wall time (0-1 when sane).

    Args:
        progress: units done per task name.
        dedicated_throughput_per_s: each task's speed running alone on the same GPU model.
        gpu_wall_s: GPU time on offer: wall time x number of GPUs the tasks could use.
    """
    if not math.isfinite(gpu_wall_s) or gpu_wall_s <= 0:
        raise ValueError(f"gpu_wall_s={gpu_wall_s!r} must be > 0 (wall seconds x GPUs)")
    busy_s = 0.0
    for name, p in progress.items():
        theta = dedicated_throughput_per_s.get(name)
        if theta is None or not theta > 0:
            known = ", ".join(dedicated_throughput_per_s)
            raise ValueError(
                f"no dedicated throughput > 0 for task {name!r} (got {theta!r}); known: {known}"
            )
        busy_s += p / theta
    return busy_s / gpu_wall_s


def bubble_limit(stages: int, microbatches: int) -> float:
    """1F1B's idle share per GPU, (S - 1) / (M + S - 1): 3/7 ≈ 0.429 for S = M = 4."""
    if stages < 1 or microbatches < 1:
        raise ValueError(f"stages={stages}, microbatches={microbatches} must both be >= 1")
    return (stages - 1) / (microbatches + stages - 1)


#: Columns of ``ledger``, in order.
LEDGER_COLUMNS: tuple[str, ...] = (
    "task_id",
    "name",
    "stage",
    "steps",
    "progress",
    "unit",
    "throughput_per_s",
    "busy_s",
    "overruns",
    "overrun_ms_total",
)

_STEP_COLUMNS = (
    "task_id",
    "name",
    "stage",
    "start_ms",
    "end_ms",
    "duration_ms",
    "progress",
    "unit",
    "overrun_ms",
)


def ledger(side_task_steps: pd.DataFrame, *, wall_s: float | None = None) -> pd.DataFrame:
    """One row per side task: its work, speed, busy time and overruns.

    Columns (in order): task_id, name, stage, steps (count), progress (sum, in ``unit``),
    unit, throughput_per_s (progress ÷ ``wall_s``, FreeRide's P/T_f), busy_s (summed step
    durations), overruns (steps that overran, ``core.budget.overrun_mask``), overrun_ms_total.
    Sorted by stage, then task_id.

    Args:
        side_task_steps: the ``side_task_steps`` table (task_id, name, stage, rank, step,
            start_ms, end_ms, duration_ms, progress, unit, overrun_ms).
        wall_s: the wall time throughput is taken over (e.g. T_f); None uses the span of the
            table, first step start to last step end.
    """
    missing = [c for c in _STEP_COLUMNS if c not in side_task_steps.columns]
    if missing:
        raise ValueError(
            f"side_task_steps lacks column(s) {missing}; expected {', '.join(_STEP_COLUMNS)}"
        )
    if wall_s is not None and (not math.isfinite(wall_s) or wall_s <= 0):
        raise ValueError(f"wall_s={wall_s!r} must be > 0 seconds (or None for the table's span)")
    if side_task_steps.empty:
        return _empty_ledger()
    df = side_task_steps.assign(
        _overran=overrun_mask(side_task_steps["overrun_ms"]),
        _overrun=side_task_steps["overrun_ms"].fillna(0.0).clip(lower=0.0),
    )
    if wall_s is None:
        wall_s = (float(df["end_ms"].max()) - float(df["start_ms"].min())) / 1e3
    out = df.groupby("task_id", sort=False).agg(
        name=("name", "first"),
        stage=("stage", "first"),
        steps=("progress", "size"),
        progress=("progress", "sum"),
        unit=("unit", "first"),
        busy_ms=("duration_ms", "sum"),
        overruns=("_overran", "sum"),
        overrun_ms_total=("_overrun", "sum"),
    )
    out = out.reset_index()
    out["task_id"] = out["task_id"].astype(str)
    out["stage"] = out["stage"].astype("int64")
    out["steps"] = out["steps"].astype("int64")
    out["progress"] = out["progress"].astype(float)
    out["overruns"] = out["overruns"].astype("int64")
    out["overrun_ms_total"] = out["overrun_ms_total"].astype(float)
    out["busy_s"] = out["busy_ms"].astype(float) / 1e3
    out["throughput_per_s"] = out["progress"] / wall_s if wall_s > 0 else math.nan
    out = out.sort_values(["stage", "task_id"], kind="stable").reset_index(drop=True)
    return out[list(LEDGER_COLUMNS)]


def _empty_ledger() -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(
        {
            "task_id": pd.Series([], dtype=str),
            "name": pd.Series([], dtype=str),
            "stage": pd.Series([], dtype="int64"),
            "steps": pd.Series([], dtype="int64"),
            "progress": pd.Series([], dtype=float),
            "unit": pd.Series([], dtype=str),
            "throughput_per_s": pd.Series([], dtype=float),
            "busy_s": pd.Series([], dtype=float),
            "overruns": pd.Series([], dtype="int64"),
            "overrun_ms_total": pd.Series([], dtype=float),
        }
    )


def progress_by_name(ledger_df: pd.DataFrame) -> dict[str, float]:
    """P_k per task name, summed over stages (the input ``cost_saving`` wants)."""
    if ledger_df.empty:
        return {}
    sums = ledger_df.groupby("name", sort=True)["progress"].sum()
    return {str(k): float(v) for k, v in sums.items()}
