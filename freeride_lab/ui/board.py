"""The side-task board: drag side tasks onto pipeline stages, tune their limits, save their state,
detach them.

    palette = [{"name": "resnet18", "title": "ResNet-18", "unit": "samples"}]
    board = SideTaskBoard(session_controller, palette=palette)
    board.set_stages([{"stage": 1, "free_bytes": 8 << 30, "bubbles_ms": [12.5, 40.1]}])
    board                      # drag "resnet18" onto stage 1 → controller.attach("resnet18", 1)

State is plain JSON in synced traits, always replaced, never mutated (STYLE.md rule 24):
``palette``, ``stages``, ``tasks`` and ``notice`` go to the browser; the browser writes one
``request`` (``{"op": "attach"|"move"|"detach"|"tune"|"checkpoint", ...}``). Python validates it
through the ``controller``; an accepted change is echoed by replacing ``tasks``, a rejected one
sets ``error`` on that task's card (or ``notice`` when there is no card), and ``request`` is
cleared. An accepted ``checkpoint`` (the task's state saved now; it goes on) puts ``saved``, the
board's clock time of the save, on its card until the card goes.
:func:`plain_controls` drives the same path with ordinary ipywidgets.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

import anywidget
import traitlets

from freeride_lab.ui.assets import asset_path

if TYPE_CHECKING:
    import ipywidgets

log = logging.getLogger(__name__)

__all__ = ["LIMIT_KEYS", "OPS", "SideTaskBoard", "TaskController", "plain_controls"]

OPS = ("attach", "move", "detach", "tune", "checkpoint")
LIMIT_KEYS = {"memory_bytes": int, "sm_pct": float, "priority": int, "budget_ms": float}
_CARD_DEFAULTS: dict[str, Any] = {
    "state": "SUBMITTED",
    "progress": 0.0,
    "unit": "",
    "overruns": 0,
    "memory_bytes": None,
    "sm_pct": None,
    "priority": 1,
    "budget_ms": None,
    "error": "",
}


class TaskController(Protocol):
    """What the board needs from a session. Each method raises ``ValueError`` to reject.

    ``attach`` returns the new task as a dict (at least ``id``, ``name``, ``stage``); the others
    may return the updated task dict, or None to let the board apply the change itself.
    Limits are ``memory_bytes``, ``sm_pct`` (0-100), ``priority`` (0 normal, 1 below normal)
    and ``budget_ms``.
    """

    def attach(self, name: str, stage: int, **limits: Any) -> Mapping[str, Any]: ...
    def move(self, task_id: str, stage: int) -> Mapping[str, Any] | None: ...
    def detach(self, task_id: str) -> Mapping[str, Any] | None: ...
    def tune(self, task_id: str, **limits: Any) -> Mapping[str, Any] | None: ...
    def checkpoint(self, task_id: str) -> Mapping[str, Any] | None: ...


def _json(value: Any) -> Any:
    """A plain-JSON value: numpy scalars to Python, NaN/inf to None, tuples to lists."""
    if hasattr(value, "item") and not isinstance(value, str):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    return value


def _card(task: Mapping[str, Any]) -> dict[str, Any]:
    missing = [k for k in ("id", "name", "stage") if k not in task]
    if missing:
        raise ValueError(f"task {dict(task)!r} lacks {missing}; a task needs id, name and stage")
    card = {**_CARD_DEFAULTS, **_json(dict(task))}
    card["id"], card["name"], card["stage"] = str(card["id"]), str(card["name"]), int(card["stage"])
    card["error"] = str(card["error"] or "")
    if card.get("gating") == "leftovers":  # a word on the card: it is not the stage's main task
        card["badge"] = "leftovers"
        card["badge_title"] = "takes only the bubble time the stage's main task leaves"
    return card


def _stage(entry: Mapping[str, Any]) -> dict[str, Any]:
    stage = int(entry["stage"])
    return {
        "stage": stage,
        "free_bytes": None,
        "bubbles_ms": [],
        "label": f"stage {stage}",
        **_json({k: v for k, v in entry.items() if k != "stage"}),
    }


def _palette_entry(entry: Mapping[str, Any]) -> dict[str, Any]:
    name = str(entry["name"])
    return {
        "name": name,
        "title": str(entry.get("title") or name),
        "unit": str(entry.get("unit") or ""),
    }


def _limits(request: Mapping[str, Any]) -> dict[str, Any]:
    given = request.get("limits") or {}
    if not isinstance(given, Mapping):
        raise ValueError(f"limits={given!r} must be an object of {', '.join(LIMIT_KEYS)}")
    unknown = sorted(set(given) - set(LIMIT_KEYS))
    if unknown:
        raise ValueError(f"unknown limit(s) {unknown}; valid: {', '.join(LIMIT_KEYS)}")
    out: dict[str, Any] = {}
    for key, value in given.items():
        if value is None:
            out[key] = None
            continue
        try:
            out[key] = LIMIT_KEYS[key](value)
        except (TypeError, ValueError):
            raise ValueError(f"{key}={value!r} is not a number") from None
    return out


class SideTaskBoard(anywidget.AnyWidget):
    """Drag-and-drop side-task board (anywidget); see the module docstring for the protocol."""

    _esm = asset_path("board.js")
    _css = asset_path("board.css")

    # [{name, title, unit}]
    palette = traitlets.List(traitlets.Dict()).tag(sync=True)
    # [{stage, free_bytes, bubbles_ms, label}]
    stages = traitlets.List(traitlets.Dict()).tag(sync=True)
    # [{id, name, stage, state, progress, unit, overruns, <limits>, error}], see _CARD_DEFAULTS;
    # the dashboard adds label, caption, why, fix ({label, limits} of a tune) and final; the
    # board adds saved ("saved 14:02:31") after a checkpoint it asked for
    tasks = traitlets.List(traitlets.Dict()).tag(sync=True)
    request = traitlets.Dict().tag(sync=True)  # written by the browser, cleared by Python
    notice = traitlets.Unicode("").tag(sync=True)  # a rejection that has no card to show it on

    def __init__(
        self,
        controller: TaskController | None = None,
        *,
        palette: Iterable[Mapping[str, Any]] = (),
        stages: Iterable[Mapping[str, Any]] = (),
        tasks: Iterable[Mapping[str, Any]] = (),
    ) -> None:
        super().__init__(
            palette=[_palette_entry(p) for p in palette],
            stages=[_stage(s) for s in stages],
            tasks=[_card(t) for t in tasks],
        )
        self.controller = controller
        self.requests_handled = 0
        self._lock = threading.RLock()
        self._saved: dict[str, str] = {}  # task id -> its card's "saved" line

    def __repr__(self) -> str:
        return f"<SideTaskBoard stages={len(self.stages)} tasks={len(self.tasks)}>"

    # -- state from the session (any thread) ---------------------------------------------------

    def set_tasks(self, tasks: Iterable[Mapping[str, Any]]) -> None:
        """Replace the cards with the session's view; a card keeps its error unless given one,
        and its ``saved`` line."""
        with self._lock:
            errors = {t["id"]: t["error"] for t in self.tasks if t.get("error")}
            cards = []
            for task in tasks:
                card = _card(task)
                if "error" not in task and card["id"] in errors:
                    card["error"] = errors[card["id"]]
                cards.append({**card, **self._kept(card["id"])})
            self._saved = {c["id"]: self._saved[c["id"]] for c in cards if c["id"] in self._saved}
            self.tasks = cards

    def set_stages(self, stages: Iterable[Mapping[str, Any]]) -> None:
        """Replace the drop zones: ``{stage, free_bytes, bubbles_ms, label}`` each."""
        self.stages = [_stage(s) for s in stages]

    def set_palette(self, palette: Iterable[Mapping[str, Any]]) -> None:
        """Replace the side tasks offered: ``{name, title, unit}`` each."""
        self.palette = [_palette_entry(p) for p in palette]

    # -- requests (from the browser or plain_controls) -----------------------------------------

    @traitlets.observe("request")
    def _on_request(self, change: dict[str, Any]) -> None:
        request = change["new"]
        if not request:
            return
        try:
            self.submit(request)
        finally:
            self.request = {}

    def submit(self, request: Mapping[str, Any]) -> bool:
        """Carry out one request through the controller; returns True if it was accepted."""
        with self._lock:
            self.requests_handled += 1
            try:
                self._apply(request)
            except ValueError as exc:
                self._reject(request, str(exc))
                return False
            except Exception as exc:  # a controller bug must show on the board, not kill the comm
                log.exception("side-task board: %s request failed", request.get("op"))
                self._reject(request, f"{type(exc).__name__}: {exc}")
                return False
            self.notice = ""
            return True

    def _apply(self, request: Mapping[str, Any]) -> None:
        op = request.get("op")
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}; valid: {', '.join(OPS)}")
        if self.controller is None:
            raise ValueError("this board has no controller: pass SideTaskBoard(controller=...)")
        if op == "attach":
            name, stage = str(request.get("name") or ""), self._stage_of(request)
            if name not in {p["name"] for p in self.palette}:
                known = ", ".join(p["name"] for p in self.palette) or "none"
                raise ValueError(f"unknown side task {name!r}; the palette has: {known}")
            task = self.controller.attach(name, stage, **_limits(request))
            self._replace(_card(task))
            return
        task_id = self._task_id(request)
        if op == "move":
            stage = self._stage_of(request)
            result = self.controller.move(task_id, stage)
            self._replace(self._updated(task_id, result, {"stage": stage}))
        elif op == "detach":
            self.controller.detach(task_id)
            self._saved.pop(task_id, None)
            self.tasks = [t for t in self.tasks if t["id"] != task_id]
        elif op == "checkpoint":
            result = self.controller.checkpoint(task_id)
            self._saved[task_id] = f"saved {datetime.now().strftime('%H:%M:%S')}"
            self._replace(self._updated(task_id, result, {}))
        else:
            limits = _limits(request)
            result = self.controller.tune(task_id, **limits)
            self._replace(self._updated(task_id, result, limits))

    def _task_id(self, request: Mapping[str, Any]) -> str:
        task_id = str(request.get("id") or "")
        if task_id not in {t["id"] for t in self.tasks}:
            known = ", ".join(t["id"] for t in self.tasks) or "none"
            raise ValueError(f"unknown task id {task_id!r}; the board has: {known}")
        return task_id

    def _stage_of(self, request: Mapping[str, Any]) -> int:
        try:
            stage = int(request["stage"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"stage={request.get('stage')!r} must be a stage number") from None
        valid = [s["stage"] for s in self.stages]
        if valid and stage not in valid:
            raise ValueError(f"stage {stage} is not on the board; stages: {valid}")
        return stage

    def _updated(
        self, task_id: str, result: Mapping[str, Any] | None, change: Mapping[str, Any]
    ) -> dict[str, Any]:
        current = next(t for t in self.tasks if t["id"] == task_id)
        # the session's answer over the card, so what only the dashboard adds (label, reason)
        # stays until its next tick
        answer = change if result is None else result
        return _card({**current, **answer, **self._kept(task_id), "error": ""})

    def _kept(self, task_id: str) -> dict[str, str]:
        """What the board itself keeps on a card across the session's answers."""
        saved = self._saved.get(task_id)
        return {} if saved is None else {"saved": saved}

    def _replace(self, card: dict[str, Any]) -> None:
        """Put ``card`` in place of the card with its id (or append it); replaces the list."""
        ids = [t["id"] for t in self.tasks]
        if card["id"] in ids:
            self.tasks = [card if t["id"] == card["id"] else t for t in self.tasks]
        else:
            self.tasks = [*self.tasks, card]

    def _reject(self, request: Mapping[str, Any], message: str) -> None:
        task_id = str(request.get("id") or "")
        log.info("side-task board rejected %s: %s", dict(request), message)
        if task_id and any(t["id"] == task_id for t in self.tasks):
            self.tasks = [{**t, "error": message} if t["id"] == task_id else t for t in self.tasks]
        else:
            subject = " ".join(
                str(x) for x in (request.get("op") or "?", request.get("name") or task_id) if x
            )
            self.notice = f"{subject}: {message}"


