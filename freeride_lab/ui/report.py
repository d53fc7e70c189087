"""A run's report: one self-contained HTML page plus its data (Parquet, JSON, Chrome traces).

    >>> write_report("runs/r1/report/report.html", config=cfg.to_dict(),      # doctest: +SKIP
    ...              environment=environment_info(), actions=s.actions, bubbles=s.bubbles,
    ...              steps=s.steps, summary=s.summary(), side_task_steps=s.side_task_steps)

Beside ``report.html`` the directory gets ``actions.parquet``, ``bubbles.parquet``,
``steps.parquet``, ``side_task_steps.parquet``, ``summary.json`` and ``trace/rank-<r>.json``.
The page works offline: plotly.js is embedded once (in the first figure), every other figure
reuses it. Jinja2 autoescaping is on, so user strings (task names, config values) are text, and
plotly's JSON escapes ``<``, ``>`` and ``/`` inside its ``<script>`` blocks.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import math
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pandas as pd
import plotly.graph_objects as go
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup

from freeride_lab.core.attribution import PART_COLUMNS
from freeride_lab.core.budget import overrun_mask
from freeride_lab.ui.timeline import fractions_figure, safe_text, timeline_figure
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
SIDE_TASK_STEP_COLUMNS = [
    "task_id",
    "name",
    "stage",
    "rank",
    "step",
    "start_ms",
    "end_ms",
    "duration_ms",
    "progress",
    "unit",
    "overrun_ms",
]
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


@dataclass(frozen=True)
class Table:
    """Rows of display strings for the template (escaped there)."""

    columns: list[str]
    rows: list[list[str]]


def _cell(column: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if column.endswith("_frac"):
            return f"{value:.2%}"
        return f"{value:,.1f}" if abs(value) >= 1000 else f"{value:.3f}"
    if isinstance(value, dict | list | tuple):
        return json.dumps(_jsonable(value))
    return str(value)


def _table(frame: pd.DataFrame) -> Table:
    columns = [str(c) for c in frame.columns]
    rows = [
        [_cell(c, _scalar(v)) for c, v in zip(columns, row, strict=True)]
        for row in frame.itertuples(index=False)
    ]
    return Table(columns, rows)


def _pairs(mapping: Mapping[str, Any]) -> Table:
    return Table(
        ["key", "value"], [[str(k), _cell(str(k), _scalar(v))] for k, v in mapping.items()]
    )


def _scalar(value: Any) -> Any:
    return value.item() if hasattr(value, "item") and not isinstance(value, str) else value


def _jsonable(value: Any) -> Any:
    """JSON-safe copy: numpy scalars to Python, NaN/inf to None, frames to records."""
    if isinstance(value, pd.DataFrame):
        return [_jsonable(r) for r in value.to_dict("records")]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    value = _scalar(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def _frame(value: Any) -> pd.DataFrame | None:
    """A DataFrame from a frame, a dataclass or a mapping (scalars make one row)."""
    if value is None:
        return None
    if isinstance(value, pd.DataFrame):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, Mapping):
        if all(not isinstance(v, list | tuple | Mapping) for v in value.values()):
            return pd.DataFrame([dict(value)])
        return pd.DataFrame(value)
    raise TypeError(f"expected a DataFrame, a dataclass or a mapping, got {type(value).__name__}")


def bubble_table(bubbles: pd.DataFrame, summary: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per rank: steps, bubbles per step, bubble ms per step, mean bubble ms, measured/theory frac.

    Columns (in order): rank, steps, bubbles_per_step, bubble_ms_per_step, mean_bubble_ms;
    schedule_ms_per_step, peer_ms_per_step, host_ms_per_step when ``bubbles`` carries
    ``core.attribution``'s parts (why the bubbles are there); and ``measured_frac``/
    ``theory_frac`` when ``summary`` has them.
    """
    grouped = bubbles.groupby("rank", sort=True)
    n_steps = grouped["step"].nunique()
    columns = {
        "steps": n_steps,
        "bubbles_per_step": grouped.size() / n_steps,
        "bubble_ms_per_step": grouped["duration_ms"].sum() / n_steps,
        "mean_bubble_ms": grouped["duration_ms"].mean(),
    }
    if set(PART_COLUMNS) <= set(bubbles.columns):
        for part in PART_COLUMNS:
            columns[part.replace("_ms", "_ms_per_step")] = grouped[part].sum(min_count=1) / n_steps
    out = pd.DataFrame(columns).reset_index()
    if summary is not None and {"rank", "measured_frac", "theory_frac"} <= set(summary.columns):
        fractions = summary[["rank", "measured_frac", "theory_frac"]]
        out = out.merge(fractions, on="rank", how="outer").sort_values("rank")
    return out.reset_index(drop=True)


