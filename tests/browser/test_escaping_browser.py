"""User strings holding HTML render inert in the real browser: a side task whose unit
is ``<img src=x onerror=alert(1)>`` and a config whose ``notes`` hold ``<script>alert(1)</script>``
show as text in the dashboard (JupyterLab, system Chromium) and in the report ``session.report``
writes (opened from disk): no dialog opens, no element of theirs exists, the text is visible.

One notebook serves the module (``escaping`` fixture): it launches a 2-stage sleep-timed CPU run
with that config, displays the session (the dashboard), registers a user task whose palette
title and unit hold HTML, attaches the side task to stage 0 and writes the report once the task
made progress. Every page records the dialogs it opens; a probe ``alert`` at the end of each
test proves the recorder sees them. Artifacts: ``test-artifacts/test_escaping_browser-*.png``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

UNIT = "<img src=x onerror=alert(1)>"
NOTE = "<script>alert(1)</script>"
TITLE = "<img src=x onerror=alert(2)>"  # the user task's palette title
NOTEBOOK = "escaping.ipynb"
REPORT = "escaping-report.html"
ARTIFACTS_DIR = Path(__file__).resolve().parents[2] / "test-artifacts"  # as conftest.py
RUN_S = 420.0  # kernel start, the run's first step, the task's first steps and the report
DRAW_S = 90.0

TASK_FILE = f'''
import time

from freeride_lab.sidetasks.api import IterativeSideTask


class HtmlUnit(IterativeSideTask):
    """Counts; its unit is an HTML tag that must stay text everywhere."""

    unit = {UNIT!r}

    def step(self) -> float:
        time.sleep(0.003)
        return 1.0
'''

CELLS = [
    # the run, displayed: the dashboard
    "from pathlib import Path\n"
    "from freeride_lab.core.config import RunConfig\n"
    "from freeride_lab.lab.session import Session\n"
    "from freeride_lab.ui.dashboard import UserTask\n\n"
    "TASK = str(Path('escaping_tasks.py').absolute()) + ':HtmlUnit'\n"
    "Path('.freeride_tasks').mkdir(exist_ok=True)\n"
    f"UserTask(name='htmltask', ref=TASK, unit={UNIT!r}, title={TITLE!r}).save("
    "Path('.freeride_tasks'))\n"
    "config = RunConfig(schedule='1F1B', stages=2, microbatches=4, steps=100_000,\n"
    "                   workload='synthetic', t_forward_ms=10.0, t_backward_input_ms=10.0,\n"
    "                   t_backward_weight_ms=10.0, d_model=16, seq_len=8, microbatch_size=2,\n"
    f"                   runtime={{'stop_grace_s': 5}}, notes={{'note': {NOTE!r}}})\n"
    "session = Session.launch(config, run_dir='runs/escaping', grace_s=3)\n"
    "session",
    # the side task, once the run trains
    "import time\n\n"
    "def wait_for(condition, timeout_s=240):\n"
    "    deadline = time.monotonic() + timeout_s\n"
    "    while not condition():\n"
    "        assert time.monotonic() < deadline, f'timed out; run {session.state}'\n"
    "        time.sleep(0.25)\n\n"
    "wait_for(lambda: session.steps_done >= 1)\n"
    "task = session.attach(TASK, stage=0, policy='WARN')\n"
    "task['id']",
    # the report, once the task made progress
    "wait_for(lambda: any(t['progress'] > 0 for t in session.tasks))\n"
    f"print(session.report({REPORT!r}).absolute())",
]


class Dialogs:
    """The dialogs (alert, confirm, prompt) a page opened; each is dismissed."""

    def __init__(self, page: Any) -> None:
        self.seen: list[tuple[str, str]] = []
        page.on("dialog", self._on_dialog)

    def _on_dialog(self, dialog: Any) -> None:
        self.seen.append((dialog.type, dialog.message))
        dialog.dismiss()

    @property
    def opened(self) -> list[tuple[str, str]]:
        return [d for d in self.seen if d[0] != "beforeunload"]


# The DOM after an injection: elements the HTML would have made. A script is injected when its
# whole text is the payload (plotly's own scripts only mention it inside escaped JSON strings).
_JS_INJECTED = """
() => ({
  imgs: document.querySelectorAll('img[src="x"]').length,
  handlers: document.querySelectorAll('[onerror]').length,
  scripts: Array.from(document.scripts).filter((s) => s.textContent.trim() === 'alert(1)').length,
})
"""
NOTHING_INJECTED = {"imgs": 0, "handlers": 0, "scripts": 0}


def assert_the_recorder_sees_an_alert(page: Any, dialogs: Dialogs) -> None:
    """A probe: an alert does reach ``dialogs`` (so an empty record means none fired)."""
    before = len(dialogs.opened)
    page.evaluate("() => alert('probe')")
    assert dialogs.opened[before:] == [("alert", "probe")]


@dataclass
class Notebook:
    lab: Any  # conftest.JupyterLab, on the notebook
    dialogs: Dialogs  # of its page, recorded from before the notebook opened


@pytest.fixture(scope="module")
def escaping(lab_module: Any, notebook_factory: Callable[[list[str]], str]) -> Iterator[Notebook]:
    """The notebook run once: a live dashboard in view and the report written."""
    lab = lab_module
    (lab.server.root_dir / "escaping_tasks.py").write_text(TASK_FILE, encoding="utf-8")
    dialogs = Dialogs(lab.page)
    lab.open(lab.server.add_notebook(NOTEBOOK, notebook_factory(CELLS)))
    try:
        lab.run_all(timeout_s=RUN_S)
        yield Notebook(lab, dialogs)
    finally:
        lab.run_code("session.stop()", timeout_s=60)


# The board as drawn now, in one read (it redraws by replacing its children, so element handles
# do not last): each card's text, and the user task's palette chip.
_JS_BOARD = """
() => {
  const board = document.querySelector("[data-testid='board']");
  if (board) board.scrollIntoView();
  const chip = document.querySelector("[data-testid='palette-htmltask']");
  return {
    cards: Array.from(document.querySelectorAll('.fr-card')).map((c) => c.innerText),
    chip: chip ? {text: chip.innerText, title: chip.getAttribute('title')} : null,
  };
}
"""


def test_the_dashboard_shows_html_of_a_task_as_text_and_runs_none_of_it(
    escaping: Notebook,
) -> None:
    lab, page = escaping.lab, escaping.lab.page
    board = lab.wait_until(
        lambda: (
            (b := page.evaluate(_JS_BOARD))["chip"] and any(UNIT in c for c in b["cards"]) and b
        ),
        timeout_s=DRAW_S,
        what=f"a task card showing {UNIT!r} and the user task's palette chip",
    )
    lab.screenshot("dashboard")

    # the chip shows the label and the code name, its hover label, name and unit: all as text
    assert board["chip"] == {"text": f"{TITLE}htmltask", "title": f"{TITLE} · htmltask · {UNIT}"}
    assert page.evaluate(_JS_INJECTED) == NOTHING_INJECTED
    assert escaping.dialogs.opened == []
    assert_the_recorder_sees_an_alert(page, escaping.dialogs)


def test_the_report_shows_html_of_a_task_and_the_config_as_text_and_runs_none_of_it(
    escaping: Notebook,
) -> None:
    outputs = escaping.lab.cell_outputs()
    report = Path(outputs[-1].strip().splitlines()[-1])
    assert report.is_file(), f"the report cell printed {outputs[-1]!r}"
    page = escaping.lab.page.context.new_page()
    dialogs = Dialogs(page)
    try:
        page.goto(report.as_uri(), wait_until="load")
        page.locator("#side-tasks").scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS_DIR / "test_escaping_browser-report.png"))
        text = page.evaluate("() => document.body.innerText")

        assert UNIT in page.locator("#side-tasks").inner_text()
        assert NOTE in page.locator("#config-table").inner_text()
        assert UNIT in text and NOTE in text
        assert page.evaluate(_JS_INJECTED) == NOTHING_INJECTED
        assert dialogs.opened == []
        assert_the_recorder_sees_an_alert(page, dialogs)
    finally:
        page.close()


def test_the_session_kept_the_strings_as_given(escaping: Notebook) -> None:
    result = escaping.lab.run_code(
        "import json\n"
        "print(json.dumps([session.config.notes['note'], "
        "[t['unit'] for t in session.tasks]]))"
    )
    assert result.error is None, result.error
    note, units = json.loads(result.text.strip().splitlines()[-1])
    assert note == NOTE and units == [UNIT]
