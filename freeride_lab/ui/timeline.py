"""Pipeline timeline: one lane per rank, one horizontal-bar trace per category, live or static.

    tl = Timeline(window_steps=3)
    tl.update(session.actions, session.attribution, summary=session.summary())
    tl                                                 # displays figure + bubble fractions
    pump = TimelinePump(lambda: session_tables(session), tl).start()

Bars are ``go.Bar(orientation="h", base=start_ms, x=duration_ms)`` with float64 numpy arrays
(plotly sends those as binary buffers; int64 would go as JSON). Plotly's validator for ``base``
accepts any type and stores it as an object array, so ``base`` travels as a JSON list while
``x`` and ``y`` stay binary. Each category — compute kinds
F/B/I/W, bubbles, each side task by name, overruns — is one trace, so a redraw is one
``batch_update`` that swaps arrays, never thousands of shapes (conventions.md §3.2).
Only a bounded window is drawn: the last ``window_steps`` steps, or one selected step.
A bubble's hover shows why it is there (schedule, peer and host ms) when the bubbles table
carries ``core.attribution``'s parts, as ``Session.attribution`` does.
"""

from __future__ import annotations

import html
import logging
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from freeride_lab.core.attribution import PART_COLUMNS

if TYPE_CHECKING:
    import ipywidgets

log = logging.getLogger(__name__)

__all__ = [
    "BarTrace",
    "Category",
    "Timeline",
    "TimelinePump",
    "TimelineTables",
    "fractions_figure",
    "safe_text",
    "session_tables",
    "timeline_figure",
    "timeline_traces",
]


@dataclass(frozen=True)
class Category:
    """Legend name and style of one trace."""

    name: str  # HTML-escaped
    color: str
    hovertemplate: str
    width: float = 0.8  # bar thickness within a lane (1.0 = touching)
    opacity: float = 1.0


_ACTION_HOVER = (
    "<b>%{customdata[0]}</b> step %{customdata[1]}<br>"
    "%{customdata[2]} ms, from %{customdata[3]} ms<extra>rank %{customdata[4]}</extra>"
)
COMPUTE = {
    "F": Category("forward F", "#4c78a8", _ACTION_HOVER),
    "B": Category("backward B", "#f58518", _ACTION_HOVER),
    "I": Category("backward input I", "#e45756", _ACTION_HOVER),
    "W": Category("backward weight W", "#b279a2", _ACTION_HOVER),
}
BUBBLE = Category(
    "bubble",
    "#bab0ac",
    "<b>bubble %{customdata[0]}</b> (%{customdata[1]}) step %{customdata[2]}<br>"
    "%{customdata[3]} ms measured, %{customdata[4]} predicted<br>"
    "between %{customdata[5]}%{customdata[7]}<extra>rank %{customdata[6]}</extra>",
    opacity=0.55,
)
OVERRUN = Category(
    "overrun",
    "#d62728",
    "<b>overrun</b> %{customdata[0]} step %{customdata[1]}<br>"
    "%{customdata[2]} ms past the bubble end<extra>rank %{customdata[3]}</extra>",
    width=0.36,  # side-task and overrun bars sit inside the bubble bar
)
_SIDE_HOVER = (
    "<b>%{customdata[0]}</b> step %{customdata[1]}<br>%{customdata[2]} ms, "
    "progress %{customdata[3]}<br>overrun %{customdata[4]} ms<extra>rank %{customdata[5]}</extra>"
)
SIDE_TASK_COLORS = ["#54a24b", "#72b7b2", "#eeca3b", "#9d755d", "#ff9da6", "#2ca02c"]


@dataclass(frozen=True)
class BarTrace:
    """Arrays of one timeline trace (one category); times in ms from run start."""

    category: Category
    base: np.ndarray  # float64 start_ms
    x: np.ndarray  # float64 duration_ms
    y: np.ndarray  # float64 rank (lane)
    customdata: np.ndarray  # object rows of pre-formatted hover fields

    @property
    def name(self) -> str:
        return self.category.name


def _f64(values: Any) -> np.ndarray:
    return np.asarray(values, dtype=np.float64)


def _ms(values: Any) -> list[str]:
    return [f"{v:.2f}" if pd.notna(v) else "-" for v in values]


