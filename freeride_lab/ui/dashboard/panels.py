"""The dashboard's text: the run's header, its phase line, the cost saving, and each side-task
card's state with the reason for it (and a fix where there is one).

Pure functions of what a session reports, so each claim is tested without widgets. Colours come
from JupyterLab's CSS variables (``widgets/dashboard.css``), never from fixed hex values, so the
text reads in the light and the dark theme.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

from freeride_lab.core.config import cost_text
from freeride_lab.core.sidetask_state import SideTaskState
from freeride_lab.ui.dashboard.controller import DashboardSession
from freeride_lab.ui.names import task_caption, task_label

__all__ = [
    "BAR_STYLES",
    "BOARD_BUBBLES",
    "board_stage",
    "config_html",
    "costs_html",
    "explain",
    "html_summary",
    "progress_html",
    "session_progress",
    "session_tasks",
]

BAR_STYLES = {"finished": "success", "failed": "danger", "stopped": "warning"}
BOARD_BUBBLES = 6  # longest bubbles a stage's drop zone lists


def config_html(session: DashboardSession) -> str:
    """The run's id, shape, workload and run directory."""
    cfg = session.config
    shape = f"{cfg.schedule} · S={cfg.stages} · M={cfg.microbatches} · V={cfg.chunks}"
    work = f"{cfg.workload} on {cfg.device} ({cfg.backend})"
    if cfg.workload == "synthetic":
        work += (
            f", F/I/W {cost_text(cfg.t_forward_ms)}/{cost_text(cfg.t_backward_input_ms)}/"
            f"{cost_text(cfg.t_backward_weight_ms)} ms"
        )
    return (
        "<div class='fr-dash-head'>"
        f"<b class='fr-dash-title'>run {html.escape(str(session.run_id))}</b> · "
        f"{html.escape(shape)} · {cfg.steps} steps · {html.escape(work)}<br>"
        f"<span class='fr-dash-muted'>{html.escape(str(cfg.run_dir or ''))}</span></div>"
    )


def session_progress(session: object) -> str:
    """The session's phase line (``Session.progress``, e.g. "starting 4 ranks…"), "" if none."""
    progress = getattr(session, "progress", None)
    if callable(progress):
        progress = progress()
    return "" if progress is None else str(progress)


def progress_html(line: str) -> str:
    """The phase line as shown at the top of the dashboard ("" hides it)."""
    if not line:
        return ""
    return f"<div class='fr-dash-phase' role='status' aria-live='polite'>{html.escape(line)}</div>"


def _fmt_pct(frac: float | None) -> str:
    return "—" if frac is None or not math.isfinite(frac) else f"{100 * frac:.1f}%"


def costs_html(session: DashboardSession, *, side_task_ran: bool | None = None) -> str:
    """The cost saving so far (``session.cost_saving()``), or why there is none.

    Args:
        side_task_ran: whether any side task has done a step; False shows that training ran
            alone (no overhead to show), None reads ``session.side_task_steps`` to know.
    """
    head = "<div class='fr-dash-costs'><b>cost saving</b> "
    if side_task_ran is None:
        side = getattr(session, "side_task_steps", None)
        side_task_ran = side is None or len(side) > 0
    if not side_task_ran:
        return (
            head + "— <span class='fr-dash-muted'>no side task has run, so training ran alone: "
            "there is no overhead or saving to show</span></div>"
        )
    cost_saving = getattr(session, "cost_saving", None)
    if cost_saving is None:
        return head + "— (this session has no side-task accounting)</div>"
    try:
        c = cost_saving()
    except (ValueError, KeyError, ZeroDivisionError, RuntimeError) as exc:
        reason = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        return head + f"— <span class='fr-dash-muted'>{html.escape(str(reason))}</span></div>"
    return (
        head + f"{_fmt_pct(c.saving_published_frac)} as published, "
        f"{_fmt_pct(c.saving_corrected_frac)} overhead-corrected · training overhead "
        f"{_fmt_pct(c.overhead_frac)} · side-task work worth {c.reference_gpus:.3g} reference "
        "GPUs</div>"
    )


def session_tasks(session: DashboardSession) -> list[dict[str, Any]]:
    """The session's side tasks as plain dicts ([] for a session without side tasks)."""
    tasks = getattr(session, "tasks", None)
    if tasks is None:
        return []
    tasks = tasks() if callable(tasks) else tasks
    return [dict(t) for t in tasks]