def _label_table(bubbles: pd.DataFrame) -> pd.DataFrame:
    """Mean bubble ms per rank and label (or kind, where unlabelled), one column per label."""
    if bubbles.empty:
        return pd.DataFrame()
    labels = bubbles["label"] if "label" in bubbles else pd.Series(None, index=bubbles.index)
    name = labels.where(labels.notna() & (labels != ""), bubbles["kind"]).astype(str)
    pivot = bubbles.assign(bubble=name).pivot_table(
        index="rank", columns="bubble", values="duration_ms", aggfunc="mean"
    )
    pivot.columns = [f"{c}_ms" for c in pivot.columns]
    return pivot.reset_index()


def step_table(steps: pd.DataFrame) -> pd.DataFrame:
    """Per rank: steps, step-time p50/p95/mean ms (the first step, warm-up, is left out if > 1)."""
    if steps.empty:
        return pd.DataFrame(columns=["rank", "steps", "p50_ms", "p95_ms", "mean_ms"])
    first = steps["step"].min()
    body = steps[steps["step"] > first] if steps["step"].nunique() > 1 else steps
    grouped = body.groupby("rank", sort=True)["duration_ms"]
    return pd.DataFrame(
        {
            "steps": grouped.size(),
            "p50_ms": grouped.quantile(0.5),
            "p95_ms": grouped.quantile(0.95),
            "mean_ms": grouped.mean(),
        }
    ).reset_index()


def _progress_figure(side_task_steps: pd.DataFrame) -> go.Figure:
    fig = go.Figure(
        layout={
            "height": 300,
            "margin": {"l": 60, "r": 20, "t": 40, "b": 40},
            "title": {"text": "side-task progress"},
            "xaxis": {"title": {"text": "ms since run start"}},
            "yaxis": {"title": {"text": "cumulative progress"}},
        }
    )
    for task_id, rows in side_task_steps.sort_values("end_ms").groupby("task_id", sort=False):
        unit = str(rows["unit"].iloc[0]) if "unit" in rows else ""
        name = f"{rows['name'].iloc[0]} ({task_id}, stage {rows['stage'].iloc[0]})"
        fig.add_scatter(
            x=rows["end_ms"].to_numpy(float),
            y=rows["progress"].cumsum().to_numpy(float),
            mode="lines",
            name=safe_text(name),
            hovertemplate=f"%{{y:,.0f}} {safe_text(unit)} at %{{x:.0f}} ms<extra></extra>",
        )
    return fig


def _cost_figure(costs: pd.DataFrame) -> go.Figure | None:
    published = next((c for c in costs.columns if "published" in str(c)), None)
    corrected = next((c for c in costs.columns if "corrected" in str(c)), None)
    if published is None or corrected is None:
        return None
    label_col = next(
        (c for c in ("name", "task", "side_task", "task_id") if c in costs.columns), None
    )
    labels = (
        [safe_text(v) for v in costs[label_col]]
        if label_col
        else ["run"]
        if len(costs) == 1
        else [str(i) for i in range(len(costs))]
    )
    fig = go.Figure(
        layout={
            "barmode": "group",
            "height": 300,
            "margin": {"l": 60, "r": 20, "t": 40, "b": 40},
            "title": {"text": "cost saving: as published vs overhead-corrected"},
            "yaxis": {"tickformat": ".1%"},
        }
    )
    for column, title, color in (
        (published, "as published", "#4c78a8"),
        (corrected, "overhead-corrected", "#f58518"),
    ):
        fig.add_bar(
            x=labels,
            y=costs[column].to_numpy(float),
            name=title,
            marker={"color": color},
            hovertemplate="%{x}: %{y:.2%}<extra>" + title + "</extra>",
        )
    return fig


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


