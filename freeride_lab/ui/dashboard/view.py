"""The live view of one session: the :class:`Dashboard` and its pump.

One ``ipywidgets.VBox``, top to bottom: the session's phase line (``Session.progress``, shown
from the first draw on, before any bar), the run's config, a step counter with a progress bar,
the :class:`~freeride_lab.ui.timeline.Timeline`, the
:class:`~freeride_lab.ui.board.SideTaskBoard` (with :func:`~freeride_lab.ui.board.plain_controls`
folded below it), the :class:`~freeride_lab.ui.gpu_monitor.GpuMonitor` and the cost saving so
far. An invisible :class:`~freeride_lab.ui.theme.ThemeProbe` tells the timeline the JupyterLab
theme and brings the dashboard's stylesheet.

One daemon thread per session (the dashboard's pump) feeds all of it: at most every
``interval_s`` (≥ 0.1 s, so ≤ 10 redraws a second) it reads the session's tables once, draws the
newest ``history_steps`` steps (bounded memory; the whole run stays in the run directory) and
assigns traits — never ``with out:`` from the thread. The step counter, the phase line and the
task cards follow every tick; the parts that read whole tables redraw less often as the run
grows (``busy_frac``), so a large run cannot starve the kernel.

[Note: the timeline after the cell]
The timeline's Plotly figure widgets import plotly, pandas, nbformat and jsonschema: seconds in
a cold kernel, more than the whole launch. So displaying the dashboard imports none of them: its
timeline slot shows a placeholder, and the pump builds the :class:`Timeline` once the cell that
displayed it has returned (IPython's ``post_run_cell``; ``CELL_WAIT_S`` after ``start`` where no
cell ends, at once outside IPython). The other parts that read whole tables (stages, cost
saving, GPU roles) wait with it. The phase line, the step counter and the task cards follow
from the first tick on; the bars come with the first steps.
"""

from __future__ import annotations

import contextlib
import html
import logging
import math
import threading
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from freeride_lab.io.background import BackgroundThread
from freeride_lab.tasks import registry
from freeride_lab.ui.board import SideTaskBoard, plain_controls
from freeride_lab.ui.dashboard.controller import DashboardSession, SessionController
from freeride_lab.ui.dashboard.palette import (
    TASKS_DIR,
    UserTask,
    builtin_palette,
    dir_token,
    user_tasks,
)
from freeride_lab.ui.dashboard.panels import (
    BAR_STYLES,
    board_stage,
    config_html,
    costs_html,
    explain,
    progress_html,
    session_progress,
    session_tasks,
)
from freeride_lab.ui.gpu_monitor import GpuMonitor, ProcessRole
from freeride_lab.ui.theme import ThemeProbe
from freeride_lab.ui.timeline.pump import MIN_INTERVAL_S

if TYPE_CHECKING:
    import ipywidgets

    from freeride_lab.ui.timeline.widget import Timeline

log = logging.getLogger(__name__)

__all__ = ["CELL_WAIT_S", "Dashboard"]

#: Seconds after ``Dashboard.start`` from which the timeline is built even if no IPython cell
#: has ended (a dashboard displayed outside a cell): [Note: the timeline after the cell].
CELL_WAIT_S = 2.0


