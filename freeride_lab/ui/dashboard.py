"""The run dashboard: what a ``Session`` shows when a notebook displays it.

    session                               # Session._repr_mimebundle_ → mimebundle(session,
                                          # include, exclude): the live dashboard
    dash = dashboard_for(session)         # the same Dashboard on every display
    dash.stop()                           # the pump stops by itself once the run has ended

One ``ipywidgets.VBox``, top to bottom: the run's config, a live step counter with a progress
bar, the :class:`~freeride_lab.ui.timeline.Timeline`, the
:class:`~freeride_lab.ui.board.SideTaskBoard` (with :func:`~freeride_lab.ui.board.plain_controls`
folded below it), the :class:`~freeride_lab.ui.gpu_monitor.GpuMonitor` and the cost saving so
far. Frontends without widgets get an escaped ``text/html`` summary instead.

One daemon thread per session (the dashboard's pump) feeds all of it: at most every
``interval_s`` (≥ 0.1 s, so ≤ 10 redraws a second) it reads the session's tables once, draws the
newest ``history_steps`` steps (bounded memory; the whole run stays in the run directory) and
assigns traits — never ``with out:`` from the thread (conventions.md §3.1). The step counter
and task cards follow every tick; the parts that read whole tables redraw less often as the run
grows (``busy_frac``), so a large run cannot starve the kernel.

[Note: one dashboard per session]
Displaying a session twice must not start a second pump, and ``%unload_ext`` must be able to stop
every pump. So this module keeps the one piece of state it cannot hand to a visible owner: a
``WeakKeyDictionary`` from session to its dashboard. The dashboard holds its session only weakly,
so a dropped session frees its tables and its pump ends. (House rule 14's list of exceptions:
``lab``'s WeakSet of live sessions, NVML init, and this.)

[Note: user side tasks]
``%%freeride_task NAME`` (``freeride_lab.magics``) writes a cell to ``<tasks_dir>/NAME.py`` and
describes it in ``<tasks_dir>/NAME.json`` (:class:`UserTask`). The board's palette is the built-in
tasks plus every ``*.json`` there (re-read when the directory changes), and the board's
controller resolves a palette name to the task reference ``"…/NAME.py:Class"``.
"""

from __future__ import annotations

import html
import json
import logging
import math
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pandas as pd

from freeride_lab.core import attribution as core_attribution
from freeride_lab.core import bubbles as core_bubbles
from freeride_lab.core.accounting import FREERIDE_UNITS
from freeride_lab.core.config import cost_text
from freeride_lab.tasks import registry
from freeride_lab.ui.board import SideTaskBoard, plain_controls
from freeride_lab.ui.gpu_monitor import GpuMonitor, ProcessRole
from freeride_lab.ui.timeline import MIN_INTERVAL_S, Timeline

if TYPE_CHECKING:
    import ipywidgets

log = logging.getLogger(__name__)

__all__ = [
    "TASKS_DIR",
    "WIDGET_MIME",
    "Dashboard",
    "SessionController",
    "UserTask",
    "builtin_palette",
    "dashboard_for",
    "existing_dashboard",
    "html_summary",
    "mimebundle",
    "stop_all",
    "user_tasks",
]

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
TASKS_DIR = Path(".freeride_tasks")  # relative to the kernel's working directory
_TITLES = {
    "resnet18": "ResNet-18",
    "resnet50": "ResNet-50",
    "vgg19": "VGG-19",
    "pagerank": "PageRank",
    "sgd_mf": "SGD-MF",
    "image": "Image resize",
}


class DashboardSession(Protocol):
    """The part of ``freeride_lab.lab.session.Session`` the dashboard reads and drives."""

    run_id: str
    config: Any  # RunConfig
    bubble_min_ms: float

    @property
    def state(self) -> Any: ...  # RunState: a str enum with ``.done``
    @property
    def steps_done(self) -> int: ...
    @property
    def actions(self) -> pd.DataFrame: ...
    @property
    def steps(self) -> pd.DataFrame: ...
    @property
    def side_task_steps(self) -> pd.DataFrame: ...
    @property
    def tasks(self) -> list[dict[str, Any]]: ...
    def stage_info(self) -> list[dict[str, Any]]: ...
    def attach(
        self,
        task: str,
        *,
        stage: int | None = None,
        memory: int | str | None = None,
        sm_pct: float | None = None,
        priority: int = 1,
        budget_ms: float | None = None,
        options: dict[str, Any] | None = None,
        policy: str = "KILL",
        gating: str = "bubbles",
    ) -> dict[str, Any]: ...
    def tune(
        self,
        task_id: str,
        *,
        memory: int | str | None = None,
        sm_pct: float | None = None,
        priority: int | None = None,
        budget_ms: float | None = None,
    ) -> dict[str, Any]: ...
    def move(self, task_id: str, stage: int) -> dict[str, Any]: ...
    def detach(self, task_id: str) -> dict[str, Any]: ...


