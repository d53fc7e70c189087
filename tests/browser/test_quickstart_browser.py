"""The quickstart notebook in a real JupyterLab: it runs, draws the timeline, and a side task
dragged from the board's palette onto stage 1 is attached in the run.

The notebook is run once per module (``quickstart`` fixture) with Run All, which leaves the run
training: its last cell, ``# %freeride stop``, is commented out. The tests drag cards onto the
live run; the module's last test uncomments that cell, as a user does when done, runs it and
checks that the run stopped. Each test checks one claim.
Artifacts: ``test-artifacts/test_quickstart_browser-*.png``, ``test-artifacts/jupyter-server.log``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

QUICKSTART = "notebooks/01-quickstart.ipynb"
REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        not (REPO_ROOT / QUICKSTART).is_file(),
        reason=f"{QUICKSTART} does not exist yet; this test runs it once it does",
    ),
]

RUN_S = 240.0  # kernel start + all cells; the training itself runs in the background
TIMELINE_S = 120.0  # first bars drawn by the live pump
ATTACH_S = 90.0  # browser → kernel (when idle) → session → echoed state

TIMELINE_BARS = ".js-plotly-plot .barlayer .trace.bars path"
PALETTE_CARDS = "[data-testid^='palette-']"
PREFERRED_CARD = "[data-testid='palette-pagerank']"
TARGET_STAGE = 1

# The run's side tasks as JSON [{"id", "name", "stage"}], read in the notebook's kernel from the
# Session the quickstart names ``session``. ``session.tasks`` may be a DataFrame, a list of dicts or
# a list of objects; anything else fails with the repr, so a changed API is easy to adapt to.
RUN_TASKS_SNIPPET = """
import json as _frl_json

def _frl_task(t):
    get = t.get if isinstance(t, dict) else (lambda k, d=None: getattr(t, k, d))
    return {"id": str(get("id", get("task_id", ""))), "name": str(get("name")),
            "stage": int(get("stage"))}

_frl_tasks = session.tasks() if callable(session.tasks) else session.tasks
if hasattr(_frl_tasks, "to_dict"):
    _frl_tasks = _frl_tasks.to_dict("records")
print(_frl_json.dumps([_frl_task(t) for t in _frl_tasks]))
del _frl_json, _frl_task, _frl_tasks
"""


def run_tasks(lab: Any) -> list[dict[str, Any]]:
    """The side tasks the quickstart's ``session`` knows, read through the kernel."""
    result = lab.run_code(RUN_TASKS_SNIPPET)
    if result.error:
        raise AssertionError(f"reading session.tasks failed:\n{result.error}")
    return list(json.loads(result.text.strip().splitlines()[-1]))


STOP_CELL = "# %freeride stop"  # commented out: Run All passes over it

# Make cell ``index`` the active one and run a notebook command; its outcome lands on window
# (see [Note: driving JupyterLab] in conftest.py).
_JS_RUN_COMMAND_AT = """
([index, command]) => {
  const app = window.jupyterapp;
  const panel = app.shell.currentWidget;
  panel.content.activeCellIndex = index;
  const run = (window.__frlCommand = {done: false, error: null});
  app.commands.execute(command).then(
    () => { run.done = true; },
    (e) => { run.done = true; run.error = String(e); });
}
"""

_JS_UNCOMMENT_CELL = """
(index) => {
  const cell = window.jupyterapp.shell.currentWidget.content.widgets[index];
  cell.model.sharedModel.setSource(cell.model.sharedModel.getSource().replace(/^# /, ""));
}
"""

_JS_CELL_SOURCES = """
() => window.jupyterapp.shell.currentWidget.content.widgets.map(
  (cell) => cell.model.sharedModel.getSource())
"""