class Dashboard:
    """The live view of one session; see the module docstring. Make it with ``dashboard_for``.

    Args:
        interval_s: seconds between two ticks of the pump (≥ 0.1: at most 10 redraws a second).
        history_steps: newest steps kept for the timeline's step selector and the fractions.
        busy_frac: the share of a core the pump may use however large the run grows: it waits
            at least ``tick time / busy_frac`` between ticks, and redraws the parts that read
            whole tables (timeline, stages, costs) only that often too (see :meth:`tick`).
        slow_s: seconds between two reads of what changes slowly and costs more to read: the
            stages' free memory and bubbles, the cost saving, the GPU monitor's process roles.
        tasks_dir: where ``%%freeride_task`` registers user tasks (default ``./.freeride_tasks``).
    """

    def __init__(
        self,
        session: DashboardSession,
        *,
        interval_s: float = 0.25,
        history_steps: int = 30,
        window_steps: int = 3,
        busy_frac: float = 0.25,
        slow_s: float = 1.0,
        tasks_dir: Path | None = None,
        gpu_monitor: GpuMonitor | None = None,
    ) -> None:
        if not interval_s >= MIN_INTERVAL_S:
            raise ValueError(
                f"interval_s={interval_s!r} is below {MIN_INTERVAL_S} s; the dashboard redraws "
                f"at most {1 / MIN_INTERVAL_S:.0f} times a second"
            )
        if history_steps < window_steps:
            raise ValueError(
                f"history_steps={history_steps} < window_steps={window_steps}: the history must "
                "hold the window; raise history_steps"
            )
        if not 0 < busy_frac <= 1:
            raise ValueError(f"busy_frac={busy_frac!r} must lie in (0, 1]")
        self._session = weakref.ref(session)
        self.run_id = str(session.run_id)
        self.interval_s = float(interval_s)
        self.history_steps = history_steps
        self.busy_frac = busy_frac
        self.slow_s = float(slow_s)
        self.tasks_dir = TASKS_DIR if tasks_dir is None else Path(tasks_dir)
        self.ticks = 0
        self.redraws = 0  # ticks that changed something on screen
        self.errors = 0
        self.tick_s = 0.0  # duration of the last tick
        self.heavy_s = 0.0  # duration of the last redraw of the timeline (and slow parts)
        self._tick_avg_s = 0.0
        self._heavy_due = 0.0  # monotonic time from which the heavy parts may redraw again
        self._tick_heavy_s = 0.0  # time the current tick spent in the heavy parts
        self.window_steps = window_steps
        self._timeline: Timeline | None = None  # [Note: the timeline after the cell]
        self._cell_over = threading.Event()
        self._cell_over.set()  # no cell to wait for until start() finds one running
        self._started_at = -math.inf
        self.controller = SessionController(session, resolve=self._resolve)
        self.board = SideTaskBoard(self.controller)
        self.gpu = gpu_monitor if gpu_monitor is not None else GpuMonitor()
        self.theme = ThemeProbe()
        self.theme.observe(self._on_theme, names="theme")
        self._cards: dict[str, dict[str, Any]] = {}  # the tasks last listed, by id
        self._widget: ipywidgets.VBox | None = None
        self._parts: dict[str, Any] = {}
        self._last: dict[str, Any] = {}
        self._user_tasks: dict[str, UserTask] = {}
        self._tasks_token: object = object()
        self._lock = threading.RLock()
        self._thread = BackgroundThread(self._run, name=f"freeride-dashboard-{self.run_id}")
        self._final = False
        self._slow_at = -math.inf  # monotonic time of the last slow read

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return (
            f"<Dashboard run_id={self.run_id!r} pump={state} ticks={self.ticks} "
            f"redraws={self.redraws}>"
        )

    @property
    def session(self) -> DashboardSession | None:
        """The session shown, or None once it has been garbage-collected."""
        return self._session()

    @property
    def running(self) -> bool:
        """True while the pump thread runs."""
        return self._thread.running

    # -- palette -------------------------------------------------------------------------------

    def _resolve(self, name: str) -> str:
        task = self._user_tasks.get(name) or user_tasks(self.tasks_dir).get(name)
        return task.ref if task is not None else name  # Session.attach resolves names

    def _refresh_palette(self) -> None:
        token = (str(self.tasks_dir.absolute()), dir_token(self.tasks_dir), *registry.names())
        if token == self._tasks_token:
            return
        self._tasks_token = token
        self._user_tasks = user_tasks(self.tasks_dir)
        own = {
            t.name: t.palette_entry()
            for t in self._user_tasks.values()
            if t.name not in registry.BUILTIN_TASKS
        }
        listed = [p for p in builtin_palette() if p["name"] not in own]  # own files know units
        self.board.set_palette([*listed, *own.values()])

    # -- the timeline --------------------------------------------------------------------------

    @property
    def timeline(self) -> Timeline:
        """The live timeline, built on first use: by the pump once the displaying cell has
        returned ([Note: the timeline after the cell]), or at once by whoever asks first."""
        if self._timeline is None:
            from freeride_lab.ui.timeline.widget import Timeline

            built = Timeline(window_steps=self.window_steps)  # outside the lock: seconds, cold
            built.set_theme("dark" if self.theme.theme == "dark" else "light")
            with self._lock:
                if self._timeline is None:
                    self._timeline = built
                    slot = self._parts.get("timeline")
                    if slot is not None:
                        slot.children = (built.widget,)
        return self._timeline

    @property
    def timeline_built(self) -> bool:
        """True once the timeline exists (its slot shows it, not the placeholder)."""
        return self._timeline is not None

    def _timeline_due(self) -> bool:
        return self._cell_over.is_set() or time.monotonic() - self._started_at >= CELL_WAIT_S

    def _on_theme(self, change: dict[str, Any]) -> None:
        if self._timeline is not None:  # a timeline built later takes the theme then
            self._timeline.set_theme(change["new"])

    def _wait_for_the_cell(self) -> None:
        """Hold the timeline back until the IPython cell now running returns (if any)."""
        try:
            from IPython import get_ipython
        except ImportError:
            return
        events = getattr(get_ipython(), "events", None)
        if events is None:
            return
        over = self._cell_over

        def returned(result: Any = None) -> None:
            over.set()
            with contextlib.suppress(ValueError):  # already gone
                events.unregister("post_run_cell", returned)

        over.clear()
        self._started_at = time.monotonic()
        events.register("post_run_cell", returned)

    # -- widgets -------------------------------------------------------------------------------

    @property
    def widget(self) -> ipywidgets.VBox:
        """The displayable dashboard (built on first use; the pump fills it)."""
        with self._lock:
            if self._widget is None:
                self._widget = self._build()
        return self._widget

    def _build(self) -> ipywidgets.VBox:
        import ipywidgets as w

        session = self.session
        if session is None:
            raise RuntimeError(f"the session of run {self.run_id} is gone")
        steps = int(session.config.steps)
        phase = w.HTML(progress_html(session_progress(session)))  # at once: before any bar
        header = w.HTML(config_html(session))
        bar = w.IntProgress(
            value=0,
            min=0,
            max=max(steps, 1),
            description="steps",
            tooltip="training steps done",
            layout=w.Layout(flex="1 1 240px", min_width="0", width="auto"),
        )
        counter = w.HTML(f"<span class='fr-dash-counter'>0/{steps}</span>")
        costs = w.HTML(costs_html(session, side_task_ran=False))
        controls = w.Accordion(children=[plain_controls(self.board)])
        controls.set_title(0, "side-task controls without drag and drop")
        controls.selected_index = None
        slot = w.Box(
            [w.HTML("<div class='fr-dash-title'>timeline: drawn with the first steps</div>")]
            if self._timeline is None
            else [self._timeline.widget],
            layout=w.Layout(width="100%"),
        )
        self._parts = {
            "bar": bar,
            "counter": counter,
            "costs": costs,
            "phase": phase,
            "timeline": slot,
        }
        self._refresh_palette()
        return w.VBox(
            [
                phase,
                header,
                w.HBox([bar, counter]).add_class("fr-dash-progress"),
                slot,
                self.board,
                controls,
                self.gpu.widget,
                costs,
                self.theme,
            ],
            layout=w.Layout(width="100%", max_width="100%", overflow="hidden"),
        ).add_class("fr-dash")

    # -- the pump ------------------------------------------------------------------------------

    def start(self) -> Dashboard:
        """Start the pump (no-op if it runs, or if the run is over and was drawn once)."""
        with self._lock:
            if self.running:
                return self
            if self._final:
                return self
            self.widget  # noqa: B018 - build before the thread touches the parts
            if self._timeline is None:
                self._wait_for_the_cell()
            self._thread.start()
            self.gpu.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the pump and the GPU sampling; waits up to ``timeout_s``. Idempotent."""
        self._thread.stop(timeout_s)
        self.gpu.stop()

    def __enter__(self) -> Dashboard:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            started = time.perf_counter()
            try:
                if self._timeline is None and self._timeline_due():
                    self.timeline  # noqa: B018 - built here, outside the tick's lock
                done = self.tick()
            except Exception:  # the live view must survive a bad table
                done = False
                self.errors += 1
                if self.errors == 1 or self.errors % 100 == 0:
                    log.exception("dashboard %s: tick failed (%d so far)", self.run_id, self.errors)
            if done:
                self._final = True
                self.gpu.stop()
                return
            self.tick_s = time.perf_counter() - started
            # the light part paces the loop (the heavy part paces itself, see tick); a moving
            # average, so that one slow tick costs no long pause
            light_s = max(0.0, self.tick_s - self._tick_heavy_s)
            self._tick_avg_s = 0.7 * self._tick_avg_s + 0.3 * light_s
            stop.wait(max(self.interval_s, self._tick_avg_s / self.busy_frac))

    def tick(self) -> bool:
        """Read the session once and update every part that changed; True once the run is over
        (and this tick drew its final state).

        The step counter and the task cards are cheap and follow every tick. The timeline, the
        stages, the cost saving and the GPU roles read whole tables: they are redrawn when
        their last redraw is ``heavy_s * (1 / busy_frac - 1)`` seconds old, so that however long
        they take, they use at most about ``busy_frac`` of a core.
        """
        session = self.session
        if session is None:
            return True
        with self._lock:
            self.ticks += 1
            state = session.state
            done = bool(getattr(state, "done", False))
            changed = self._tick_progress(session, state)
            now = time.monotonic()
            self._tick_heavy_s = 0.0
            # the parts that read whole tables wait for the cell too (they load pandas)
            heavy = self._timeline is not None or self._timeline_due()
            if heavy and (done or now >= self._heavy_due):
                started = time.perf_counter()
                slow = done or now - self._slow_at >= self.slow_s
                changed |= self._tick_timeline(session, slow=slow)
                if slow:
                    self._slow_at = now
                    changed |= self._tick_stages(session)
                    side_ran = bool(self._last.get("timeline", (0, 0))[1])
                    changed |= self._set("costs", costs_html(session, side_task_ran=side_ran))
                    self._tick_roles(session)
                self.heavy_s = self._tick_heavy_s = time.perf_counter() - started
                self._heavy_due = time.monotonic() + self.heavy_s * (1 / self.busy_frac - 1)
            changed |= self._tick_tasks(session, run_over=done)  # after the stages it explains
            if changed:
                self.redraws += 1
        return done and heavy  # the final state is drawn whole

    def _changed(self, name: str, value: Any) -> bool:
        """Whether ``value`` differs from the last one drawn as ``name``; keeps it if so."""
        if self._last.get(name) == value:
            return False
        self._last[name] = value
        return True

    def _set(self, name: str, value: Any) -> bool:
        """Assign ``value`` to part ``name`` if it differs from the last; True if it did."""
        if not self._changed(name, value):
            return False
        part = self._parts.get(name)
        if part is not None:
            part.value = value
        return True

    def _tick_progress(self, session: DashboardSession, state: Any) -> bool:
        steps = int(session.config.steps)
        done = session.steps_done
        label = f"{done}/{steps} · {html.escape(str(state))}"
        changed = self._set("bar", min(done, steps))
        changed |= self._set("counter", label)
        changed |= self._set("phase", progress_html(session_progress(session)))
        bar = self._parts.get("bar")
        style = BAR_STYLES.get(str(state), "")
        if bar is not None and bar.bar_style != style:
            bar.bar_style = style
        return changed

    def _tick_timeline(self, session: DashboardSession, *, slow: bool) -> bool:
        from freeride_lab.ui.dashboard.tables import recent_tables

        actions = session.actions
        side = session.side_task_steps
        key = (len(actions), len(side))
        # the fraction chart moves slowly: recomputed on slow ticks only (None keeps it)
        with_summary = self._last.get("summary") != key and (slow or "summary" not in self._last)
        if self._last.get("timeline") == key and not with_summary:
            return False
        tables = recent_tables(
            session, actions, side, history_steps=self.history_steps, with_summary=with_summary
        )
        self.timeline.update(
            tables.actions, tables.bubbles, tables.side_task_steps, summary=tables.summary
        )
        self._last["timeline"] = key
        if with_summary:
            self._last["summary"] = key
        return True

    def _tick_tasks(self, session: DashboardSession, *, run_over: bool) -> bool:
        """Cards of every task the run has had, each with its state and the reason for it; a
        task the session no longer lists keeps its last card (with its final state)."""
        self._refresh_palette()
        listed = {str(task.get("id")): task for task in session_tasks(session)}
        # while the run lives the session's list is the truth (a detached task may leave it);
        # once it is over, a task it stops listing keeps its last card
        self._cards = {**self._cards, **listed} if run_over else listed
        stages = self._last.get("stages") or []
        tasks = [
            {**task, **explain(task, stages, run_over=run_over)} for task in self._cards.values()
        ]
        changed = self._changed("tasks", tasks)
        if changed:
            self.board.set_tasks(tasks)
        return changed

    def _tick_stages(self, session: DashboardSession) -> bool:
        stage_info = getattr(session, "stage_info", None)
        stages = [board_stage(s) for s in stage_info()] if stage_info is not None else []
        changed = self._changed("stages", stages)
        if changed:
            self.board.set_stages(stages)
        return changed

    def _tick_roles(self, session: DashboardSession) -> None:
        """Tell the GPU monitor which pids are training ranks (only where NVML samples)."""
        if not self.gpu.sampler.available or self._last.get("roles_done"):
            return
        import pandas as pd

        events = getattr(session, "events", None)
        if not isinstance(events, pd.DataFrame) or "pid" not in events:
            return
        started = events[events["kind"] == "rank_started"]
        roles = {
            int(pid): ProcessRole("training", f"rank {int(rank)}")
            for pid, rank in zip(started["pid"], started["rank"], strict=True)
            if pd.notna(pid)
        }
        if roles != self.gpu.roles:
            self.gpu.set_roles(roles)
        self._last["roles_done"] = len(roles) >= int(session.config.stages)
