"""Plotly figures of the timeline: the lane layout, bars, and the bubble-fraction chart.

Pure functions of the tables (and the theme); :mod:`~freeride_lab.ui.timeline.widget` keeps
them live and reports draw them once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from freeride_lab.ui.timeline.style import BUBBLE, COMPUTE, Theme, figure_theme
from freeride_lab.ui.timeline.traces import (
    BarTrace,
    in_steps,
    lane_ranks,
    safe_text,
    steps_in_window,
    table_steps,
    timeline_traces,
)

__all__ = [
    "FIGURE_CONFIG",
    "FRACTION_COLUMNS",
    "fractions_figure",
    "go_bar",
    "lane_layout",
    "set_fractions",
    "set_widget_height",
    "timeline_figure",
]

# the tool bar shows on hover only and carries no logo; figures in the dashboard have no
# Plotly title for it to cover (their titles are HTML above them)
FIGURE_CONFIG = {"displaylogo": False, "displayModeBar": "hover", "responsive": True}


def lane_layout(ranks: Sequence[int], title: str | None, theme: Theme = "light") -> dict[str, Any]:
    """The timeline's layout: one lane per rank (top to bottom), legend below, ``theme``'s
    template; no fixed width, so the figure takes its container's."""
    ranks = list(ranks)
    return {
        **figure_theme(theme),
        "autosize": True,
        "barmode": "overlay",
        "title": {"text": safe_text(title)} if title else None,
        "xaxis": {"title": {"text": "ms since run start"}, "zeroline": False},
        "yaxis": {
            "tickmode": "array",
            "tickvals": [float(r) for r in ranks],
            "ticktext": [f"rank {r}" for r in ranks],
            "autorange": "reversed",
        },
        "height": 120 + 48 * max(len(ranks), 1),
        "margin": {"l": 70, "r": 20, "t": 40 if title else 20, "b": 40, "autoexpand": True},
        "legend": {"orientation": "h", "yanchor": "top", "y": -0.3, "x": 0},
        "hoverlabel": {"align": "left"},
    }


# [Note: a widget's height and its width]
# plotly.js, told a new height alone (Plotly.relayout or Plotly.update), turns ``autosize`` off
# and writes the width the figure has at that moment into its layout; from then on the figure
# keeps that width (its resize on window changes does nothing to a layout with both sizes), so
# it runs past a cell that narrows and leaves one that widens half empty. The widget's height
# therefore travels with ``autosize`` on and no width, in one relayout.
def set_widget_height(fig: go.FigureWidget, height: int | None) -> None:
    """Set ``fig``'s height and keep its width its container's: see [Note: a widget's height and
    its width]. Nothing is sent when the height is unchanged."""
    changed = fig._perform_plotly_relayout({"height": height})
    if changed:
        fig._send_relayout_msg({**changed, "width": None, "autosize": True})


def go_bar(trace: BarTrace) -> go.Bar:
    """One category's bars; hidden from the legend while it has none (no empty entries)."""
    c = trace.category
    return go.Bar(
        orientation="h",
        name=c.name,
        width=c.width,
        opacity=c.opacity,
        marker={"color": c.color, "pattern": {"shape": c.pattern, "solidity": 0.3}},
        showlegend=bool(len(trace.x)),
        hovertemplate=c.hovertemplate,
        base=trace.base,
        x=trace.x,
        y=trace.y,
        customdata=trace.customdata,
    )


def timeline_figure(
    actions: pd.DataFrame,
    bubbles: pd.DataFrame,
    side_task_steps: pd.DataFrame | None = None,
    *,
    last_steps: int | None = None,
    title: str | None = None,
) -> go.Figure:
    """A static timeline figure (for reports); ``last_steps`` keeps only the newest steps."""
    if last_steps is not None:
        shown = steps_in_window(table_steps(actions, bubbles), last_steps)
        actions, bubbles = (
            actions[actions["step"].isin(shown)],
            bubbles[bubbles["step"].isin(shown)],
        )
        side_task_steps = in_steps(side_task_steps, shown)
    traces = timeline_traces(actions, bubbles, side_task_steps)
    return go.Figure(
        [go_bar(t) for t in traces], layout=lane_layout(lane_ranks(actions, bubbles), title)
    )


FRACTION_COLUMNS = ["rank", "measured_frac", "theory_frac"]


def fractions_figure(
    summary: pd.DataFrame | None, *, widget: bool = False, theme: Theme = "light"
) -> go.Figure:
    """Measured vs theory bubble fraction per rank, from ``summary``'s FRACTION_COLUMNS.

    A widget has no Plotly title (the dashboard titles it in HTML); a static figure has one.
    """
    cls = go.FigureWidget if widget else go.Figure
    bars = [
        go.Bar(
            name=column.removesuffix("_frac"),
            marker={"color": color, "pattern": {"shape": pattern, "solidity": 0.3}},
            hovertemplate="rank %{x}: %{y:.1%}<extra>%{fullData.name}</extra>",
        )
        for column, color, pattern in (
            ("measured_frac", COMPUTE["F"].color, ""),
            ("theory_frac", BUBBLE.color, "/"),
        )
    ]
    fig = cls(  # traces at construction: see [Note: widget messages before the front end]
        data=bars,
        layout={
            "barmode": "group",
            "height": 260,
            "width": 320,
            **figure_theme(theme),
            "margin": {"l": 50, "r": 10, "t": 20 if widget else 40, "b": 40},
            "title": None if widget else {"text": "bubble fraction"},
            "yaxis": {"range": [0, 1], "tickformat": ".0%"},
            "legend": {"orientation": "h", "y": -0.2},
        },
    )
    set_fractions(fig, summary)
    return fig


def set_fractions(fig: go.Figure, summary: pd.DataFrame | None) -> None:
    """Put ``summary``'s fractions per rank into ``fig``'s two traces (none: empty bars)."""
    frame = pd.DataFrame(columns=FRACTION_COLUMNS)
    if isinstance(summary, pd.DataFrame) and set(FRACTION_COLUMNS) <= set(summary.columns):
        frame = summary
    ranks = [f"{int(r)}" for r in frame["rank"]]
    for trace, column in zip(fig.data, ("measured_frac", "theory_frac"), strict=True):
        trace.x = ranks
        trace.y = np.asarray(frame[column], dtype=np.float64)
