r"""Per-rank Chrome trace JSON: open in Perfetto (ui.perfetto.dev) or load with HTA.

One file per rank, ``rank-<r>.json``, with complete events (``ph: "X"``, ``ts``/``dur`` in µs
from run start) and a top-level ``distributedInfo`` ``{"rank": r, "world_size": n}``. ``pid`` is
the rank; threads (``tid``) are:

- ``stage`` (the global stage index) for compute actions, named like ``"1F0"``;
- ``OPTIMIZER_TID`` for the rank's optimizer step of each training step, named ``"optimizer"``;
- ``BUBBLE_TID`` for bubbles, named ``"bubble A"`` (label) or ``"bubble warmup"`` (kind);
- ``SIDE_TASK_TID + k`` for the k-th side task on the rank, events named ``"resnet18 step"``.

[Note: traces for Holistic Trace Analysis]
HTA (``hta.trace_analysis.TraceAnalysis``) reads a directory of such files and needs three
things from them:

- the rank, which it finds with the regular expression ``"rank":\s+(\d+)`` on the file's
  text (at least one blank after the colon), falling back to rank 0 for every file. The files
  are therefore written with ``": "`` between keys and values, and ``distributedInfo`` comes
  before the events so that its ``rank`` is the first match;
- the device's work: its breakdowns take the events with ``cat`` ``"kernel"`` and a positive
  integer ``args.stream`` as the "GPU kernels" of the rank and count idle time as the gaps
  between them. Every action and optimizer span has ``cat`` ``KERNEL_CAT`` and ``stream``
  ``COMPUTE_STREAM`` (one device per rank; several stages of a rank share it); bubbles
  (``cat`` ``"bubble"``) and side-task steps (``"side_task"``) have no stream, so HTA's idle time
  of a rank is our idle between its first and its last busy span;
- no ``ProfilerStep#<n>`` annotations: with them HTA keeps only kernels linked to a CPU
  operator by ``correlation``, which these traces do not have, and would drop every span.

    >>> write_traces(actions, bubbles, side_task_steps, "run/trace", world_size=4)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = [
    "BUBBLE_TID",
    "COMPUTE_STREAM",
    "KERNEL_CAT",
    "OPTIMIZER_TID",
    "SIDE_TASK_TID",
    "rank_trace",
    "write_traces",
]

OPTIMIZER_TID = 999
BUBBLE_TID = 1000
SIDE_TASK_TID = 2000
_US_PER_MS = 1000.0
# cat and args.stream of busy spans: see [Note: traces for Holistic Trace Analysis]
KERNEL_CAT = "kernel"
COMPUTE_STREAM = 1


def _us(ms: float) -> float:
    return round(float(ms) * _US_PER_MS, 3)  # keep ns resolution, drop float noise


def _clean(value: Any) -> Any:
    """A JSON-safe scalar: numpy numbers to Python, NaN to None."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _complete(
    name: str,
    cat: str,
    rank: int,
    tid: int,
    start_ms: float,
    duration_ms: float,
    args: dict[str, Any],
) -> dict[str, Any]:
    return {
        "ph": "X",
        "name": name,
        "cat": cat,
        "pid": rank,
        "tid": tid,
        "ts": _us(start_ms),
        "dur": _us(duration_ms),
        "args": {k: _clean(v) for k, v in args.items()},
    }


def _meta(
    kind: str, rank: int, tid: int, name: str, sort_index: int | None = None
) -> list[dict[str, Any]]:
    events = [{"ph": "M", "name": kind, "pid": rank, "tid": tid, "args": {"name": name}}]
    if sort_index is not None:
        events.append(
            {
                "ph": "M",
                "name": "thread_sort_index",
                "pid": rank,
                "tid": tid,
                "args": {"sort_index": sort_index},
            }
        )
    return events


def _action_events(actions: pd.DataFrame, rank: int) -> Iterator[dict[str, Any]]:
    for row in actions.itertuples(index=False):
        stage, kind, mb = int(row.stage), str(row.action), int(row.microbatch)
        yield _complete(
            f"{stage}{kind}{mb}",
            KERNEL_CAT,
            rank,
            stage,
            row.start_ms,
            row.duration_ms,
            {
                "step": row.step,
                "stage": stage,
                "action": kind,
                "microbatch": mb,
                "stream": COMPUTE_STREAM,
            },
        )


def _optimizer_events(steps: pd.DataFrame, rank: int) -> Iterator[dict[str, Any]]:
    rows = steps[steps["rank"] == rank]
    start = pd.to_numeric(rows["optimizer_start_ms"], errors="coerce")
    end = pd.to_numeric(rows["optimizer_end_ms"], errors="coerce")
    timed = start.notna() & end.notna()
    for step, s, e in zip(rows["step"][timed], start[timed], end[timed], strict=True):
        yield _complete(
            "optimizer",
            KERNEL_CAT,
            rank,
            OPTIMIZER_TID,
            s,
            e - s,
            {"step": step, "stream": COMPUTE_STREAM},
        )


