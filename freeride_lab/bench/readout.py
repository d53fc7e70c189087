"""Reading a benchmark run's results from its event files: blocks, memory, task steps.

Every number of ``freeride-lab bench`` comes from the run directory after (or, for a solo
phase, during) the run: ``collect_blocks`` turns the driver's blocks into rows
(``bench.stats.BLOCK_COLUMNS``) and notes each segment's stage bubbles as the lab's placer
predicts them (``predicted_bubbles_ms``), ``stage_memory`` and ``task_steps`` read single
event kinds; ``announced_bubbles`` replays a rank's live bubble edges for offline studies.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from freeride_lab.bench.results import block_row, segment_tasks
from freeride_lab.core.announced import announced_spans
from freeride_lab.core.bubbles import extract_bubbles, predict_bubbles
from freeride_lab.core.budget import OverrunStats
from freeride_lab.core.config import RunConfig
from freeride_lab.lab.tables import (
    actions_frame,
    read_events,
    run_start_ns,
    side_task_steps_frame,
    steps_frame,
)
from freeride_lab.sidetasks.spec import profile_path, profiled_top_size

__all__ = [
    "AnnouncedBubble",
    "announced_bubbles",
    "checkpoint_holds",
    "collect_blocks",
    "predicted_bubbles_ms",
    "read_calibration",
    "stage_memory",
    "step_calls",
    "task_steps",
]


def collect_blocks(
    run_dir: Path,
    cfg: RunConfig,
    run_name: str,
    blocks: Sequence[Mapping[str, Any]],
    record: dict[str, Any],
    samples: Sequence[Any],
) -> list[dict[str, Any]]:
    """The blocks table of one run, from its event files (``bench.stats.BLOCK_COLUMNS``).

    Also fills ``record``: its ``stage_memory`` and, per segment with a task, the task's step
    and overrun counts over the whole run and ``stage_bubbles_ms``, the stage's bubbles as the
    lab's placer predicts them from the segment's vanilla blocks and ``top_step_size``, how
    many of its smallest steps the task's profiled step was (``bench.placement`` places tasks
    with them).
    """
    if not blocks or not run_dir.exists():
        return []
    events = read_events(run_dir)
    t0 = run_start_ns(events) or 0
    actions = actions_frame(events, t0)
    bubbles = extract_bubbles(  # with the idle between steps (core.bubbles)
        actions, schedule=cfg.schedule, stages=cfg.stages, microbatches=cfg.microbatches,
        chunks=cfg.chunks, min_ms=1.0, steps=steps_frame(events, t0),
    )  # fmt: skip
    side = side_task_steps_frame(events, t0)
    starts = {
        (int(e["rank"]), int(e["step"])): int(e["start_ns"])
        for e in events
        if e.get("kind") == "step"
    }
    edges = [e for e in events if e.get("kind") == "bubble_edge"]
    holds = checkpoint_holds(events, t0)
    record["stage_memory"] = stage_memory(events)
    for rec in record["segments"]:
        for one in segment_tasks(rec):
            if one.get("task_id"):  # every step of the task in this run, as its host counts
                mine = side[side["task_id"] == one["task_id"]]
                stats = OverrunStats.of(mine["overrun_ms"] * 1e6)
                one.update(task_steps_total=stats.steps, task_overruns_total=stats.overruns)
        if rec.get("task_id"):
            vanilla = [
                b for b in blocks if b.get("task_id") == rec["task_id"] and b["mode"] == "vanilla"
            ]
            rec["stage_bubbles_ms"] = predicted_bubbles_ms(bubbles, vanilla, int(rec["stage"]))
            rec["top_step_size"] = _top_step_size(run_dir, str(rec["task_id"]))
    rows = []
    for b in blocks:
        row = block_row(dict(b), run_name, starts, bubbles, side, edges, list(samples), t0, holds)
        if row is not None:
            rows.append(row)
    return rows


def checkpoint_holds(
    events: Sequence[Mapping[str, Any]], t0: int
) -> list[tuple[str, float, float]]:
    """Every side-task checkpoint's hold of its host (``side_task_checkpoint`` events) as
    (task_id, start, end), ms after ``t0``.

        >>> held = {"kind": "side_task_checkpoint", "task_id": "vgg19-1", "start_ns": 3_000_000,
        ...         "end_ns": 4_500_000, "why": "periodic"}
        >>> checkpoint_holds([held, {"kind": "step"}], t0=1_000_000)
        [('vgg19-1', 2.0, 3.5)]
    """
    return [
        (str(e["task_id"]), (int(e["start_ns"]) - t0) / 1e6, (int(e["end_ns"]) - t0) / 1e6)
        for e in events
        if e.get("kind") == "side_task_checkpoint"
    ]


def predicted_bubbles_ms(
    bubbles: pd.DataFrame, blocks: Sequence[Mapping[str, Any]], rank: int
) -> list[float]:
    """``rank``'s bubbles per slot (slot order) predicted as the lab's placer does (the
    minimum of each slot's last five, ``core.bubbles.predict_bubbles``) from the measured
    steps of ``blocks``; [] when they hold none."""
    steps = {
        s
        for b in blocks
        for s in range(int(b["first_step"]), int(b["first_step"]) + int(b["steps"]))
    }
    mine = bubbles[(bubbles["rank"] == rank) & bubbles["step"].isin(steps)]
    if mine.empty:
        return []
    return [round(float(v), 3) for v in predict_bubbles(mine)["predicted_ms"]]


def _top_step_size(run_dir: Path, task_id: str) -> int | None:
    """How many of its smallest steps the task's profiled step was (its host's profile), or
    None where no profile says."""
    with contextlib.suppress(OSError, ValueError):
        profile = json.loads(profile_path(run_dir, task_id).read_text())
        return profiled_top_size(profile) if isinstance(profile, dict) else None
    return None


def read_calibration(control_dir: Path, stages: int) -> list[dict[str, Any]]:
    """Each emulated rank's calibration (``calibration-rank-<r>.json``), where written."""
    out = []
    for r in range(stages):
        path = control_dir / f"calibration-rank-{r}.json"
        with contextlib.suppress(OSError, ValueError):
            out.append(json.loads(path.read_text()))
    return out