def _html(figures: Sequence[tuple[str, go.Figure | None]]) -> dict[str, Markup | None]:
    """Each figure as an HTML fragment; plotly.js goes into the first one only."""
    out: dict[str, Markup | None] = {}
    embedded = False
    for div_id, fig in figures:
        if fig is None:
            out[div_id] = None
            continue
        fragment = fig.to_html(
            include_plotlyjs=not embedded,
            full_html=False,
            div_id=div_id,
            config={"displaylogo": False, "responsive": True},
        )
        embedded = True
        out[div_id] = Markup(fragment)  # plotly's own HTML; its JSON escapes "<", ">" and "/"
    return out


def _write_tables(out: Path, tables: Mapping[str, pd.DataFrame]) -> list[str]:
    names = []
    for name, frame in tables.items():
        frame.to_parquet(out / f"{name}.parquet", index=False)
        names.append(f"{name}.parquet")
    return names


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
    overheads: Any = None,
    title: str = "freeride_lab run report",
    timeline_steps: int = 10,
) -> Path:
    """Write ``path`` (HTML) and the run's data beside it; returns ``path``.

    Args:
        config: the run's settings (``RunConfig.to_dict()``), shown as a table.
        environment: versions and hardware (see :func:`environment_info`).
        summary: per-rank ``[rank, measured_frac, theory_frac, ...]`` or a mapping of numbers.
        side_task_ledger: one row per side task; derived from ``side_task_steps`` when None.
        costs: a ``CostSaving``, a mapping or a frame with ``saving_published_frac`` and
            ``saving_corrected_frac`` (any columns containing "published"/"corrected").
        overheads: a mapping or a frame of overhead numbers, shown as a table.
        timeline_steps: how many of the newest steps the timeline figure draws (all are in the
            Parquet files and traces).
    """
    from freeride_lab.core.accounting import ledger

    html_path = Path(path)
    out = html_path.parent
    out.mkdir(parents=True, exist_ok=True)
    side = (
        side_task_steps
        if side_task_steps is not None
        else pd.DataFrame(columns=SIDE_TASK_STEP_COLUMNS)
    )
    if side_task_ledger is None and not side.empty:
        side_task_ledger = ledger(side)
    summary_frame = summary if isinstance(summary, pd.DataFrame) else None
    cost_frame, overhead_frame = _frame(costs), _frame(overheads)

    files = _write_tables(
        out, {"actions": actions, "bubbles": bubbles, "steps": steps, "side_task_steps": side}
    )
    ranks = set(actions["rank"].astype(int)) | set(bubbles["rank"].astype(int))
    world_size = max(int(config.get("stages") or 1), max(ranks, default=0) + 1)
    traces = write_traces(actions, bubbles, side, out / "trace", world_size, steps)
    files += [str(p.relative_to(out)) for p in traces]
    summary_doc = {
        "config": config,
        "environment": environment,
        "summary": summary,
        "bubbles_per_rank": bubble_table(bubbles, summary_frame),
        "step_times": step_table(steps),
        "side_task_ledger": side_task_ledger,
        "costs": cost_frame,
        "overheads": overhead_frame,
    }
    (out / "summary.json").write_text(json.dumps(_jsonable(summary_doc), indent=2, allow_nan=False))
    files.append("summary.json")

    figures = _html(
        [
            (
                "timeline",
                timeline_figure(actions, bubbles, side, last_steps=timeline_steps)
                if len(actions) or len(bubbles)
                else None,
            ),
            (
                "bubble-fractions",
                fractions_figure(summary_frame) if summary_frame is not None else None,
            ),
            ("side-task-progress", _progress_figure(side) if not side.empty else None),
            ("cost-saving", _cost_figure(cost_frame) if cost_frame is not None else None),
        ]
    )
    shown = sorted(set(pd.concat([actions["step"], bubbles["step"]]).dropna().astype(int)))
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=StrictUndefined,
        keep_trailing_newline=True,
    )
    page = env.get_template("report.html.j2").render(
        title=title,
        config=_pairs(config),
        environment=_pairs(environment),
        figures=figures,
        timeline_steps=shown[-timeline_steps:],
        bubbles=_table(bubble_table(bubbles, summary_frame)),
        labels=_table(_label_table(bubbles)),
        summary=_table(summary_frame)
        if summary_frame is not None
        else (_pairs(summary) if isinstance(summary, Mapping) else None),
        steps=_table(step_table(steps)),
        ledger=_table(side_task_ledger) if side_task_ledger is not None else None,
        overheads=_table(overhead_frame) if overhead_frame is not None else None,
        costs=_table(cost_frame) if cost_frame is not None else None,
        files=files,
    )
    html_path.write_text(page, encoding="utf-8")
    return html_path