def _rows(*columns: Sequence[Any]) -> np.ndarray:
    """Hover fields as an object array, one row per bar."""
    data = np.empty((len(columns[0]), len(columns)), dtype=object)
    for j, column in enumerate(columns):
        data[:, j] = list(column)
    return data


def safe_text(value: Any) -> str:
    """A user-provided string made safe for plotly's pseudo-HTML (hover, legend); NaN/None → ""."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return html.escape(str(value), quote=False)


def _bar(
    category: Category, frame: pd.DataFrame, base: Any, x: Any, custom: np.ndarray
) -> BarTrace:
    return BarTrace(category, _f64(base), _f64(x), _f64(frame["rank"]), custom)


def _action_trace(kind: str, f: pd.DataFrame) -> BarTrace:
    short = [f"{int(s)}{kind}{int(m)}" for s, m in zip(f["stage"], f["microbatch"], strict=True)]
    ints = f["step"].astype(int), f["rank"].astype(int)
    custom = _rows(short, ints[0], _ms(f["duration_ms"]), _ms(f["start_ms"]), ints[1])
    return _bar(COMPUTE[kind], f, f["start_ms"], f["duration_ms"], custom)


def _column(f: pd.DataFrame, name: str) -> list[Any]:
    return list(f[name]) if name in f else [None] * len(f)


def _bubble_trace(f: pd.DataFrame) -> BarTrace:
    labels = [
        safe_text(label) if isinstance(label, str) and label else safe_text(kind)
        for label, kind in zip(_column(f, "label"), f["kind"], strict=True)
    ]
    predicted_col = next((c for c in ("predicted_duration_ms", "predicted_ms") if c in f), None)
    predicted = _ms(f[predicted_col]) if predicted_col else ["-"] * len(f)
    between = [
        f"{safe_text(a) or 'start'} → {safe_text(b) or 'end'}"
        for a, b in zip(_column(f, "after"), _column(f, "before"), strict=True)
    ]
    kinds = [safe_text(k) for k in f["kind"]]
    custom = _rows(
        labels,
        kinds,
        f["step"].astype(int),
        _ms(f["duration_ms"]),
        predicted,
        between,
        f["rank"].astype(int),
        _split(f),
    )
    return _bar(BUBBLE, f, f["start_ms"], f["duration_ms"], custom)


def _split(f: pd.DataFrame) -> list[str]:
    """Hover line of each bubble's attribution (``core.attribution``); "" where unknown."""
    if not set(PART_COLUMNS) <= set(f.columns):
        return [""] * len(f)
    return [
        f"<br>schedule {s:.2f} · peer {p:.2f} · host {h:.2f} ms"
        if pd.notna(s) and pd.notna(p) and pd.notna(h)
        else ""
        for s, p, h in zip(f["schedule_ms"], f["peer_ms"], f["host_ms"], strict=True)
    ]


def _side_trace(category: Category, f: pd.DataFrame) -> BarTrace:
    progress = [
        f"{p:g} {safe_text(u)}".strip() if pd.notna(p) else "-"
        for p, u in zip(f["progress"], _column(f, "unit"), strict=True)
    ]
    custom = _rows(
        [category.name] * len(f),
        f["step"].astype(int),
        _ms(f["duration_ms"]),
        progress,
        _ms(f["overrun_ms"].fillna(0.0)),
        f["rank"].astype(int),
    )
    return _bar(category, f, f["start_ms"], f["duration_ms"], custom)


def _overrun_trace(f: pd.DataFrame) -> BarTrace:
    over = f[f["overrun_ms"].fillna(0.0) > 0]
    names = [safe_text(n) for n in over["name"]]
    custom = _rows(
        names, over["step"].astype(int), _ms(over["overrun_ms"]), over["rank"].astype(int)
    )
    return _bar(OVERRUN, over, over["end_ms"] - over["overrun_ms"], over["overrun_ms"], custom)


SIDE_TASK_COLUMNS = ["task_id", "name", "stage", "rank", "step", "start_ms", "end_ms"]
SIDE_TASK_COLUMNS += ["duration_ms", "progress", "unit", "overrun_ms"]


