"""Analytic bubble fractions: the share of a step each rank should sit idle, by schedule.

"Fraction" is bubble time ÷ step time (what a global-window measurement gives), not the
"rate" (bubble ÷ ideal compute) that papers often print. Stages are uniform and
communication is ignored, so these are lower bounds for a measurement
(see ``/work/shared/reference/pipelining-and-gpu.md`` §5-6). Each formula is the idle share
of the plan the installed torch runs (``torch_plan``), as the planner computes it with no
overheads (``tests/core/test_theory.py`` checks them against it).

    >>> round(theory_bubble_fraction("1f1b", stages=4, microbatches=4), 3)
    0.429
    >>> round(theory_bubble_fraction("Interleaved1F1B", 4, 8, chunks=2), 3)
    0.158
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from freeride_lab.core.schedule import SCHEDULES, Schedule

__all__ = ["NO_FORMULA", "theory_bubble_fraction", "theory_table"]

# Schedules without a formula comparable to what torch runs (see ``theory_bubble_fraction``);
# none at present, kept so callers can skip such a schedule.
NO_FORMULA: frozenset[str] = frozenset()


def theory_bubble_fraction(
    schedule: str,
    stages: int,
    microbatches: int,
    chunks: int | None = None,
    *,
    t_forward: float = 1.0,
    t_backward_input: float = 1.0,
    t_backward_weight: float = 1.0,
) -> float:
    """Bubble time ÷ step time (0-1) of one rank for ``schedule`` with p stages, m micro-batches.

    Formulas (p = ``stages`` = pipeline ranks, m = ``microbatches``, v = ``chunks``):

    - GPipe, 1F1B: (p-1)/(m+p-1). The bubble is (p-1)(t_f+t_b) and the step
      (m+p-1)(t_f+t_b), so the fraction is the same for any measured t_f, t_b.
    - Interleaved1F1B: (p-1)/(v·m+p-1) (Megatron, arXiv 2104.04473).
    - LoopedBFS: the interleaved value (same bubble, more activations).
    - InterleavedZeroBubble: ZB-H1 with v chunks,
      (p-1)(t_f+t_i-t_w) / [v·m(t_f+t_i+t_w) + (p-1)(t_f+t_i-t_w)], clamped at 0 (when W
      outweighs F + I torch's plan keeps a small bubble that this does not give). At v = 1
      it is the single-chunk ZB-H1 value; each added chunk divides the bubble's share of
      compute, as for Interleaved1F1B. Pass measured medians as the ``t_*`` (their scale
      cancels, only ratios matter).
    - ZBVZeroBubble: with F = I = W (the unit u, one chunk's action), torch's ZB-V plan idles
      (p-1)·u per rank once m ≥ (3p-1)/2 and 2(p-1-(m-p))·u below that, against 6m·u of
      compute: max(p-1, 2(p-1)-2(m-p)) / [6m + max(…)]. ZB-V's bubble vanishes only in the
      paper's tuned plan; torch's keeps one action per stage.
    - DualPipeV: torch runs an OVERLAP_F_B action's sub-actions one after the other and sends
      their results only after both ([Note: held sends] in ``core/schedule.py``), so the
      downstream rank waits a second action: with F = I = W each rank idles 2(p-1)·u,
      2(p-1)/(6m+2(p-1)) (m ≥ 2p, which torch requires).

    ZBVZeroBubble and DualPipeV take F = I = W: their ``t_*`` are checked but not used.

    Args:
        chunks: model chunks per rank; None picks the schedule's default
            (``Schedule.resolve_chunks``).
        t_forward, t_backward_input, t_backward_weight: per-micro-batch costs in any one
            unit; only the zero-bubble formula uses them (``t_backward_input`` is the
            full backward's input half, ``t_backward_weight`` its weight half).

    Raises:
        ValueError: unknown schedule, sizes < 1, invalid chunks or costs.
    """
    spec = Schedule.from_name(schedule)
    v = spec.resolve_chunks(chunks)
    p, m = stages, microbatches
    if p < 1 or m < 1:
        raise ValueError(
            f"stages={p}, microbatches={m}: both must be >= 1; pass the run's pipeline ranks "
            "and micro-batches per step"
        )
    _check_costs(t_forward, t_backward_input, t_backward_weight)
    if spec.name in ("GPipe", "1F1B"):
        return (p - 1) / (m + p - 1)
    if spec.name in ("Interleaved1F1B", "LoopedBFS"):
        return (p - 1) / (v * m + p - 1)
    if spec.name == "InterleavedZeroBubble":
        bubble = max(0.0, (p - 1) * (t_forward + t_backward_input - t_backward_weight))
        compute = v * m * (t_forward + t_backward_input + t_backward_weight)
        return bubble / (compute + bubble) if bubble else 0.0
    if spec.name == "ZBVZeroBubble":  # in units of one chunk's action
        units = max(p - 1, 2 * (p - 1) - 2 * (m - p))
        return units / (6 * m + units)
    if spec.name == "DualPipeV":
        return 2 * (p - 1) / (6 * m + 2 * (p - 1))
    raise ValueError(  # a schedule added to SCHEDULES without a formula here
        f"schedule {spec.name!r} has no formula in theory_bubble_fraction yet; "
        f"known: {', '.join(n for n in SCHEDULES if n not in NO_FORMULA)}"
    )


def theory_table(
    stages: int,
    microbatches: int,
    chunks: int = 2,
    *,
    t_forward: float = 1.0,
    t_backward_input: float = 1.0,
    t_backward_weight: float = 1.0,
) -> pd.DataFrame:
    """Theory fraction of every registered schedule at one (p, m), one row per schedule.

    Columns, in order: schedule (str), stages, microbatches, chunks (int64: 1 for
    single-stage schedules, the fixed 2 for V schedules, else ``chunks``), theory_frac
    (float64, NaN where no formula applies), note (str, why it is NaN or approximate; ""
    otherwise).
    """
    rows: list[dict[str, object]] = []
    for name, spec in SCHEDULES.items():
        v = 1 if not spec.multi else (spec.fixed_chunks or chunks)
        note = _NOTES.get(name, "")
        try:
            frac = theory_bubble_fraction(
                name,
                stages,
                microbatches,
                v,
                t_forward=t_forward,
                t_backward_input=t_backward_input,
                t_backward_weight=t_backward_weight,
            )
        except ValueError:
            if name not in NO_FORMULA:
                raise
            frac = math.nan
        rows.append(
            {
                "schedule": name,
                "stages": stages,
                "microbatches": microbatches,
                "chunks": v,
                "theory_frac": frac,
                "note": note,
            }
        )
    return pd.DataFrame(
        {
            "schedule": pd.Series([r["schedule"] for r in rows], dtype="str"),
            "stages": pd.Series([r["stages"] for r in rows], dtype="int64"),
            "microbatches": pd.Series([r["microbatches"] for r in rows], dtype="int64"),
            "chunks": pd.Series([r["chunks"] for r in rows], dtype="int64"),
            "theory_frac": pd.Series([r["theory_frac"] for r in rows], dtype="float64"),
            "note": pd.Series([r["note"] for r in rows], dtype="str"),
        }
    )


_NOTES = {
    "LoopedBFS": "approximate: the interleaved formula",
    "InterleavedZeroBubble": "ZB-H1 with v chunks",
    "ZBVZeroBubble": "torch's ZB-V plan at F = I = W",
    "DualPipeV": "torch's plan (OVERLAP_F_B run sequentially, sends held) at F = I = W",
}


def _check_costs(t_forward: float, t_backward_input: float, t_backward_weight: float) -> None:
    costs = np.array([t_forward, t_backward_input, t_backward_weight], dtype=float)
    if not np.all(np.isfinite(costs)) or np.any(costs < 0) or costs.sum() <= 0:
        raise ValueError(
            f"t_forward={t_forward}, t_backward_input={t_backward_input}, "
            f"t_backward_weight={t_backward_weight}: costs must be finite, >= 0 and not all 0; "
            "pass per-micro-batch times such as measured medians"
        )
