"""The run dashboard: what a ``Session`` shows when a notebook displays it.

    session                               # Session._repr_mimebundle_ → mimebundle(session,
                                          # include, exclude): the live dashboard
    dash = dashboard_for(session)         # the same Dashboard on every display
    dash.stop()                           # the pump stops by itself once the run has ended

Frontends without widgets get an escaped ``text/html`` summary instead.

The package by job: ``view`` (the :class:`Dashboard` and its pump), ``panels`` (its text: header,
phase line, cost saving, why each side task is in its state), ``tables`` (what one redraw
draws), ``palette`` (built-in and ``%%freeride_task`` side tasks), ``controller`` (the board's
requests to the session) and ``registry`` (one dashboard per session; the mime bundle).
"""

from __future__ import annotations

from freeride_lab.ui.dashboard.controller import DashboardSession, SessionController
from freeride_lab.ui.dashboard.palette import TASKS_DIR, UserTask, builtin_palette, user_tasks
from freeride_lab.ui.dashboard.panels import explain, html_summary
from freeride_lab.ui.dashboard.registry import (
    WIDGET_MIME,
    dashboard_for,
    existing_dashboard,
    mimebundle,
    stop_all,
)
from freeride_lab.ui.dashboard.view import Dashboard

__all__ = [
    "TASKS_DIR",
    "WIDGET_MIME",
    "Dashboard",
    "DashboardSession",
    "SessionController",
    "UserTask",
    "builtin_palette",
    "dashboard_for",
    "existing_dashboard",
    "explain",
    "html_summary",
    "mimebundle",
    "stop_all",
    "user_tasks",
]
