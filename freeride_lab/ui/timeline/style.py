"""Colours, patterns and themes of the timeline: colour-blind safe, never colour alone.

Every colour is from the Okabe-Ito palette (safe for the common colour-vision deficiencies),
and every category also differs by something other than colour: its legend label, and for
bubbles, side tasks and overruns a fill pattern. :func:`figure_theme` picks the Plotly
template from the JupyterLab theme (light or dark) and leaves the backgrounds transparent, so
a figure sits on the notebook's own background.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "BUBBLE",
    "COMPUTE",
    "OKABE_ITO",
    "OVERRUN",
    "SIDE_TASK_STYLES",
    "Category",
    "Theme",
    "figure_theme",
    "side_task_category",
]

Theme = Literal["light", "dark"]

# Okabe & Ito (2008), "Color Universal Design"; grey for what is not work (bubbles)
OKABE_ITO = {
    "orange": "#E69F00",
    "sky_blue": "#56B4E9",
    "bluish_green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "reddish_purple": "#CC79A7",
    "grey": "#999999",
}


@dataclass(frozen=True)
class Category:
    """Legend name and style of one trace."""

    name: str  # HTML-escaped
    color: str
    hovertemplate: str
    width: float = 0.8  # bar thickness within a lane (1.0 = touching)
    opacity: float = 1.0
    pattern: str = ""  # plotly marker pattern shape ("/", ".", "x", ...); "" for solid


_ACTION_HOVER = (
    "<b>%{customdata[0]}</b> step %{customdata[1]}<br>"
    "%{customdata[2]} ms, from %{customdata[3]} ms<extra>rank %{customdata[4]}</extra>"
)
COMPUTE = {
    "F": Category("forward F", OKABE_ITO["blue"], _ACTION_HOVER),
    "B": Category("backward B", OKABE_ITO["orange"], _ACTION_HOVER),
    "I": Category("backward input I", OKABE_ITO["reddish_purple"], _ACTION_HOVER),
    "W": Category("backward weight W", OKABE_ITO["sky_blue"], _ACTION_HOVER),
}
BUBBLE = Category(
    "bubble",
    OKABE_ITO["grey"],
    "<b>bubble %{customdata[0]}</b> (%{customdata[1]}) step %{customdata[2]}<br>"
    "%{customdata[3]} ms measured, %{customdata[4]} predicted<br>"
    "between %{customdata[5]}%{customdata[7]}<extra>rank %{customdata[6]}</extra>",
    opacity=0.55,
    pattern="/",
)
OVERRUN = Category(
    "overrun",
    OKABE_ITO["vermillion"],
    "<b>overrun</b> %{customdata[0]} step %{customdata[1]}<br>"
    "%{customdata[2]} ms past the bubble end<extra>rank %{customdata[3]}</extra>",
    width=0.36,  # side-task and overrun bars sit inside the bubble bar
    pattern="x",
)
SIDE_HOVER = (
    "<b>%{customdata[0]}</b> step %{customdata[1]}<br>%{customdata[2]} ms, "
    "progress %{customdata[3]}<br>overrun %{customdata[4]} ms<extra>rank %{customdata[5]}</extra>"
)
# (colour, pattern) of the n-th side task of a run; colours first, then patterns tell them apart
SIDE_TASK_STYLES = [
    (OKABE_ITO["bluish_green"], "."),
    (OKABE_ITO["yellow"], "+"),
    (OKABE_ITO["bluish_green"], "-"),
    (OKABE_ITO["yellow"], "|"),
    (OKABE_ITO["bluish_green"], "\\"),
    (OKABE_ITO["yellow"], "."),
]


def side_task_category(index: int, label: str) -> Category:
    """The style of the ``index``-th side task of a run, named ``label`` (HTML-escaped)."""
    color, pattern = SIDE_TASK_STYLES[index % len(SIDE_TASK_STYLES)]
    return Category(label, color, SIDE_HOVER, width=OVERRUN.width, opacity=0.95, pattern=pattern)


def figure_theme(theme: Theme) -> dict[str, Any]:
    """Layout keys for ``theme``: Plotly's matching template, transparent backgrounds."""
    if theme not in ("light", "dark"):
        raise ValueError(f"theme={theme!r}; valid: 'light', 'dark'")
    return {
        "template": "plotly_dark" if theme == "dark" else "plotly_white",
        "paper_bgcolor": "rgba(0,0,0,0)",
        "plot_bgcolor": "rgba(0,0,0,0)",
    }
