"""A run's report: one self-contained HTML page plus its data (Parquet, JSON, Chrome traces).

    >>> write_session_report(session, "runs/r1/report/report.html")   # doctest: +SKIP
    >>> write_report("report.html", config=cfg.to_dict(),               # doctest: +SKIP
    ...              environment=environment_info(), actions=s.actions, bubbles=s.bubbles,
    ...              steps=s.steps, summary=s.summary(), side_task_steps=s.side_task_steps)

The page leads with the answer: a headline (bubble fraction measured vs theory, side-task
overhead with its 95% interval, harvest, cost saving), then the timeline, then the details
(bubbles, step times, side tasks and their failures, overheads, costs), the config and
environment last. Beside ``report.html`` the directory gets ``actions.parquet``,
``bubbles.parquet``, ``steps.parquet``, ``side_task_steps.parquet``, ``summary.json`` and
``trace/rank-<r>.json``. The page works offline and stays small: plotly.js is inlined once
(``ui.report_figures``) and the timeline draws a bounded window of steps. Jinja2 autoescaping
is on, so user strings (task names, errors, config values) are text, and plotly's JSON escapes
``<``, ``>`` and ``/`` inside its ``<script>`` blocks.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import pandas as pd
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from freeride_lab.lab.frames import SIDE_TASK_STEP_COLUMNS
from freeride_lab.ui.report_figures import (
    cost_figure,
    figure_fragments,
    plotly_js,
    progress_figure,
    timeline_window,
    window_figure,
)
from freeride_lab.ui.report_format import Table, jsonable, pairs, table
from freeride_lab.ui.report_headline import headlines
from freeride_lab.ui.report_tables import (
    as_frame,
    bubble_table,
    failed_tasks,
    label_table,
    overheads,
    step_table,
)
from freeride_lab.ui.session_view import SessionView
from freeride_lab.ui.timeline import fractions_figure
from freeride_lab.ui.trace import write_traces

__all__ = [
    "Table",
    "bubble_table",
    "environment_info",
    "overheads",
    "step_table",
    "write_report",
    "write_session_report",
]

TEMPLATES = Path(__file__).parent / "templates"
_PACKAGES = (
    "freeride-lab",
    "torch",
    "numpy",
    "pandas",
    "pyarrow",
    "plotly",
    "anywidget",
    "ipywidgets",
    "jinja2",
    "nvidia-ml-py",
)


def environment_info() -> dict[str, Any]:
    """Versions, platform, command line and GPU (NVML) facts for the report header."""
    from freeride_lab.gpu import nvml

    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "command": " ".join(sys.argv),
    }
    for package in _PACKAGES:
        try:
            info[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            info[package] = None
    info["nvml"] = "available" if nvml.is_available() else nvml.unavailable_reason()
    if nvml.is_available():
        info["driver"] = nvml.driver_version()
        info["gpus"] = nvml.device_count()
        info["cuda_to_nvml"] = {str(k): v for k, v in nvml.cuda_to_nvml().items()}
    info["CUDA_VISIBLE_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    return info


def _write_tables(out: Path, tables: Mapping[str, pd.DataFrame]) -> list[str]:
    names = []
    for name, frame in tables.items():
        frame.to_parquet(out / f"{name}.parquet", index=False)
        names.append(f"{name}.parquet")
    return names


def _beyond(summary: pd.DataFrame, shown: pd.DataFrame) -> pd.DataFrame:
    """``summary`` without the columns the bubble table already shows (rank kept)."""
    return summary[[c for c in summary.columns if c == "rank" or c not in shown.columns]]


def _render(**context: Any) -> str:
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=StrictUndefined,
        keep_trailing_newline=True,
    )
    return env.get_template("report.html.j2").render(**context)


def write_report(
    path: str | Path,
    *,
    config: Mapping[str, Any],
    environment: Mapping[str, Any],
    actions: pd.DataFrame,
    bubbles: pd.DataFrame,
    steps: pd.DataFrame,
    summary: pd.DataFrame | Mapping[str, Any] | None,
    side_task_steps: pd.DataFrame | None = None,
    side_task_ledger: pd.DataFrame | None = None,
    costs: Any = None,
    cost_note: str | None = None,
    overheads: Any = None,
    tasks: Any = None,
    title: str = "freeride_lab run report",
    timeline_steps: int = 10,
    max_bars_per_rank: int = 400,
    max_bars: int = 2000,
    min_bubble_ms: float = 0.05,
) -> Path:
    """Write ``path`` (HTML) and the run's data beside it; returns ``path``.

    Args:
        config: the run's settings (``RunConfig.to_dict()``), shown as a table.
        environment: versions and hardware (see :func:`environment_info`).
        summary: per-rank ``[rank, measured_frac, theory_frac, ...]`` or a mapping of numbers.
        side_task_ledger: one row per side task; derived from ``side_task_steps`` when None.
        costs: a ``CostSaving``, a mapping or a frame with ``saving_published_frac`` and
            ``saving_corrected_frac`` (any columns containing "published"/"corrected").
        cost_note: why there is no cost saving (shown in its place), e.g. a custom task
            without a reference throughput.
        overheads: a mapping or a frame of overhead numbers (:func:`overheads`'s keys give
            the headline its overhead and interval).
        tasks: the side tasks (``Session.tasks``); failed ones are listed with their error.
        timeline_steps: how many of the newest steps the timeline draws at most.
        max_bars_per_rank: fewer steps are drawn where they would need more bars on a rank
            (``max_bars`` in all; a bar is about 80 bytes of the page).
        min_bubble_ms: gaps shorter than this are left out of the drawing.
        (All steps and spans are in the Parquet files and traces.)
    """
    from freeride_lab.core.accounting import ledger

    html_path = Path(path)
    out = html_path.parent
    out.mkdir(parents=True, exist_ok=True)
    side = (
        side_task_steps
        if side_task_steps is not None
        else pd.DataFrame(columns=list(SIDE_TASK_STEP_COLUMNS))
    )
    if side_task_ledger is None and not side.empty:
        side_task_ledger = ledger(side)
    summary_frame = summary if isinstance(summary, pd.DataFrame) else None
    cost_frame, overhead_frame = as_frame(costs), as_frame(overheads)
    failed = failed_tasks(tasks)

    files = _write_tables(
        out, {"actions": actions, "bubbles": bubbles, "steps": steps, "side_task_steps": side}
    )
    ranks = set(actions["rank"].astype(int)) | set(bubbles["rank"].astype(int))
    world_size = max(int(config.get("stages") or 1), max(ranks, default=0) + 1)
    traces = write_traces(actions, bubbles, side, out / "trace", world_size, steps)
    files += [str(p.relative_to(out)) for p in traces]
    per_rank = bubble_table(bubbles, summary_frame)
    summary_doc = {
        "config": config,
        "environment": environment,
        "summary": summary,
        "bubbles_per_rank": per_rank,
        "step_times": step_table(steps),
        "side_task_ledger": side_task_ledger,
        "failed_side_tasks": failed,
        "costs": cost_frame,
        "cost_note": cost_note,
        "overheads": overhead_frame,
    }
    (out / "summary.json").write_text(json.dumps(jsonable(summary_doc), indent=2, allow_nan=False))
    files.append("summary.json")

    window = timeline_window(
        actions,
        bubbles,
        side,
        last_steps=timeline_steps,
        max_bars_per_rank=max_bars_per_rank,
        max_bars=max_bars,
        min_bubble_ms=min_bubble_ms,
    )
    figures = figure_fragments(
        [
            ("timeline", window_figure(window)),
            (
                "bubble-fractions",
                fractions_figure(summary_frame) if summary_frame is not None else None,
            ),
            ("side-task-progress", progress_figure(side) if not side.empty else None),
            ("cost-saving", cost_figure(cost_frame) if cost_frame is not None else None),
        ]
    )
    overhead_numbers = overheads if isinstance(overheads, Mapping) else None
    page = _render(
        title=title,
        plotly_js=plotly_js() if any(f is not None for f in figures.values()) else None,
        headline=headlines(
            summary=summary_frame,
            overheads=overhead_numbers,
            bubbles=bubbles,
            side_task_steps=side,
            ledger=side_task_ledger,
            costs=costs,
            cost_note=cost_note,
        ),
        config=pairs(config),
        environment=pairs(environment),
        figures=figures,
        window=window,
        bubbles=table(per_rank),
        labels=table(label_table(bubbles)),
        summary=table(_beyond(summary_frame, per_rank))
        if summary_frame is not None
        else (pairs(summary) if isinstance(summary, Mapping) else None),
        steps=table(step_table(steps)),
        ledger=table(side_task_ledger) if side_task_ledger is not None else None,
        failed=table(failed) if len(failed) else None,
        overheads=pairs(overheads, named=True)
        if isinstance(overheads, Mapping)
        else (table(overhead_frame) if overhead_frame is not None else None),
        costs=table(cost_frame) if cost_frame is not None else None,
        cost_note=cost_note,
        files=files,
    )
    html_path.write_text(page, encoding="utf-8")
    return html_path


# -- a session's report --------------------------------------------------------------------------


class ReportSession(SessionView, Protocol):
    """The part of ``freeride_lab.lab.session.Session`` a report reads."""

    @property
    def bubbles(self) -> pd.DataFrame: ...
    def summary(self) -> pd.DataFrame: ...


def write_session_report(session: ReportSession, path: str | Path) -> Path:
    """Write a session's report (see :func:`write_report`) to ``path``; returns ``path``.

    Gathers the run's config, the environment, its tables, measured-vs-theory summary, the
    side-task ledger (``session.ledger()`` where the session has it), the failed side tasks
    (``session.tasks``), both cost-saving figures (``session.cost_saving()``; where it cannot
    count, the report says why) and :func:`overheads`.
    Works on a live run (a snapshot) and on a finished one (``Session.open``).
    """
    actions = session.actions
    side = session.side_task_steps
    steps = session.steps
    summary = session.summary() if len(actions) else None
    attributed = getattr(session, "attribution", None)  # bubbles with their split, if any
    bubbles = attributed if isinstance(attributed, pd.DataFrame) else session.bubbles
    ledger_fn = getattr(session, "ledger", None)
    ledger_frame = ledger_fn() if callable(ledger_fn) else None
    costs, cost_note = _costs(session, side)
    tasks = getattr(session, "tasks", None)
    environment = {
        "run_id": session.run_id,
        "state": str(getattr(session, "state", "")),
        "steps_done": getattr(session, "steps_done", None),
        **environment_info(),
    }
    return write_report(
        path,
        config=session.config.to_dict(),
        environment=environment,
        actions=actions,
        bubbles=bubbles,
        steps=steps,
        summary=summary,
        side_task_steps=side,
        side_task_ledger=ledger_frame
        if isinstance(ledger_frame, pd.DataFrame) and len(ledger_frame)
        else None,
        costs=costs,
        cost_note=cost_note,
        overheads=overheads(steps, side),
        tasks=tasks if isinstance(tasks, list) else None,
        title=f"freeride_lab run {session.run_id}",
    )


def _costs(session: ReportSession, side: pd.DataFrame) -> tuple[Any, str | None]:
    """(cost saving, None) or (None, why not): custom tasks that declare no reference
    throughput are named; a run too short or without quiet steps says so."""
    from freeride_lab.core.accounting import FREERIDE_REFERENCE_THROUGHPUT_PER_S
    from freeride_lab.tasks import REFERENCE_KEYS

    cost_fn = getattr(session, "cost_saving", None)
    if not callable(cost_fn) or side.empty:
        return None, None
    model_fn = getattr(session, "cost_model", None)
    known = (
        model_fn().reference_throughput_per_s
        if callable(model_fn)
        else FREERIDE_REFERENCE_THROUGHPUT_PER_S
    )
    names = sorted({str(n) for n in side["name"]})
    missing = [n for n in names if REFERENCE_KEYS.get(n, n) not in known]
    if missing:
        return None, (
            "not available for custom tasks without a reference throughput: "
            f"{', '.join(missing)} (declare reference_throughput, units per second on the "
            "reference GPU, on the task class)"
        )
    try:
        return cost_fn(), None
    except (ValueError, KeyError, ZeroDivisionError) as exc:  # e.g. no quiet steps yet
        return None, f"not available: {exc.args[0] if exc.args else exc}"