def _side_frame(side_task_steps: pd.DataFrame | None) -> pd.DataFrame:
    """The side-task steps, or an empty frame with their columns; overrun_ms defaults to 0."""
    if side_task_steps is None:
        return pd.DataFrame(columns=SIDE_TASK_COLUMNS)
    if "overrun_ms" not in side_task_steps:
        return side_task_steps.assign(overrun_ms=0.0)
    return side_task_steps


def side_task_names(side_task_steps: pd.DataFrame | None) -> list[str]:
    """Side-task names in order of first appearance."""
    return [] if side_task_steps is None else [str(n) for n in pd.unique(side_task_steps["name"])]


def timeline_traces(
    actions: pd.DataFrame,
    bubbles: pd.DataFrame,
    side_task_steps: pd.DataFrame | None = None,
    *,
    side_task_order: Sequence[str] = (),
) -> list[BarTrace]:
    """Traces in drawing order: F, B, I, W, bubble, one per side task, overrun.

    ``side_task_order`` fixes the colours of tasks already shown; new names follow it.
    """
    side = _side_frame(side_task_steps)
    traces = [_action_trace(k, actions[actions["action"] == k]) for k in COMPUTE]
    traces.append(_bubble_trace(bubbles))
    names = list(dict.fromkeys([*side_task_order, *side_task_names(side)]))
    for i, name in enumerate(names):
        color = SIDE_TASK_COLORS[i % len(SIDE_TASK_COLORS)]
        category = Category(safe_text(name), color, _SIDE_HOVER, width=OVERRUN.width, opacity=0.95)
        traces.append(_side_trace(category, side[side["name"] == name]))
    traces.append(_overrun_trace(side))
    return traces


def steps_in_window(steps: Sequence[int], last: int, selected: int | None = None) -> list[int]:
    """The steps to draw: ``[selected]`` if given, else the ``last`` highest steps."""
    if selected is not None:
        return [selected]
    return sorted(set(steps))[-last:] if last > 0 else []


def _in_steps(frame: pd.DataFrame | None, steps: Sequence[int]) -> pd.DataFrame | None:
    return None if frame is None else frame[frame["step"].isin(steps)]


def _layout(ranks: Sequence[int], title: str | None) -> dict[str, Any]:
    ranks = list(ranks)
    return {
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
        "margin": {"l": 70, "r": 20, "t": 40 if title else 20, "b": 40},
        "legend": {"orientation": "h", "y": -0.25},
        "hoverlabel": {"align": "left"},
    }


def _go_bar(trace: BarTrace) -> go.Bar:
    c = trace.category
    return go.Bar(
        orientation="h",
        name=c.name,
        width=c.width,
        opacity=c.opacity,
        marker={"color": c.color},
        hovertemplate=c.hovertemplate,
        base=trace.base,
        x=trace.x,
        y=trace.y,
        customdata=trace.customdata,
    )


def _ranks(actions: pd.DataFrame, bubbles: pd.DataFrame) -> list[int]:
    found = np.concatenate([_f64(actions["rank"]), _f64(bubbles["rank"])])
    return [int(r) for r in np.unique(found[~np.isnan(found)])]


def _steps(actions: pd.DataFrame, bubbles: pd.DataFrame) -> list[int]:
    found = np.concatenate([_f64(actions["step"]), _f64(bubbles["step"])])
    return [int(s) for s in np.unique(found[~np.isnan(found)])]


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
        shown = steps_in_window(_steps(actions, bubbles), last_steps)
        actions, bubbles = (
            actions[actions["step"].isin(shown)],
            bubbles[bubbles["step"].isin(shown)],
        )
        side_task_steps = _in_steps(side_task_steps, shown)
    traces = timeline_traces(actions, bubbles, side_task_steps)
    return go.Figure([_go_bar(t) for t in traces], layout=_layout(_ranks(actions, bubbles), title))


FRACTION_COLUMNS = ["rank", "measured_frac", "theory_frac"]