def stage_memory(events: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per rank: its highest peak reserved memory of the run and the device's capacity (on CUDA
    the rank's own chunks, activations and allocator cache; the GPU is shared by all ranks)."""
    peak: dict[int, tuple[int, int, str]] = {}
    for e in events:
        if e.get("kind") != "memory":
            continue
        r = int(e["rank"])
        value = (int(e["peak_reserved_bytes"]), int(e["capacity_bytes"]), str(e["device"]))
        if r not in peak or value[0] > peak[r][0]:
            peak[r] = value
    return [
        {"rank": r, "peak_reserved_bytes": p, "capacity_bytes": c, "device": d}
        for r, (p, c, d) in sorted(peak.items())
    ]


def task_steps(path: Path, since_ns: int) -> list[dict[str, Any]]:
    """``side_task_step`` events in one task's event file that started at or after ``since_ns``."""
    out = []
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                e = json.loads(line)
                if e.get("kind") == "side_task_step" and int(e["start_ns"]) >= since_ns:
                    out.append(e)
    return out


def step_calls(event: Mapping[str, Any]) -> int:
    """The ``step()`` calls a ``side_task_step`` record covers (``SideTaskStep.calls``): 1
    where it does not say, or says something other than a whole number of at least 1 (a record
    from before the field, or one a task's own code wrote into its event file).

        >>> [step_calls(e) for e in ({"calls": 7}, {}, {"calls": "7"}, {"calls": 0},
        ...                          {"calls": True}, {"calls": 2.0})]
        [7, 1, 1, 1, 1, 1]
    """
    calls = event.get("calls", 1)
    return calls if isinstance(calls, int) and not isinstance(calls, bool) and calls >= 1 else 1


class AnnouncedBubble(NamedTuple):
    """One bubble a rank announced live: its step and slot, the length the rank predicted and
    the one it had (ms)."""

    step: int
    slot: int
    predicted_ms: float
    real_ms: float


def announced_bubbles(run_dir: Path, rank: int) -> list[AnnouncedBubble]:
    """Every bubble ``rank`` announced with a prediction in ``run_dir``, in order (its
    ``bubble_edge`` events, a start with its end; a start without a prediction is left out:
    no side-task step could be planned against it). Damaged lines are skipped as
    ``read_events`` skips them."""
    return [
        AnnouncedBubble(
            b.step,
            b.slot,
            round((b.predicted_end_ns - b.start_ns) / 1e6, 3),
            round((b.end_ns - b.start_ns) / 1e6, 3),
        )
        for b in announced_spans(read_events(run_dir), rank).spans
        if b.predicted_end_ns
    ]