# -- plain ipywidgets controls -----------------------------------------------------------------

_GIB = 1024**3


def plain_controls(board: SideTaskBoard) -> ipywidgets.VBox:
    """Dropdowns, sliders and buttons that send the same requests as the drag-and-drop board."""
    from html import escape

    import ipywidgets as w

    name = w.Dropdown(description="side task")
    stage = w.Dropdown(description="stage")
    task = w.Dropdown(description="task")
    target = w.Dropdown(description="to stage")
    memory = w.FloatSlider(description="memory GiB", min=0.0, max=80.0, step=0.25, value=0.0)
    sm = w.IntSlider(description="SM %", min=0, max=100, value=0)
    priority = w.IntSlider(description="priority", min=0, max=1, value=1)
    budget = w.FloatSlider(description="budget ms", min=0.0, max=500.0, step=1.0, value=0.0)
    status = w.HTML()
    buttons = {
        op: w.Button(description=op, layout=w.Layout(width="96px" if len(op) > 7 else "80px"))
        for op in OPS
    }

    def limits() -> dict[str, Any]:
        return {
            "memory_bytes": int(memory.value * _GIB) if memory.value > 0 else None,
            "sm_pct": float(sm.value) if sm.value > 0 else None,
            "priority": priority.value,
            "budget_ms": float(budget.value) if budget.value > 0 else None,
        }

    def send(request: dict[str, Any]) -> None:
        board.submit(request)
        refresh()

    buttons["attach"].on_click(
        lambda _: send(
            {"op": "attach", "name": name.value, "stage": stage.value, "limits": limits()}
        )
    )
    buttons["move"].on_click(
        lambda _: send({"op": "move", "id": task.value, "stage": target.value})
    )
    buttons["detach"].on_click(lambda _: send({"op": "detach", "id": task.value}))
    buttons["tune"].on_click(lambda _: send({"op": "tune", "id": task.value, "limits": limits()}))
    buttons["checkpoint"].on_click(lambda _: send({"op": "checkpoint", "id": task.value}))

    def offer(dropdown: w.Dropdown, options: list[tuple[str, Any]]) -> None:
        """Set options only when they change; keep the choice, else pick the first."""
        if list(dropdown.options) != options:
            previous = dropdown.value
            dropdown.options = options
            values = [value for _, value in options]
            dropdown.value = previous if previous in values else (values[0] if values else None)

    def show_status(*_: Any) -> None:
        card = next((t for t in board.tasks if t["id"] == task.value), None)
        message = (card or {}).get("error") or board.notice
        why = " · ".join(x for x in ((card or {}).get("why"), (card or {}).get("saved")) if x)
        status.value = (
            f"<span style='color:var(--jp-error-color1, #b00)'>{escape(message)}</span>"
            if message
            else f"<span class='fr-dash-muted'>{escape(why)}</span>"
        )

    def refresh(*_: Any) -> None:
        offer(name, [(p["title"], p["name"]) for p in board.palette])
        stage_options = [(s["label"], s["stage"]) for s in board.stages]
        offer(stage, stage_options)
        offer(target, stage_options)
        offer(
            task,
            [
                (
                    f"{t.get('label') or t['name']} ({t['name']} · {t['id']}) @ stage {t['stage']}",
                    t["id"],
                )
                for t in board.tasks
            ],
        )
        show_status()

    board.observe(refresh, names=["palette", "stages", "tasks", "notice"])
    task.observe(show_status, names="value")
    refresh()
    return w.VBox(
        [
            w.HBox([name, stage, buttons["attach"]]),
            w.HBox([task, target, buttons["move"], buttons["checkpoint"], buttons["detach"]]),
            w.HBox([memory, sm]),
            w.HBox([priority, budget, buttons["tune"]]),
            status,
        ]
    )
