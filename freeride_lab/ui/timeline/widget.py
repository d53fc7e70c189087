"""The live timeline widget: step controls above the lane figure and the fraction chart.

:class:`Timeline` keeps one FigureWidget per figure and redraws the visible window of steps in
one ``batch_update`` per change; :meth:`Timeline.set_theme` follows JupyterLab's light or dark
theme. The figures sit in a wrapping flex box, so a narrow cell stacks them instead of scrolling.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import pandas as pd
import plotly.graph_objects as go

from freeride_lab.core.bubbles import BUBBLE_COLUMNS
from freeride_lab.lab.frames import ACTION_COLUMNS
from freeride_lab.ui.timeline.figures import (
    FIGURE_CONFIG,
    fractions_figure,
    go_bar,
    lane_layout,
    set_fractions,
    set_widget_height,
)
from freeride_lab.ui.timeline.style import Theme, figure_theme
from freeride_lab.ui.timeline.traces import (
    in_steps,
    lane_ranks,
    side_task_names,
    steps_in_window,
    table_steps,
    timeline_traces,
)

if TYPE_CHECKING:
    import ipywidgets

__all__ = ["Timeline"]


class Timeline:
    """Live timeline widget: a FigureWidget of rank lanes plus a measured-vs-theory fraction chart.

    Call :meth:`update` (from any thread) with the current tables; it redraws the window in one
    ``batch_update``. :meth:`select_step` pins one step, :meth:`follow_latest` returns to the
    moving window of the last ``window_steps`` steps.
    """

    def __init__(self, *, window_steps: int = 3, title: str | None = None) -> None:
        if window_steps < 1:
            raise ValueError(f"window_steps={window_steps!r} must be >= 1 (steps shown at once)")
        self.window_steps = window_steps
        self.redraws = 0
        empty = timeline_traces(
            pd.DataFrame(columns=ACTION_COLUMNS), pd.DataFrame(columns=BUBBLE_COLUMNS)
        )
        # traces at construction: see [Note: widget messages before the front end]
        self.figure = go.FigureWidget(
            data=[go_bar(trace) for trace in empty], layout=lane_layout([], title)
        )
        self.fractions = fractions_figure(None, widget=True)
        self.theme: Theme = "light"
        for fig in (self.figure, self.fractions):
            fig._config = dict(FIGURE_CONFIG)
        self._summary: pd.DataFrame | None = None
        self._repainted: set[int] = set()  # ids of figures repainted for their first view
        for fig in (self.figure, self.fractions):
            fig.observe(self._on_first_view, names="_js2py_traceDeltas")
        self._title = title
        self._side_names: list[str] = []
        self._selected: int | None = None
        self._tables: tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame | None] | None = None
        self._lock = threading.RLock()
        self._widget: ipywidgets.Box | None = None
        self._controls: tuple[ipywidgets.Checkbox, ipywidgets.IntSlider] | None = None
        self._syncing = False  # True while the controls are set from Python (ignore their events)

    def __repr__(self) -> str:
        mode = "latest" if self._selected is None else f"step {self._selected}"
        return f"<Timeline window_steps={self.window_steps} showing={mode} redraws={self.redraws}>"

    @property
    def following(self) -> bool:
        """True while the window follows the newest steps."""
        return self._selected is None

    @property
    def shown_steps(self) -> list[int]:
        """Steps currently drawn."""
        with self._lock:
            if self._tables is None:
                return []
            actions, bubbles, _ = self._tables
            return steps_in_window(table_steps(actions, bubbles), self.window_steps, self._selected)

    def update(
        self,
        actions: pd.DataFrame,
        bubbles: pd.DataFrame,
        side_task_steps: pd.DataFrame | None = None,
        *,
        summary: pd.DataFrame | None = None,
    ) -> None:
        """Replace the data and redraw the visible window (thread-safe)."""
        with self._lock:
            self._tables = (actions, bubbles, side_task_steps)
            self._draw()
            if summary is not None:
                self._summary = summary
                with self.fractions.batch_update():
                    set_fractions(self.fractions, summary)
        self._sync_controls()

    # [Note: widget messages before the front end]
    # A FigureWidget's front-end model only listens for plotly's restyle/relayout/addTraces
    # messages once its ES module has loaded (several MB; seconds on a busy machine). Whatever
    # Python sends before that is lost, so (1) both figures get their traces at construction,
    # where they travel in the widget's initial state, and (2) when a figure's first view
    # reports back (it sends ``_js2py_traceDeltas`` after drawing), the current drawing is sent
    # again: cleared and redrawn, since plotly sends nothing for unchanged values.
    def _on_first_view(self, change: dict[str, Any]) -> None:
        fig = change["owner"]
        if not change["new"] or id(fig) in self._repainted:
            return
        self._repainted.add(id(fig))
        with self._lock:
            if fig is self.figure and self._tables is not None:
                with fig.batch_update():
                    for data in fig.data:
                        data.base, data.x, data.y, data.customdata = [], [], [], []
                    fig.layout.yaxis.tickvals, fig.layout.yaxis.ticktext = None, None
                    fig.layout.height = None
                self._draw()
            elif fig is self.fractions and self._summary is not None:
                with fig.batch_update():
                    set_fractions(fig, None)
                with fig.batch_update():
                    set_fractions(fig, self._summary)

    def select_step(self, step: int) -> None:
        """Show only ``step`` (stops following the newest steps)."""
        with self._lock:
            self._selected = int(step)
            self._draw()
        self._sync_controls()

    def follow_latest(self) -> None:
        """Show the last ``window_steps`` steps and keep following new ones."""
        with self._lock:
            self._selected = None
            self._draw()
        self._sync_controls()

    def _draw(self) -> None:
        if self._tables is None:
            return
        all_actions, all_bubbles, side = self._tables
        shown = self.shown_steps
        actions = all_actions[all_actions["step"].isin(shown)]
        bubbles = all_bubbles[all_bubbles["step"].isin(shown)]
        # every task of the run keeps one trace (and colour) from its first appearance on
        names = list(dict.fromkeys([*self._side_names, *side_task_names(side)]))
        traces = timeline_traces(actions, bubbles, in_steps(side, shown), side_task_order=names)
        fixed, tasks, overrun = traces[:5], traces[5:-1], traces[-1]
        for trace in tasks[len(self._side_names) :]:  # a new task: its trace is added once
            self.figure.add_trace(go_bar(trace))
        self._side_names = names
        ordered = [*fixed, overrun, *tasks]  # the figure's order
        with self.figure.batch_update():
            for data, trace in zip(self.figure.data, ordered, strict=True):
                data.base, data.x, data.y = trace.base, trace.x, trace.y
                data.customdata = trace.customdata
                data.showlegend = bool(len(trace.x))  # no legend entry for what is not there
            layout = lane_layout(lane_ranks(all_actions, all_bubbles), self._title)
            self.figure.layout.yaxis.tickvals = layout["yaxis"]["tickvals"]
            self.figure.layout.yaxis.ticktext = layout["yaxis"]["ticktext"]
        set_widget_height(self.figure, layout["height"])  # not in the batch: it would fix the width
        self.redraws += 1

    # -- display -------------------------------------------------------------------------------

    @property
    def widget(self) -> ipywidgets.Box:
        """The displayable widget: step controls above the timeline and the fraction chart."""
        if self._widget is None:
            import ipywidgets

            from freeride_lab.ui.plot_fit import PlotFit

            follow = ipywidgets.Checkbox(
                value=True,
                description="follow latest",
                indent=False,
                tooltip="show the newest steps as they arrive",
                layout=ipywidgets.Layout(width="auto"),
            )
            step = ipywidgets.IntSlider(
                value=0,
                min=0,
                max=0,
                description="step",
                disabled=True,
                continuous_update=False,
                tooltip="the step shown (arrow keys move it)",
                layout=ipywidgets.Layout(flex="1 1 240px", min_width="0", max_width="480px"),
            )
            follow.observe(lambda change: self._on_follow(bool(change["new"])), names="value")
            step.observe(lambda change: self._on_step(int(change["new"])), names="value")
            self._controls = (follow, step)
            wrap = ipywidgets.Layout(display="flex", flex_flow="row wrap", width="100%")
            self.figure.layout.width = None
            lanes = ipywidgets.VBox(  # a column: the figure stretches to the box's width
                [self.figure], layout=ipywidgets.Layout(flex="1 1 420px", min_width="0")
            )
            fractions_title = ipywidgets.HTML(
                "<div class='fr-dash-title'>bubble fraction per rank</div>"
            )
            fractions = ipywidgets.VBox(
                [fractions_title, self.fractions], layout=ipywidgets.Layout(flex="0 0 320px")
            )
            self._widget = ipywidgets.VBox(
                [
                    ipywidgets.HBox(
                        [follow, step],
                        layout=ipywidgets.Layout(flex_flow="row wrap", width="100%"),
                    ).add_class("fr-timeline-controls"),
                    ipywidgets.Box([lanes, fractions], layout=wrap),
                    PlotFit(),  # the figures follow the cell's width, not only the window's
                ],
                layout=ipywidgets.Layout(width="100%"),
            ).add_class("fr-timeline")
            self._sync_controls()
        return self._widget

    def set_theme(self, theme: Theme) -> None:
        """Draw both figures with ``theme``'s Plotly template ("light" or "dark")."""
        keys = figure_theme(theme)  # checks the name
        with self._lock:
            self.theme = theme
            for fig in (self.figure, self.fractions):
                with fig.batch_update():
                    fig.update_layout(**keys)

    def _on_follow(self, follow: bool) -> None:
        if self._syncing:
            return
        if follow:
            self.follow_latest()
        elif self.shown_steps:
            self.select_step(self.shown_steps[-1])

    def _on_step(self, step: int) -> None:
        if not self._syncing:
            self.select_step(step)

    def _sync_controls(self) -> None:
        if self._controls is None:
            return
        follow, slider = self._controls
        with self._lock:  # a user event waits until the controls show the new state
            steps = [] if self._tables is None else table_steps(*self._tables[:2])
            shown = self.shown_steps
            self._syncing = True
            try:
                follow.value = self.following
                if steps:
                    # min/max/value checked together, and sent in one message: the browser
                    # must never see a value outside its range (it would clamp and send back)
                    with slider.hold_sync(), slider.hold_trait_notifications():
                        slider.min, slider.max = steps[0], steps[-1]
                        slider.value = shown[-1] if shown else steps[-1]
                slider.disabled = self.following or not steps
            finally:
                self._syncing = False

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)