def run_command_at(lab: Any, index: int, command: str, timeout_s: float) -> None:
    """Run ``command`` with cell ``index`` active; wait for it and an idle kernel; no errors."""
    lab.page.evaluate(_JS_RUN_COMMAND_AT, [index, command])
    lab.wait_until(
        lambda: lab.page.evaluate("() => window.__frlCommand.done"),
        timeout_s=timeout_s,
        what=f"{command} at cell {index} of {QUICKSTART}",
        interval_s=0.25,
    )
    lab.wait_kernel_idle(timeout_s)
    failure = lab.page.evaluate("() => window.__frlCommand.error")
    errors = lab.cell_errors()
    assert not failure and not errors, f"{command} failed: {failure or ''} {errors}"


def stop_cell_index(lab: Any) -> int:
    sources = [str(s).strip() for s in lab.page.evaluate(_JS_CELL_SOURCES)]
    assert sources[-1] == STOP_CELL, f"the quickstart must end with {STOP_CELL!r}: {sources[-1]!r}"
    return len(sources) - 1


@pytest.fixture(scope="module")
def quickstart(lab_module: Any) -> Any:
    """The quickstart, open and Run All (training continues in the background)."""
    lab_module.open(QUICKSTART)
    run_command_at(lab_module, stop_cell_index(lab_module), "notebook:run-all-cells", RUN_S)
    # the dashboard (the launch cell's output) in view: what a failure screenshot should show
    lab_module.page.locator(".jp-OutputArea-output .widget-vbox").first.scroll_into_view_if_needed()
    return lab_module


def test_quickstart_timeline_shows_bars(quickstart: Any) -> None:
    bars = quickstart.wait_for_selector_count(TIMELINE_BARS, timeout_s=TIMELINE_S)
    quickstart.page.locator(TIMELINE_BARS).first.scroll_into_view_if_needed()
    quickstart.screenshot("timeline")
    assert bars >= 1


def test_dragging_a_palette_card_onto_stage_1_attaches_that_task(quickstart: Any) -> None:
    page = quickstart.page
    quickstart.wait_for_selector_count(PALETTE_CARDS, timeout_s=TIMELINE_S)
    quickstart.wait_for_selector_count(f"[data-testid='stage-{TARGET_STAGE}']", timeout_s=30)
    preferred = page.locator(PREFERRED_CARD)
    card = preferred.first if preferred.count() else page.locator(PALETTE_CARDS).first
    name = (card.get_attribute("data-testid") or "").removeprefix("palette-")
    before = {task["id"] for task in run_tasks(quickstart)}

    quickstart.drag(card, page.locator(f"[data-testid='stage-{TARGET_STAGE}']"))

    last: list[dict[str, Any]] = []

    def attached() -> list[dict[str, Any]]:
        last[:] = run_tasks(quickstart)
        return [
            task
            for task in last
            if task["id"] not in before and task["name"] == name and task["stage"] == TARGET_STAGE
        ]

    try:
        new = quickstart.wait_until(
            attached,
            timeout_s=ATTACH_S,
            what=f"session.tasks to gain {name!r} on stage {TARGET_STAGE}",
            interval_s=0.5,
        )
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; session.tasks is {last}") from None
    quickstart.screenshot("after-attach")
    assert len(new) == 1, f"one drag attached {len(new)} tasks: {new}"


def test_run_all_leaves_the_run_training(quickstart: Any) -> None:
    result = quickstart.run_code("print(session.state.done, session.state)")
    assert result.error is None, result.error
    assert result.text.split() == ["False", "running"], result.text


def test_the_stop_cell_uncommented_ends_the_run(quickstart: Any) -> None:
    index = stop_cell_index(quickstart)
    quickstart.page.evaluate(_JS_UNCOMMENT_CELL, index)
    run_command_at(quickstart, index, "notebook:run-cell", RUN_S)
    result = quickstart.run_code("print(session.state.done, session.state)")
    assert result.error is None, result.error
    assert result.text.split()[0] == "True", result.text
    quickstart.screenshot("after-stop")
