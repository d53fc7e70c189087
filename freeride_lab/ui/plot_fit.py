"""A widget that keeps the Plotly figures of its box as wide as the box, whatever resizes it.

    box = ipywidgets.VBox([figure_widget, PlotFit()])

Plotly's FigureWidget resizes a ``responsive`` figure only when the browser window resizes; a
JupyterLab cell also changes width on its own (a side panel opens or closes, the notebook is
split), and the figure would keep its old width: past the edge of a narrower cell, half empty
in a wider one. :class:`PlotFit` is an invisible anywidget whose front end
(``widgets/plot_fit.js``) watches the width of every Plotly figure in its parent box with a
``ResizeObserver`` and runs that figure's own resize when it changes. The figures must be
responsive (``config={"responsive": True}``) and have no fixed width in their layout.
"""

from __future__ import annotations

import anywidget

from freeride_lab.ui.assets import asset_path

__all__ = ["PlotFit"]


class PlotFit(anywidget.AnyWidget):
    """Resizes the Plotly figures beside it (in the same box) when the box's width changes."""

    _esm = asset_path("plot_fit.js")

    def __repr__(self) -> str:
        return "<PlotFit>"
