"""The live timeline follows its cell's width in JupyterLab (system Chromium), both ways.

The dashboard is drawn in a wide page (1400 px), then the page narrows to 800 px and widens to
1200 px. At each width the timeline's plot must fit inside the cell's output area, fill at least
90 % of the width it has there, and the page must not scroll sideways: a figure that kept the
width of its first draw would run past the narrowed cell, or leave the widened one half empty.

One notebook serves the module: a ``FakeSession`` (tests/ui/fake_session.py) with two side
tasks and its ``Dashboard`` ticked by hand (no pump, so nothing moves under the test).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
HEIGHT = 1600  # px: the whole dashboard fits the page
DRAW_S = 240.0  # the plotly bundle is several MB: slow on a loaded two-core box
FIT_S = 30.0  # a resize redraws within a fraction of a second; the bound only ends a broken run
FILL = 0.9  # the plot spans at least this share of the width its box has in the cell

CELLS = [
    f"import sys\nsys.path.insert(0, {str(REPO / 'tests' / 'ui')!r})\n"
    "from fake_session import FakeSession\n"
    "from freeride_lab.ui.dashboard import Dashboard\n\n"
    "session = FakeSession(stages=3, microbatches=4, steps=20)\n"
    "session.progress = 'step 6 of 20'\n"
    "session.advance(5)\n"
    "for name, stage in (('sgd_mf', 0), ('pagerank', 1)):\n"
    "    session.attach(name, stage=stage)\n"
    "session.advance(1)\n"
    "dash = Dashboard(session, tasks_dir='.freeride_tasks', busy_frac=1.0)\n"
    "view = dash.widget  # built first, as on display; the pump would tick it\n"
    "dash.tick()\n"
    "dash.tick()\n"
    "view",
]

# The timeline's plot against the box it sits in: the plot (its SVG and plotly's sized div)
# must end inside the cell's output area and span most of the flex item that holds it.
_JS_FIT = """
() => {
  const timeline = document.querySelector('.fr-dash .fr-timeline');
  const plot = timeline.querySelector('.js-plotly-plot');
  const out = timeline.closest('.jp-OutputArea-output').getBoundingClientRect();
  const box = plot.closest('.widget-vbox').getBoundingClientRect();
  const svg = plot.querySelector('.main-svg').getBoundingClientRect();
  const sized = plot.querySelector('.svg-container').getBoundingClientRect();
  return {
    viewport: window.innerWidth,
    outLeft: out.left, outRight: out.right, outWidth: out.width,
    boxWidth: box.width,
    svgLeft: svg.left, svgRight: svg.right, svgWidth: svg.width,
    sizedRight: sized.right, sizedWidth: sized.width,
    pageScroll: document.scrollingElement.scrollWidth - window.innerWidth,
  };
}
"""


def fits(m: dict[str, float]) -> bool:
    """JupyterLab has laid the page out for the viewport, and in it the plot ends inside the
    output area, fills its box, and nothing scrolls sideways."""
    return (
        m["outRight"] <= m["viewport"]
        and m["svgLeft"] >= m["outLeft"] - 1
        and m["svgRight"] <= m["outRight"] + 1
        and m["sizedRight"] <= m["outRight"] + 1
        and m["svgWidth"] >= FILL * m["boxWidth"]
        and m["pageScroll"] <= 0
    )


@pytest.fixture(scope="module")
def dashboard(lab_module: Any, notebook_factory: Callable[[list[str]], str]) -> Iterator[Any]:
    """The notebook with the dashboard drawn in a 1400 px page (timeline bars shown)."""
    lab = lab_module
    path = lab.server.add_notebook("timeline_fit.ipynb", notebook_factory(CELLS))
    lab.page.set_viewport_size({"width": 1400, "height": HEIGHT})
    lab.open(path)
    lab.run_all()
    lab.page.evaluate("window.jupyterapp.commands.execute('notebook:hide-all-cell-code')")
    assert lab.cell_errors() == []
    try:
        lab.wait_for_selector_count(".fr-dash .fr-timeline .barlayer path", timeout_s=DRAW_S)
    except TimeoutError:
        lab.screenshot("not-drawn")
        raise
    lab.page.locator(".fr-dash .fr-timeline").scroll_into_view_if_needed()
    yield lab


def settle(lab: Any, width: int, before: float | None) -> dict[str, float]:
    """Resize the page to ``width``; wait until the cell has a new width (``before`` was its old
    one) and the timeline fits it; return the measurements (or fail with them)."""
    page = lab.page
    page.set_viewport_size({"width": width, "height": HEIGHT})

    def fitted() -> dict[str, float] | None:
        m = page.evaluate(_JS_FIT)
        return m if m["outWidth"] != before and fits(m) else None

    try:
        return lab.wait_until(fitted, timeout_s=FIT_S, what=f"the timeline to fit at {width} px")
    except TimeoutError as exc:
        lab.screenshot(f"misfit-{width}")
        raise AssertionError(f"{exc}: {page.evaluate(_JS_FIT)}") from None


def test_timeline_follows_the_cell_as_it_narrows_and_widens(dashboard):
    seen: list[dict[str, float]] = []
    for width in (1400, 800, 1200):
        measured = settle(dashboard, width, seen[-1]["outWidth"] if seen else None)
        seen.append(measured)
        assert measured["svgRight"] <= measured["outRight"] + 1, seen
        assert measured["svgWidth"] >= FILL * measured["boxWidth"], seen
        assert measured["pageScroll"] <= 0, seen
    assert seen[2]["svgWidth"] > seen[1]["svgWidth"] + 40, seen  # it grew back when widened