def fractions_figure(summary: pd.DataFrame | None, *, widget: bool = False) -> go.Figure:
    """Measured vs theory bubble fraction per rank, from ``summary``'s FRACTION_COLUMNS."""
    cls = go.FigureWidget if widget else go.Figure
    bars = [
        go.Bar(
            name=column.removesuffix("_frac"),
            marker={"color": color},
            hovertemplate="rank %{x}: %{y:.1%}<extra>%{fullData.name}</extra>",
        )
        for column, color in (("measured_frac", "#4c78a8"), ("theory_frac", "#bab0ac"))
    ]
    fig = cls(  # traces at construction: see [Note: widget messages before the front end]
        data=bars,
        layout={
            "barmode": "group",
            "height": 260,
            "width": 320,
            "margin": {"l": 50, "r": 10, "t": 40, "b": 40},
            "title": {"text": "bubble fraction"},
            "yaxis": {"range": [0, 1], "tickformat": ".0%"},
            "legend": {"orientation": "h", "y": -0.2},
        },
    )
    _set_fractions(fig, summary)
    return fig


def _set_fractions(fig: go.Figure, summary: pd.DataFrame | None) -> None:
    frame = pd.DataFrame(columns=FRACTION_COLUMNS)
    if isinstance(summary, pd.DataFrame) and set(FRACTION_COLUMNS) <= set(summary.columns):
        frame = summary
    ranks = [f"{int(r)}" for r in frame["rank"]]
    for trace, column in zip(fig.data, ("measured_frac", "theory_frac"), strict=True):
        trace.x = ranks
        trace.y = _f64(frame[column])


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
            pd.DataFrame(columns=_ACTION_COLUMNS), pd.DataFrame(columns=_BUBBLE_COLUMNS)
        )
        # traces at construction: see [Note: widget messages before the front end]
        self.figure = go.FigureWidget(
            data=[_go_bar(trace) for trace in empty], layout=_layout([], title)
        )
        self.fractions = fractions_figure(None, widget=True)
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
            return steps_in_window(_steps(actions, bubbles), self.window_steps, self._selected)

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
                    _set_fractions(self.fractions, summary)
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
                    _set_fractions(fig, None)
                with fig.batch_update():
                    _set_fractions(fig, self._summary)

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
        traces = timeline_traces(actions, bubbles, _in_steps(side, shown), side_task_order=names)
        fixed, tasks, overrun = traces[:5], traces[5:-1], traces[-1]
        for trace in tasks[len(self._side_names) :]:  # a new task: its trace is added once
            self.figure.add_trace(_go_bar(trace))
        self._side_names = names
        ordered = [*fixed, overrun, *tasks]  # the figure's order
        with self.figure.batch_update():
            for data, trace in zip(self.figure.data, ordered, strict=True):
                data.base, data.x, data.y = trace.base, trace.x, trace.y
                data.customdata = trace.customdata
            layout = _layout(_ranks(all_actions, all_bubbles), self._title)
            self.figure.layout.yaxis.tickvals = layout["yaxis"]["tickvals"]
            self.figure.layout.yaxis.ticktext = layout["yaxis"]["ticktext"]
            self.figure.layout.height = layout["height"]
        self.redraws += 1

    # -- display -------------------------------------------------------------------------------

    @property
    def widget(self) -> ipywidgets.Box:
        """The displayable widget: step controls above the timeline and the fraction chart."""
        if self._widget is None:
            import ipywidgets

            follow = ipywidgets.Checkbox(value=True, description="follow latest", indent=False)
            step = ipywidgets.IntSlider(
                value=0, min=0, max=0, description="step", disabled=True, continuous_update=False
            )
            follow.observe(lambda change: self._on_follow(bool(change["new"])), names="value")
            step.observe(lambda change: self._on_step(int(change["new"])), names="value")
            self._controls = (follow, step)
            self._widget = ipywidgets.VBox(
                [
                    ipywidgets.HBox([follow, step]),
                    ipywidgets.HBox([self.figure, self.fractions]),
                ]
            )
            self._sync_controls()
        return self._widget

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
            steps = [] if self._tables is None else _steps(*self._tables[:2])
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


_ACTION_COLUMNS = [
    "step",
    "rank",
    "stage",
    "action",
    "microbatch",
    "start_ms",
    "end_ms",
    "duration_ms",
]
_BUBBLE_COLUMNS = [
    "step",
    "rank",
    "stage",
    "slot",
    "start_ms",
    "end_ms",
    "duration_ms",
    "kind",
    "label",
]


