"""The figures of a run's report, as HTML fragments that share one copy of plotly.js.

The page embeds plotly.js once: the basic partial bundle (scatter and bar traces, all a report
draws; ``widgets/vendor/plotly-basic.min.js``, 1.2 MB) where it is installed, else plotly.py's
full bundle (4.8 MB). Figure fragments carry only their data.

A long run's timeline would be megabytes of bars, so the report draws a window of it
(:func:`timeline_window`): the newest steps that fit ``max_bars_per_rank`` bars per rank, with
gaps shorter than ``min_bubble_ms`` left out of the drawing. Every span stays in the Parquet
files and Chrome traces beside the report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from markupsafe import Markup

from freeride_lab.ui.assets import asset_path
from freeride_lab.ui.timeline import safe_text, timeline_figure

__all__ = [
    "TimelineWindow",
    "cost_figure",
    "figure_fragments",
    "plotly_js",
    "progress_figure",
    "timeline_window",
    "window_figure",
]

PLOTLY_BASIC = "vendor/plotly-basic.min.js"


def plotly_js() -> Markup:
    """The plotly.js source to inline once per page (the basic bundle where installed)."""
    try:
        text = asset_path(PLOTLY_BASIC).read_text(encoding="utf-8")
    except FileNotFoundError:
        from plotly.offline import get_plotlyjs

        text = get_plotlyjs()
    if "</script" in text.lower():  # would end the inline <script> early
        raise ValueError("the plotly.js bundle holds '</script'; it cannot be inlined")
    return Markup(text)  # plotly.js itself, not user text


@dataclass(frozen=True)
class TimelineWindow:
    """The part of a run a report's timeline draws, and what it leaves out."""

    actions: pd.DataFrame
    bubbles: pd.DataFrame
    side_task_steps: pd.DataFrame
    steps: list[int]  # the steps drawn, ascending
    total_steps: int  # steps the run recorded
    hidden_bubbles: int  # bubbles in the drawn steps shorter than min_bubble_ms


def timeline_window(
    actions: pd.DataFrame,
    bubbles: pd.DataFrame,
    side_task_steps: pd.DataFrame,
    *,
    last_steps: int = 10,
    max_bars_per_rank: int = 400,
    max_bars: int = 2000,
    min_bubble_ms: float = 0.05,
) -> TimelineWindow:
    """The newest ``last_steps`` steps (fewer where their bars would pass
    ``max_bars_per_rank`` on some rank or ``max_bars`` in all; at least one), bubbles under
    ``min_bubble_ms`` left out. A bar costs about 80 bytes of the page.

    Raises:
        ValueError: ``last_steps``, ``max_bars_per_rank`` or ``max_bars`` below 1, or
            ``min_bubble_ms`` < 0.
    """
    for name, value in (
        ("last_steps", last_steps),
        ("max_bars_per_rank", max_bars_per_rank),
        ("max_bars", max_bars),
    ):
        if value < 1:
            raise ValueError(f"{name}={value!r} must be >= 1")
    if not min_bubble_ms >= 0:
        raise ValueError(f"min_bubble_ms={min_bubble_ms!r} must be >= 0 (0 draws every gap)")
    kept = bubbles[bubbles["duration_ms"] >= min_bubble_ms]
    frames = [f[["step", "rank"]] for f in (actions, kept, side_task_steps) if len(f)]
    bars = pd.concat(frames) if frames else pd.DataFrame(columns=["step", "rank"])
    all_steps = sorted({int(s) for s in bars["step"].dropna()})
    per_rank = bars.groupby(["step", "rank"]).size()
    busiest, in_step = per_rank.groupby("step").max(), per_rank.groupby("step").sum()
    shown: list[int] = []
    rank_total = total = 0
    for step in reversed(all_steps[-last_steps:]):
        rank_count, count = int(busiest.get(step, 0)), int(in_step.get(step, 0))
        if shown and (rank_total + rank_count > max_bars_per_rank or total + count > max_bars):
            break
        shown.append(step)
        rank_total += rank_count
        total += count
    shown.sort()

    def pick(frame: pd.DataFrame) -> pd.DataFrame:
        return frame[frame["step"].isin(shown)]

    in_window = pick(bubbles)
    return TimelineWindow(
        actions=pick(actions),
        bubbles=pick(kept),
        side_task_steps=pick(side_task_steps),
        steps=shown,
        total_steps=len(all_steps),
        hidden_bubbles=int((in_window["duration_ms"] < min_bubble_ms).sum()),
    )


def window_figure(window: TimelineWindow) -> go.Figure | None:
    """The timeline of ``window`` (None when it has nothing to draw)."""
    if window.actions.empty and window.bubbles.empty:
        return None
    side = window.side_task_steps if len(window.side_task_steps) else None
    fig = timeline_figure(window.actions, window.bubbles, side)
    fig.update_layout(autosize=True, width=None)
    return fig


def progress_figure(side_task_steps: pd.DataFrame, *, max_points: int = 300) -> go.Figure:
    """Cumulative progress of each side task over the run, in its own unit; a task with more
    than ``max_points`` steps is drawn through evenly spaced ones (its last included), which
    keeps the line's shape: cumulative progress only grows."""
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
        x, y = rows["end_ms"].to_numpy(float), rows["progress"].cumsum().to_numpy(float)
        if len(x) > max_points:
            keep = np.unique(np.linspace(0, len(x) - 1, max_points).round().astype(int))
            x, y = x[keep], y[keep]
        fig.add_scatter(
            x=x,
            y=y,
            mode="lines",
            name=safe_text(name),
            hovertemplate=f"%{{y:,.0f}} {safe_text(unit)} at %{{x:.0f}} ms<extra></extra>",
        )
    return fig


def cost_figure(costs: pd.DataFrame) -> go.Figure | None:
    """Published vs overhead-corrected cost saving, one bar pair per row of ``costs``."""
    published = next((c for c in costs.columns if "published" in str(c)), None)
    corrected = next((c for c in costs.columns if "corrected" in str(c)), None)
    if published is None or corrected is None:
        return None
    label_col = next(
        (c for c in ("name", "task", "side_task", "task_id") if c in costs.columns), None
    )
    if label_col:
        labels = [safe_text(v) for v in costs[label_col]]
    else:
        labels = ["run"] if len(costs) == 1 else [str(i) for i in range(len(costs))]
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


def figure_fragments(
    figures: Sequence[tuple[str, go.Figure | None]],
) -> dict[str, Markup | None]:
    """Each figure as an HTML fragment without plotly.js (the page inlines it once)."""
    out: dict[str, Markup | None] = {}
    for div_id, fig in figures:
        if fig is None:
            out[div_id] = None
            continue
        fragment = fig.to_html(
            include_plotlyjs=False,
            full_html=False,
            div_id=div_id,
            config={"displaylogo": False, "responsive": True},
        )
        out[div_id] = Markup(fragment)  # plotly's own HTML; its JSON escapes "<", ">" and "/"
    return out