def _bubble_name(label: Any, kind: Any) -> str:
    return f"bubble {label}" if isinstance(label, str) and label else f"bubble {kind}"


def _bubble_events(bubbles: pd.DataFrame, rank: int) -> Iterator[dict[str, Any]]:
    for row in bubbles.to_dict("records"):
        args = {
            k: row.get(k) for k in ("step", "stage", "slot", "kind", "label", "before", "after")
        }
        yield _complete(
            _bubble_name(row.get("label"), row.get("kind")),
            "bubble",
            rank,
            BUBBLE_TID,
            row["start_ms"],
            row["duration_ms"],
            args,
        )


def _side_events(side: pd.DataFrame, rank: int, tids: dict[str, int]) -> Iterator[dict[str, Any]]:
    for row in side.to_dict("records"):
        args = {
            k: row.get(k) for k in ("task_id", "step", "stage", "progress", "unit", "overrun_ms")
        }
        yield _complete(
            f"{row['name']} step",
            "side_task",
            rank,
            tids[str(row["name"])],
            row["start_ms"],
            row["duration_ms"],
            args,
        )


def _timed(frame: pd.DataFrame, rank: int) -> pd.DataFrame:
    """Rows of ``rank`` with a start and a duration (unfinished spans are left out)."""
    rows = frame[frame["rank"] == rank]
    return rows[rows["start_ms"].notna() & rows["duration_ms"].notna()]


def rank_trace(
    rank: int,
    world_size: int,
    actions: pd.DataFrame,
    bubbles: pd.DataFrame,
    side_task_steps: pd.DataFrame | None = None,
    steps: pd.DataFrame | None = None,
) -> dict[str, Any]:
    """The Chrome trace document of one rank (rows of other ranks are ignored).

    ``steps`` (the run's steps table) adds the optimizer spans; without it HTA counts the
    optimizer as idle time.
    """
    acts = _timed(actions, rank)
    bubs = _timed(bubbles, rank)
    side = (
        _timed(side_task_steps, rank)
        if side_task_steps is not None and len(side_task_steps)
        else None
    )
    tids = (
        {}
        if side is None
        else {str(name): SIDE_TASK_TID + k for k, name in enumerate(dict.fromkeys(side["name"]))}
    )
    events: list[dict[str, Any]] = _meta("process_name", rank, 0, f"rank {rank}")
    for stage in sorted({int(s) for s in acts["stage"]}):
        events += _meta("thread_name", rank, stage, f"stage {stage}", sort_index=stage)
    optimizer = (
        list(_optimizer_events(steps, rank))
        if steps is not None and len(steps) and "optimizer_start_ms" in steps
        else []
    )
    if optimizer:
        events += _meta("thread_name", rank, OPTIMIZER_TID, "optimizer", OPTIMIZER_TID)
    events += _meta("thread_name", rank, BUBBLE_TID, "bubbles", sort_index=BUBBLE_TID)
    for name, tid in tids.items():
        events += _meta("thread_name", rank, tid, f"side task {name}", sort_index=tid)
    events += list(_action_events(acts, rank))
    events += optimizer
    events += list(_bubble_events(bubs, rank))
    if side is not None:
        events += list(_side_events(side, rank, tids))
    return {
        "schemaVersion": 1,
        "distributedInfo": {"rank": rank, "world_size": world_size},
        "displayTimeUnit": "ms",
        "traceEvents": events,
    }


def write_traces(
    actions: pd.DataFrame,
    bubbles: pd.DataFrame,
    side_task_steps: pd.DataFrame | None,
    out_dir: str | Path,
    world_size: int,
    steps: pd.DataFrame | None = None,
) -> list[Path]:
    """Write ``rank-<r>.json`` for every rank in ``range(world_size)``; returns the paths.

    ``steps`` (the run's steps table, optional) adds each rank's optimizer spans.

    Raises:
        ValueError: a table names a rank outside ``range(world_size)``.
    """
    if world_size < 1:
        raise ValueError(f"world_size={world_size!r} must be >= 1 (number of pipeline ranks)")
    seen = set(actions["rank"].astype(int)) | set(bubbles["rank"].astype(int))
    if side_task_steps is not None and len(side_task_steps):
        seen |= set(side_task_steps["rank"].astype(int))
    outside = sorted(r for r in seen if not 0 <= r < world_size)
    if outside:
        raise ValueError(
            f"tables name ranks {outside} but world_size={world_size}; pass the run's world size "
            "(RunConfig.stages)"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank in range(world_size):
        path = out / f"rank-{rank}.json"
        doc = rank_trace(rank, world_size, actions, bubbles, side_task_steps, steps)
        # default separators (", ", ": "): HTA needs the blank after "rank": (see the Note)
        path.write_text(json.dumps(doc, allow_nan=False))
        paths.append(path)
    return paths
