"""The JupyterLab theme as the kernel sees it, and the dashboard's stylesheet.

    probe = ThemeProbe()
    probe.observe(lambda change: timeline.set_theme(change["new"]), names="theme")

Plotly draws in the kernel's choice of template, so the kernel must learn the page's theme.
:class:`ThemeProbe` is an invisible anywidget whose front end (``widgets/theme.js``) reads
JupyterLab's ``data-jp-theme-light`` attribute on ``<body>``, writes ``"light"`` or ``"dark"``
into the synced ``theme`` trait, and writes again when the user switches theme. It also carries
``widgets/dashboard.css``, whose colours are JupyterLab's CSS variables.
"""

from __future__ import annotations

import anywidget
import traitlets

from freeride_lab.ui.assets import asset_path

__all__ = ["ThemeProbe"]


class ThemeProbe(anywidget.AnyWidget):
    """Reports the page's JupyterLab theme in ``theme`` ("light" until a view reports)."""

    _esm = asset_path("theme.js")
    _css = asset_path("dashboard.css")

    theme = traitlets.Enum(["light", "dark"], default_value="light").tag(sync=True)

    def __repr__(self) -> str:
        return f"<ThemeProbe theme={self.theme!r}>"
