"""freeride_lab: measure the bubbles of pipeline-parallel training and run side tasks inside them.

    from freeride_lab import RunConfig, Session
    s = Session.launch(RunConfig(schedule="1F1B", stages=4, microbatches=4, steps=10))
    s.bubbles.head()

In Jupyter: ``%load_ext freeride_lab`` then ``%freeride launch --stages 4``.
Importing this package is cheap: names load on first use.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from freeride_lab.core.lazy_names import lazy_getattr
from freeride_lab.lab.hooks import REPORT_EXTRA, set_report_writer

__version__ = "0.1.0"

_LAZY = {
    "RunConfig": "freeride_lab.core.config",
    "Schedule": "freeride_lab.core.schedule",
    "SCHEDULES": "freeride_lab.core.schedule",
    "theory_bubble_fraction": "freeride_lab.core.theory",
    "SideTaskState": "freeride_lab.core.sidetask_state",
    "IterativeSideTask": "freeride_lab.sidetasks.api",
    "ImperativeSideTask": "freeride_lab.sidetasks.api",
    "GpuLimits": "freeride_lab.sidetasks.limits",
    "Session": "freeride_lab.lab.session",
}

__all__ = [*_LAZY, "__version__", "load_ipython_extension", "unload_ipython_extension"]


__getattr__ = lazy_getattr(__name__, _LAZY, globals())


def _write_report(session: Any, path: str | Path) -> Path:
    """``Session.report``: ``freeride_lab.ui.report``, loaded on the first report (see
    ``freeride_lab.lab.session`` [Note: upward hooks])."""
    try:
        from freeride_lab.ui.report import write_session_report
    except ModuleNotFoundError as e:
        raise ImportError(
            f"Session.report needs the packages of freeride_lab's report ({e.name} is missing); "
            f"install them with pip install '{REPORT_EXTRA}'"
        ) from None
    written: Path = write_session_report(session, path)
    return written


set_report_writer(_write_report)


def _register_notebook_display() -> None:
    """Inside IPython (a notebook kernel), show Sessions as their dashboard even without
    ``%load_ext freeride_lab``: register the display printer by name (``ui.display``; nothing
    heavy is imported until a Session is displayed)."""
    get_ipython = getattr(sys.modules.get("IPython"), "get_ipython", None)
    shell = get_ipython() if get_ipython is not None else None
    if shell is not None:
        from freeride_lab.ui.display import register_display

        register_display(shell)


_register_notebook_display()


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext freeride_lab``: register the ``%freeride`` magics (starts nothing)."""
    from freeride_lab.magics import load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext freeride_lab``: remove the magics and stop their pump thread."""
    from freeride_lab.magics import unload

    unload(ipython)
