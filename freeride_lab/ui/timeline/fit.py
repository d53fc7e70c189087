"""Timeline figures that follow their cell's width, not only the window's.

Plotly's ``responsive`` config redraws a figure when the window resizes; a notebook cell also
narrows when a side panel opens or the notebook's width changes, and a figure drawn wide would
then overflow it. :class:`FigureFit` is an invisible anywidget placed inside the timeline's box;
its front end (``widgets/fit.js``) watches the box with a ``ResizeObserver`` and resizes the
Plotly figures in it once the width has settled (debounced; only on a real width change, so a
resize never triggers another).
"""

from __future__ import annotations

import anywidget

from freeride_lab.ui.assets import asset_path

__all__ = ["FigureFit"]


class FigureFit(anywidget.AnyWidget):
    """Resizes the Plotly figures of the ``.fr-timeline`` box it sits in to the box's width."""

    _esm = asset_path("fit.js")
    _css = ".fr-figure-fit { display: none; }"

    def __repr__(self) -> str:
        return "<FigureFit>"
