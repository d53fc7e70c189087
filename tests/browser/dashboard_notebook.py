"""The notebook the dashboard's browser tests draw: a ``FakeSession`` (tests/ui/fake_session.py)
with side tasks attached, and its ``Dashboard`` ticked by hand (no pump, so nothing moves under
the test); and drawing it in a JupyterLab page.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

UI_TESTS = Path(__file__).resolve().parents[1] / "ui"
DRAW_S = 240.0  # the plotly bundle is several MB: slow on a loaded two-core box


def dashboard_cell(tasks: Iterable[tuple[str, int]], *, setup: str = "", options: str = "") -> str:
    """Source of a cell that shows the dashboard of a 3-stage ``FakeSession`` at step 6 of 20
    with ``tasks`` (name, stage) attached. ``setup`` runs after the attaches (it may change the
    tasks and define names); ``options`` are more ``Dashboard`` keyword arguments (``", k=v"``).
    """
    return (
        f"import sys\nsys.path.insert(0, {str(UI_TESTS)!r})\n"
        "from fake_session import FakeSession\n"
        "from freeride_lab.ui.dashboard import Dashboard\n\n"
        "session = FakeSession(stages=3, microbatches=4, steps=20)\n"
        "session.progress = 'step 6 of 20'\n"
        "session.advance(5)\n"
        f"for name, stage in {tuple(tasks)!r}:\n"
        "    session.attach(name, stage=stage)\n"
        "session.advance(1)\n"
        f"{setup}"
        f"dash = Dashboard(session, tasks_dir='.freeride_tasks', busy_frac=1.0{options})\n"
        "view = dash.widget  # built first, as on display; the pump would tick it\n"
        "dash.tick()\n"
        "dash.tick()\n"
        "view"
    )


def draw(lab: Any, path: str, *, width: int, height: int, selectors: Iterable[str]) -> None:
    """Open the notebook at ``path`` in a page of ``width`` x ``height`` px, run it with the code
    hidden (figures and widgets draw once they are shown) and wait until every selector matches;
    a screenshot ``not-drawn`` is saved when one never does."""
    lab.page.set_viewport_size({"width": width, "height": height})
    lab.open(path)
    lab.run_all()
    lab.page.evaluate("window.jupyterapp.commands.execute('notebook:hide-all-cell-code')")
    assert lab.cell_errors() == []
    try:
        for selector in selectors:
            lab.wait_for_selector_count(selector, timeout_s=DRAW_S)
    except TimeoutError:
        lab.screenshot("not-drawn")
        raise