# -- a session's report --------------------------------------------------------------------------


class ReportSession(Protocol):
    """The part of ``freeride_lab.lab.session.Session`` a report reads."""

    run_id: str
    config: Any  # RunConfig

    @property
    def actions(self) -> pd.DataFrame: ...
    @property
    def bubbles(self) -> pd.DataFrame: ...
    @property
    def steps(self) -> pd.DataFrame: ...
    @property
    def side_task_steps(self) -> pd.DataFrame: ...
    def summary(self) -> pd.DataFrame: ...


def overheads(steps: pd.DataFrame, side_task_steps: pd.DataFrame) -> dict[str, float]:
    """What side tasks cost the training run, from its own tables.

    A step's time is its slowest rank's ``duration_ms``; steps that hosted a side-task step are
    compared with those that did not (the first step, warm-up, is left out when there are more).
    Keys: steps_without_side_tasks, steps_with_side_tasks, step_p50_ms_without_side_tasks,
    step_p50_ms_with_side_tasks, training_overhead_frac (NaN without both kinds of step),
    side_task_steps, side_task_overruns, side_task_overrun_ms.
    """
    nan = math.nan
    per_step = steps.groupby("step")["duration_ms"].max() if len(steps) else pd.Series(dtype=float)
    if len(per_step) > 1:
        per_step = per_step.iloc[1:]
    hosted = set(side_task_steps["step"].astype(int)) if len(side_task_steps) else set()
    with_tasks = per_step[per_step.index.isin(hosted)]
    without = per_step[~per_step.index.isin(hosted)]
    p50_with = float(with_tasks.median()) if len(with_tasks) else nan
    p50_without = float(without.median()) if len(without) else nan
    overrun = (
        side_task_steps["overrun_ms"].fillna(0.0)
        if "overrun_ms" in side_task_steps
        else pd.Series(dtype=float)
    )
    return {
        "steps_without_side_tasks": float(len(without)),
        "steps_with_side_tasks": float(len(with_tasks)),
        "step_p50_ms_without_side_tasks": p50_without,
        "step_p50_ms_with_side_tasks": p50_with,
        "training_overhead_frac": p50_with / p50_without - 1 if p50_without > 0 else nan,
        "side_task_steps": float(len(side_task_steps)),
        "side_task_overruns": float(overrun_mask(overrun).sum()),
        "side_task_overrun_ms": float(overrun.sum()),
    }


def write_session_report(session: ReportSession, path: str | Path) -> Path:
    """Write a session's report (see :func:`write_report`) to ``path``; returns ``path``.

    Gathers the run's config, the environment, its tables, measured-vs-theory summary, the
    side-task ledger (``session.ledger()`` where the session has it), both cost-saving figures
    (``session.cost_saving()``, left out while it has nothing to count) and :func:`overheads`.
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
    costs: Any = None
    cost_fn = getattr(session, "cost_saving", None)
    if callable(cost_fn) and len(side):
        try:
            costs = cost_fn()
        except (ValueError, KeyError, ZeroDivisionError) as exc:  # e.g. no vanilla steps yet
            costs = {"cost_saving": f"not available: {exc}"}
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
        overheads=overheads(steps, side),
        title=f"freeride_lab run {session.run_id}",
    )