def html_summary(session: DashboardSession) -> str:
    """A static, escaped HTML summary for frontends without widgets (and nbconvert exports)."""
    cfg = session.config
    state = str(session.state)
    rows = "".join(
        f"<tr><td>{html.escape(str(t.get('id')))}</td>"
        f"<td>{html.escape(task_caption(str(t.get('name'))))}</td>"
        f"<td>{html.escape(str(t.get('stage')))}</td><td>{html.escape(str(t.get('state')))}</td>"
        f"<td>{html.escape(str(t.get('progress')))} {html.escape(str(t.get('unit') or ''))}</td>"
        f"<td>{html.escape(explain(t, [], run_over=False)['why'])}</td></tr>"
        for t in session_tasks(session)
    )
    tasks = (
        "<table><tr><th>task</th><th>name</th><th>stage</th><th>state</th><th>progress</th>"
        f"<th>why</th></tr>{rows}</table>"
        if rows
        else "<p>no side tasks</p>"
    )
    phase = progress_html(session_progress(session))
    return (
        f"<div class='fr-dash'>{config_html(session)}{phase}"
        f"<p>step {session.steps_done}/{cfg.steps} · {html.escape(state)}</p>{tasks}</div>"
    )


def board_stage(info: Mapping[str, Any]) -> dict[str, Any]:
    """A stage for the board: its longest bubbles first, to 0.1 ms (steadier, so the board
    redraws less often under a pointer)."""
    stage = dict(info)
    bubbles = [float(b) for b in stage.get("bubbles_ms") or [] if b is not None and b == b]
    stage["bubbles_ms"] = [round(b, 1) for b in sorted(bubbles, reverse=True)[:BOARD_BUBBLES]]
    return stage


_WAITING = {
    SideTaskState.SUBMITTED: "starting: its process is being set up",
    SideTaskState.CREATED: "set up; moving onto the GPU",
    SideTaskState.PAUSED: "waiting for the next bubble of its stage",
    SideTaskState.RUNNING: "running inside the bubbles of its stage",
    SideTaskState.FINISHED: "finished its work",
    SideTaskState.STOPPED: "stopped",
    SideTaskState.FAILED: "failed (no reason given)",
}
_TERMINAL = {SideTaskState.FINISHED, SideTaskState.STOPPED, SideTaskState.FAILED}


def explain(
    task: Mapping[str, Any], stages: Sequence[Mapping[str, Any]], *, run_over: bool
) -> dict[str, Any]:
    """What a card says about ``task`` beyond its numbers: ``label`` (``SGD-MF``), ``caption``
    (label, code name, id), ``why`` (its state, and the reason), ``fix`` (a tune request's
    ``{label, limits}`` that would let it run, or None) and ``final`` (the run is over).

    A step budget longer than the longest bubble of the task's stage means the task is never
    given a bubble: ``why`` says so, and ``fix`` offers the longest bubble as the budget.
    """
    name, task_id = str(task.get("name", "")), str(task.get("id", ""))
    try:
        state: SideTaskState | None = SideTaskState(str(task.get("state", "")))
    except ValueError:
        state = None
    reason = str(task.get("error") or task.get("reason") or "").strip()
    why = reason or (_WAITING.get(state, "") if state is not None else "")
    if state == SideTaskState.STOPPED and reason:
        why = f"stopped: {reason}"
    elif state == SideTaskState.FAILED:
        why = f"failed: {reason}" if reason else _WAITING[state]
    fix = None
    budget = task.get("budget_ms")
    bubbles = next(
        (s.get("bubbles_ms") or [] for s in stages if s.get("stage") == task.get("stage")), []
    )
    longest = max((float(b) for b in bubbles if b is not None), default=None)
    if (
        state not in _TERMINAL
        and isinstance(budget, int | float)
        and longest is not None
        and budget > longest
    ):
        fitting = max(math.floor(longest * 0.9), 1)
        why = (
            f"never runs: its step budget {budget:g} ms is longer than the longest bubble of "
            f"stage {task.get('stage')} ({longest:.1f} ms)"
        )
        fix = {"label": f"set budget to {fitting} ms", "limits": {"budget_ms": float(fitting)}}
    final = run_over
    if run_over and state not in _TERMINAL:
        why = f"the run ended while it was {str(task.get('state', '')).lower()}" + (
            f" ({reason})" if reason else ""
        )
        fix = None
    return {
        "label": task_label(name),
        "caption": task_caption(name, task_id),
        "why": why,
        "fix": fix,
        "final": final,
    }
