"""One dashboard per session, and what a notebook shows for a session.

[Note: one dashboard per session]
Displaying a session twice must not start a second pump, and ``%unload_ext`` must be able to stop
every pump. So this module keeps the one piece of state it cannot hand to a visible owner: a
``WeakKeyDictionary`` from session to its dashboard. The dashboard holds its session only weakly,
so a dropped session frees its tables and its pump ends. (House rule 14's list of exceptions:
``lab``'s WeakSet of live sessions, NVML init, and this.)
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from freeride_lab.ui.dashboard.controller import DashboardSession
from freeride_lab.ui.dashboard.panels import html_summary
from freeride_lab.ui.dashboard.view import Dashboard

__all__ = ["WIDGET_MIME", "dashboard_for", "existing_dashboard", "mimebundle", "stop_all"]

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"

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