# -- the palette ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class UserTask:
    """A side task written by ``%%freeride_task``: its palette name and where its class lives."""

    name: str  # what users type: ``%freeride attach NAME``
    ref: str  # "/abs/path/NAME.py:Class", for Session.attach
    unit: str = "iterations"
    title: str = ""

    def palette_entry(self) -> dict[str, str]:
        return {"name": self.name, "title": self.title or self.name, "unit": self.unit}

    def save(self, directory: Path) -> Path:
        """Write ``<directory>/<name>.json``; returns its path."""
        path = directory / f"{self.name}.json"
        path.write_text(json.dumps(asdict(self), indent=1), encoding="utf-8")
        return path


def user_tasks(directory: Path | None = None) -> dict[str, UserTask]:
    """The user tasks registered in ``directory`` (default ``./.freeride_tasks``), by name.

    Entries whose ``.py`` file is gone, or whose JSON does not parse, are left out.
    """
    directory = TASKS_DIR if directory is None else directory
    found: dict[str, UserTask] = {}
    if not directory.is_dir():
        return found
    for path in sorted(directory.glob("*.json")):
        try:
            task = UserTask(**json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            log.warning("skipping unreadable user task description %s", path)
            continue
        if Path(task.ref.rpartition(":")[0]).is_file():
            found[task.name] = task
    return found


def builtin_palette() -> list[dict[str, str]]:
    """``{name, title, unit}`` of each task in ``freeride_lab.tasks.registry``: the built-ins,
    then the registered ones (their unit is known once they load, so it is left blank)."""
    return [
        {
            "name": name,
            "title": _TITLES.get(name, name),
            "unit": FREERIDE_UNITS.get(registry.reference_key(name), "")
            if name in registry.BUILTIN_TASKS
            else "",
        }
        for name in registry.names()
    ]


def _dir_token(directory: Path) -> float | None:
    try:
        return directory.stat().st_mtime
    except OSError:
        return None


# -- the board's controller ----------------------------------------------------------------------


class SessionController:
    """Adapts a session's side-task API to the board's ``TaskController`` protocol.

    Board limits ``memory_bytes``/``sm_pct``/``priority``/``budget_ms`` become ``memory``/
    ``sm_pct``/``priority``/``budget_ms``; palette names of user tasks become their file
    references. Any refusal reaches the board as ``ValueError`` (shown on the card).
    """

    def __init__(
        self,
        session: DashboardSession,
        *,
        resolve: Callable[[str], str] | None = None,
    ) -> None:
        self._session = weakref.ref(session)
        self.resolve = resolve or (lambda name: name)

    def __repr__(self) -> str:
        session = self._session()
        return f"<SessionController run_id={getattr(session, 'run_id', None)!r}>"

    @property
    def session(self) -> DashboardSession:
        session = self._session()
        if session is None:
            raise ValueError("the session of this board is gone; display a live session again")
        return session

    def attach(self, name: str, stage: int, **limits: Any) -> Mapping[str, Any]:
        priority = limits.get("priority")
        task: Mapping[str, Any] = _refused(
            self.session.attach,
            self.resolve(name),
            stage=stage,
            memory=limits.get("memory_bytes"),
            sm_pct=limits.get("sm_pct"),
            priority=1 if priority is None else int(priority),
            budget_ms=limits.get("budget_ms"),
        )
        return task

    def move(self, task_id: str, stage: int) -> Mapping[str, Any] | None:
        task: Mapping[str, Any] | None = _refused(self.session.move, task_id, stage)
        return task

    def detach(self, task_id: str) -> Mapping[str, Any] | None:
        task: Mapping[str, Any] | None = _refused(self.session.detach, task_id)
        return task

    def tune(self, task_id: str, **limits: Any) -> Mapping[str, Any] | None:
        given = {
            "memory": limits.get("memory_bytes"),
            "sm_pct": limits.get("sm_pct"),
            "priority": limits.get("priority"),
            "budget_ms": limits.get("budget_ms"),
        }
        changed = {k: v for k, v in given.items() if v is not None}
        task: Mapping[str, Any] | None = _refused(self.session.tune, task_id, **changed)
        return task


def _refused(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``call(...)``, with a session's refusal (any of its documented errors) as ValueError."""
    try:
        return call(*args, **kwargs)
    except (RuntimeError, LookupError, PermissionError) as exc:  # PermissionError: an observer
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        raise ValueError(str(message)) from exc


# -- pieces of the view --------------------------------------------------------------------------


def _config_html(session: DashboardSession) -> str:
    cfg = session.config
    shape = f"{cfg.schedule} · S={cfg.stages} · M={cfg.microbatches} · V={cfg.chunks}"
    work = f"{cfg.workload} on {cfg.device} ({cfg.backend})"
    if cfg.workload == "synthetic":
        work += (
            f", F/I/W {cost_text(cfg.t_forward_ms)}/{cost_text(cfg.t_backward_input_ms)}/"
            f"{cost_text(cfg.t_backward_weight_ms)} ms"
        )
    return (
        "<div class='fr-dash-head' style='font:13px system-ui,sans-serif'>"
        f"<b>run {html.escape(str(session.run_id))}</b> · {html.escape(shape)} · "
        f"{cfg.steps} steps · {html.escape(work)}<br>"
        f"<span style='color:#666'>{html.escape(str(cfg.run_dir or ''))}</span></div>"
    )


_BAR_STYLES = {"finished": "success", "failed": "danger", "stopped": "warning"}


def _fmt_pct(frac: float) -> str:
    return "—" if frac is None or not math.isfinite(frac) else f"{100 * frac:.1f}%"


def _costs_html(session: DashboardSession) -> str:
    """The cost saving so far (``session.cost_saving()``), or why there is none yet."""
    head = "<div class='fr-dash-costs' style='font:13px system-ui,sans-serif'><b>cost saving</b> "
    cost_saving = getattr(session, "cost_saving", None)
    if cost_saving is None:
        return head + "— (this session has no side-task accounting)</div>"
    try:
        c = cost_saving()
    except (ValueError, KeyError, ZeroDivisionError, RuntimeError) as exc:
        reason = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        return head + f"— <span style='color:#666'>{html.escape(str(reason))}</span></div>"
    return (
        head + f"{_fmt_pct(c.saving_published_frac)} as published, "
        f"{_fmt_pct(c.saving_corrected_frac)} overhead-corrected · training overhead "
        f"{_fmt_pct(c.overhead_frac)} · side-task work worth {c.reference_gpus:.3g} reference "
        "GPUs</div>"
    )


def html_summary(session: DashboardSession) -> str:
    """A static, escaped HTML summary for frontends without widgets (and nbconvert exports)."""
    cfg = session.config
    state = str(session.state)
    rows = "".join(
        f"<tr><td>{html.escape(str(t.get('id')))}</td><td>{html.escape(str(t.get('name')))}</td>"
        f"<td>{html.escape(str(t.get('stage')))}</td><td>{html.escape(str(t.get('state')))}</td>"
        f"<td>{html.escape(str(t.get('progress')))} {html.escape(str(t.get('unit') or ''))}</td>"
        "</tr>"
        for t in _tasks(session)
    )
    tasks = (
        "<table><tr><th>task</th><th>name</th><th>stage</th><th>state</th><th>progress</th></tr>"
        f"{rows}</table>"
        if rows
        else "<p>no side tasks</p>"
    )
    return (
        f"<div class='fr-dash'>{_config_html(session)}"
        f"<p>step {session.steps_done}/{cfg.steps} · {html.escape(state)}</p>{tasks}</div>"
    )


def _tasks(session: DashboardSession) -> list[dict[str, Any]]:
    tasks = getattr(session, "tasks", None)
    if tasks is None:
        return []
    tasks = tasks() if callable(tasks) else tasks
    return [dict(t) for t in tasks]


BOARD_BUBBLES = 6  # longest bubbles a stage's drop zone lists


def _board_stage(info: Mapping[str, Any]) -> dict[str, Any]:
    """A stage for the board: its longest bubbles first, to 0.1 ms (steadier, so the board
    redraws less often under a pointer)."""
    stage = dict(info)
    bubbles = [float(b) for b in stage.get("bubbles_ms") or [] if b is not None and b == b]
    stage["bubbles_ms"] = [round(b, 1) for b in sorted(bubbles, reverse=True)[:BOARD_BUBBLES]]
    return stage


# -- the dashboard -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Tables:
    actions: pd.DataFrame
    bubbles: pd.DataFrame
    side_task_steps: pd.DataFrame
    summary: pd.DataFrame | None


class Dashboard:
    """The live view of one session; see the module docstring. Make it with :func:`dashboard_for`.

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
        self.timeline = Timeline(window_steps=window_steps)
        self.controller = SessionController(session, resolve=self._resolve)
        self.board = SideTaskBoard(self.controller)
        self.gpu = gpu_monitor if gpu_monitor is not None else GpuMonitor()
        self._widget: ipywidgets.VBox | None = None
        self._parts: dict[str, Any] = {}
        self._last: dict[str, Any] = {}
        self._user_tasks: dict[str, UserTask] = {}
        self._tasks_token: object = object()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
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
        return self._thread is not None and self._thread.is_alive()

    # -- palette -------------------------------------------------------------------------------

    def _resolve(self, name: str) -> str:
        task = self._user_tasks.get(name) or user_tasks(self.tasks_dir).get(name)
        return task.ref if task is not None else name  # Session.attach resolves names

    def _refresh_palette(self) -> None:
        token = (str(self.tasks_dir.absolute()), _dir_token(self.tasks_dir), *registry.names())
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
        header = w.HTML(_config_html(session))
        bar = w.IntProgress(value=0, min=0, max=max(steps, 1), description="steps")
        counter = w.HTML(f"0/{steps}")
        costs = w.HTML(_costs_html(session))
        controls = w.Accordion(children=[plain_controls(self.board)])
        controls.set_title(0, "side-task controls without drag and drop")
        controls.selected_index = None
        self._parts = {"bar": bar, "counter": counter, "costs": costs}
        self._refresh_palette()
        return w.VBox(
            [
                header,
                w.HBox([bar, counter]),
                self.timeline.widget,
                self.board,
                controls,
                self.gpu.widget,
                costs,
            ],
            layout=w.Layout(width="100%"),
        )

    # -- the pump ------------------------------------------------------------------------------

    def start(self) -> Dashboard:
        """Start the pump (no-op if it runs, or if the run is over and was drawn once)."""
        with self._lock:
            if self.running:
                return self
            if self._final:
                return self
            self.widget  # noqa: B018 - build before the thread touches the parts
            self._stop = threading.Event()
            self._thread = threading.Thread(
                target=self._run,
                args=(self._stop,),
                name=f"freeride-dashboard-{self.run_id}",
                daemon=True,
            )
            self._thread.start()
            self.gpu.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the pump and the GPU sampling; waits up to ``timeout_s``. Idempotent."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
        self.gpu.stop()

    def __enter__(self) -> Dashboard:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            started = time.perf_counter()
            try:
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
            changed |= self._tick_tasks(session)
            now = time.monotonic()
            self._tick_heavy_s = 0.0
            if done or now >= self._heavy_due:
                started = time.perf_counter()
                slow = done or now - self._slow_at >= self.slow_s
                changed |= self._tick_timeline(session, slow=slow)
                if slow:
                    self._slow_at = now
                    changed |= self._tick_stages(session)
                    changed |= self._set("costs", _costs_html(session))
                    self._tick_roles(session)
                self.heavy_s = self._tick_heavy_s = time.perf_counter() - started
                self._heavy_due = time.monotonic() + self.heavy_s * (1 / self.busy_frac - 1)
            if changed:
                self.redraws += 1
        return done

    def _set(self, name: str, value: Any) -> bool:
        """Assign ``value`` to part ``name`` if it differs from the last; True if it did."""
        if self._last.get(name) == value:
            return False
        self._last[name] = value
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
        bar = self._parts.get("bar")
        style = _BAR_STYLES.get(str(state), "")
        if bar is not None and bar.bar_style != style:
            bar.bar_style = style
        return changed

    def _tick_timeline(self, session: DashboardSession, *, slow: bool) -> bool:
        actions = session.actions
        side = session.side_task_steps
        key = (len(actions), len(side))
        # the fraction chart moves slowly: recomputed on slow ticks only (None keeps it)
        with_summary = self._last.get("summary") != key and (slow or "summary" not in self._last)
        if self._last.get("timeline") == key and not with_summary:
            return False
        tables = self._recent(session, actions, side, with_summary=with_summary)
        self.timeline.update(
            tables.actions, tables.bubbles, tables.side_task_steps, summary=tables.summary
        )
        self._last["timeline"] = key
        if with_summary:
            self._last["summary"] = key
        return True

    def _recent(
        self,
        session: DashboardSession,
        actions: pd.DataFrame,
        side: pd.DataFrame,
        *,
        with_summary: bool = True,
    ) -> _Tables:
        """The newest ``history_steps`` steps: actions, their bubbles and summary, side steps."""
        cfg = session.config
        steps = sorted(actions["step"].unique())
        kept = steps[-self.history_steps :]
        table = session.steps  # the optimizer spans: the table's boundary bubbles need them
        if kept:
            actions = actions[actions["step"] >= kept[0]]
            side = side[side["step"] >= kept[0]]
            table = table[table["step"] >= kept[0]]
        bubbles = core_bubbles.extract_bubbles(
            actions,
            steps=table,
            schedule=cfg.schedule,
            stages=cfg.stages,
            microbatches=cfg.microbatches,
            chunks=cfg.chunks,
            min_ms=session.bubble_min_ms,
        )
        bubbles = core_attribution.attribute_bubbles(  # why each bubble is there, for hover
            actions,
            bubbles,
            steps=table,
            schedule=cfg.schedule,
            stages=cfg.stages,
            microbatches=cfg.microbatches,
            chunks=cfg.chunks,
        )
        summary = None
        if kept and with_summary:
            # step 0 is warm-up: leave it out once a later step is there
            skip = 1 if len(kept) > 1 and kept[0] == steps[0] else 0
            summary = core_bubbles.summary(
                actions,
                cfg.schedule,
                cfg.stages,
                cfg.microbatches,
                cfg.chunks,
                skip_steps=skip,
                min_ms=session.bubble_min_ms,
            )
        return _Tables(actions, bubbles, side, summary)

    def _tick_tasks(self, session: DashboardSession) -> bool:
        self._refresh_palette()
        tasks = _tasks(session)
        if self._last.get("tasks") == tasks:
            return False
        self._last["tasks"] = tasks
        self.board.set_tasks(tasks)
        return True

    def _tick_stages(self, session: DashboardSession) -> bool:
        stage_info = getattr(session, "stage_info", None)
        stages = [_board_stage(s) for s in stage_info()] if stage_info is not None else []
        if self._last.get("stages") == stages:
            return False
        self._last["stages"] = stages
        self.board.set_stages(stages)
        return True

    def _tick_roles(self, session: DashboardSession) -> None:
        """Tell the GPU monitor which pids are training ranks (only where NVML samples)."""
        if not self.gpu.sampler.available or self._last.get("roles_done"):
            return
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


# -- one dashboard per session (see [Note: one dashboard per session]) ---------------------------

_dashboards: weakref.WeakKeyDictionary[Any, Dashboard] = weakref.WeakKeyDictionary()
_dashboards_lock = threading.Lock()


def dashboard_for(session: DashboardSession, *, tasks_dir: Path | None = None) -> Dashboard:
    """The dashboard of ``session`` (made on first use; its pump is not started here).

    Args:
        tasks_dir: where user tasks are registered; changes an existing dashboard's too.
    """
    with _dashboards_lock:
        dash = _dashboards.get(session)
        if dash is None:
            dash = Dashboard(session, tasks_dir=tasks_dir)
            _dashboards[session] = dash
        elif tasks_dir is not None and Path(tasks_dir) != dash.tasks_dir:
            dash.tasks_dir = Path(tasks_dir)
    return dash


def existing_dashboard(session: DashboardSession) -> Dashboard | None:
    """The dashboard of ``session`` if it has one (none is made)."""
    with _dashboards_lock:
        return _dashboards.get(session)


def stop_all() -> int:
    """Stop every dashboard's pump (``%unload_ext freeride_lab``); returns how many ran."""
    with _dashboards_lock:
        dashes = list(_dashboards.values())
    running = [d for d in dashes if d.running]
    for dash in dashes:
        dash.stop()
    return len(running)


def mimebundle(
    session: DashboardSession,
    include: Sequence[str] | None = None,
    exclude: Sequence[str] | None = None,
) -> dict[str, Any]:
    """``Session._repr_mimebundle_``: ``text/plain``, an escaped ``text/html`` summary and the
    live dashboard widget (whose pump starts here), filtered by ``include``/``exclude``."""

    def wanted(mime: str) -> bool:
        return (include is None or mime in include) and (exclude is None or mime not in exclude)

    data: dict[str, Any] = {}
    if wanted("text/plain"):
        data["text/plain"] = repr(session)
    if wanted("text/html"):
        data["text/html"] = html_summary(session)
    if wanted(WIDGET_MIME):
        dash = dashboard_for(session)
        view = dash.widget._repr_mimebundle_()
        data[WIDGET_MIME] = view[WIDGET_MIME]
        dash.start()
    return data