# -- pump ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TimelineTables:
    """What a timeline draws. ``version`` is a source's own change token (None: fingerprinted)."""

    actions: pd.DataFrame
    bubbles: pd.DataFrame
    side_task_steps: pd.DataFrame | None = None
    summary: pd.DataFrame | None = None
    version: Hashable | None = None


class TimelineTarget(Protocol):
    def update(
        self,
        actions: pd.DataFrame,
        bubbles: pd.DataFrame,
        side_task_steps: pd.DataFrame | None = None,
        *,
        summary: pd.DataFrame | None = None,
    ) -> None: ...


class SessionLike(Protocol):
    """The part of ``Session`` a timeline reads."""

    @property
    def actions(self) -> pd.DataFrame: ...
    @property
    def bubbles(self) -> pd.DataFrame: ...
    def summary(self) -> Any: ...


def session_tables(session: SessionLike) -> TimelineTables:
    """The current tables of a session (``side_task_steps`` if it has them)."""
    summary = session.summary()
    attributed = getattr(session, "attribution", None)  # bubbles with their split, if any
    return TimelineTables(
        actions=session.actions,
        bubbles=attributed if isinstance(attributed, pd.DataFrame) else session.bubbles,
        side_task_steps=getattr(session, "side_task_steps", None),
        summary=summary if isinstance(summary, pd.DataFrame) else None,
    )


def _frame_key(frame: pd.DataFrame | None) -> Hashable:
    if frame is None:
        return None
    end = frame["end_ms"].iloc[-1] if len(frame) and "end_ms" in frame else None
    return (len(frame), tuple(frame.columns), None if end is None or pd.isna(end) else float(end))


def fingerprint(tables: TimelineTables) -> Hashable:
    """A cheap change token: the source's ``version``, else sizes and last end times."""
    if tables.version is not None:
        return ("version", tables.version)
    summary = None
    if tables.summary is not None:
        summary = pd.util.hash_pandas_object(tables.summary, index=False).to_numpy().tobytes()
    return (
        _frame_key(tables.actions),
        _frame_key(tables.bubbles),
        _frame_key(tables.side_task_steps),
        summary,
    )


MIN_INTERVAL_S = 0.1  # at most 10 redraws per second


class TimelinePump:
    """Daemon thread that polls ``source`` every ``interval_s`` and redraws ``target`` on new data.

    Whatever changed between two polls is drawn once (coalesced); an unchanged source costs one
    fingerprint. ``start``/``stop`` are idempotent; a failing source is logged and retried.
    """

    def __init__(
        self,
        source: Callable[[], TimelineTables | None],
        target: TimelineTarget,
        *,
        interval_s: float = 0.25,
    ) -> None:
        if not interval_s >= MIN_INTERVAL_S:
            raise ValueError(
                f"interval_s={interval_s!r} is below {MIN_INTERVAL_S} s; the pump redraws at most "
                f"{1 / MIN_INTERVAL_S:.0f} times a second"
            )
        self.source = source
        self.target = target
        self.interval_s = float(interval_s)
        self.redraws = 0
        self.polls = 0
        self.errors = 0
        self._last: Hashable = object()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<TimelinePump {state} interval_s={self.interval_s} redraws={self.redraws}>"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> TimelinePump:
        """Start polling (no-op if already running)."""
        if not self.running:
            self._stop = threading.Event()
            self._thread = threading.Thread(
                target=self._run, args=(self._stop,), name="freeride-timeline-pump", daemon=True
            )
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop polling and wait up to ``timeout_s`` for the thread. Idempotent."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def __enter__(self) -> TimelinePump:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def tick(self) -> bool:
        """Poll once; redraw and return True if the source has new data."""
        self.polls += 1
        tables = self.source()
        if tables is None:
            return False
        key = fingerprint(tables)
        if key == self._last:
            return False
        self.target.update(
            tables.actions, tables.bubbles, tables.side_task_steps, summary=tables.summary
        )
        self._last = key
        self.redraws += 1
        return True

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.tick()
            except Exception:  # the live view must survive a bad table
                self.errors += 1
                if self.errors == 1 or self.errors % 100 == 0:
                    log.exception("timeline pump: redraw failed (%d failures so far)", self.errors)
            stop.wait(self.interval_s)
