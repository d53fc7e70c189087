"""The live timeline follows its cell's width in JupyterLab (system Chromium), both ways.

The dashboard is drawn in a wide page (1400 px), then the page narrows to 800 px and widens to
1200 px; then, the page keeping its width, JupyterLab's side panel is toggled twice, which
widens and narrows the cell alone. Each time the timeline's plot must fit inside the cell's
output area, fill at least 90 % of the width it has there, and the page must not scroll
sideways: a figure that kept the width of its first draw would run past a narrowed cell, or
leave a widened one half empty.

One notebook serves the module: a ``FakeSession`` (tests/ui/fake_session.py) with two side
tasks and its ``Dashboard`` ticked by hand (no pump, so nothing moves under the test).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from dashboard_notebook import dashboard_cell, draw

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

HEIGHT = 1600  # px: the whole dashboard fits the page
FIT_S = 30.0  # a resize redraws within a fraction of a second; the bound only ends a broken run
FILL = 0.9  # the plot spans at least this share of the width its box has in the cell

CELLS = [dashboard_cell((("sgd_mf", 0), ("pagerank", 1)))]

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
    boxLeft: box.left, boxRight: box.right, boxWidth: box.width,
    svgLeft: svg.left, svgRight: svg.right, svgWidth: svg.width,
    sizedRight: sized.right, sizedWidth: sized.width,
    pageScroll: document.scrollingElement.scrollWidth - window.innerWidth,
  };
}
"""


def fits(m: dict[str, float]) -> bool:
    """JupyterLab has laid the page out for the viewport, and in it the plot stays inside its
    box (the figure's share of the cell) and the output area, fills the box, and nothing
    scrolls sideways."""
    return (
        m["outRight"] <= m["viewport"]
        and m["boxLeft"] - 1 <= m["svgLeft"]
        and m["svgRight"] <= min(m["boxRight"], m["outRight"]) + 1
        and m["sizedRight"] <= min(m["boxRight"], m["outRight"]) + 1
        and m["svgWidth"] >= FILL * m["boxWidth"]
        and m["pageScroll"] <= 0
    )


@pytest.fixture(scope="module")
def dashboard(lab_module: Any, notebook_factory: Callable[[list[str]], str]) -> Iterator[Any]:
    """The notebook with the dashboard drawn in a 1400 px page (timeline bars shown)."""
    lab = lab_module
    path = lab.server.add_notebook("timeline_fit.ipynb", notebook_factory(CELLS))
    draw(lab, path, width=1400, height=HEIGHT, selectors=[".fr-dash .fr-timeline .barlayer path"])
    lab.page.locator(".fr-dash .fr-timeline").scroll_into_view_if_needed()
    yield lab


def settle(lab: Any, change: Callable[[], None], what: str, before: float | None) -> dict:
    """Make ``change``; wait until the cell has a new width (``before`` was its old one; None:
    any) and the timeline fits it; return the measurements (or fail with them)."""
    page = lab.page
    change()

    def fitted() -> dict[str, float] | None:
        m = page.evaluate(_JS_FIT)
        return m if m["outWidth"] != before and fits(m) else None

    try:
        return lab.wait_until(fitted, timeout_s=FIT_S, what=f"the timeline to fit {what}")
    except TimeoutError as exc:
        lab.screenshot(f"misfit-{what}")
        raise AssertionError(f"{exc}: {page.evaluate(_JS_FIT)}") from None


def viewport(lab: Any, width: int) -> Callable[[], None]:
    return lambda: lab.page.set_viewport_size({"width": width, "height": HEIGHT})


def show(seen: list[dict[str, float]]) -> str:
    """The measurements in full (pytest would shorten the dicts)."""
    return json.dumps(seen)


def check(seen: list[dict[str, float]]) -> None:
    m = seen[-1]
    assert m["svgLeft"] >= m["outLeft"] - 1 and m["svgRight"] <= m["outRight"] + 1, show(seen)
    assert m["svgRight"] <= m["boxRight"] + 1, show(seen)
    assert m["svgWidth"] >= FILL * m["boxWidth"], show(seen)
    assert m["pageScroll"] <= 0, show(seen)


def test_timeline_follows_the_page_as_it_narrows_and_widens(dashboard):
    seen: list[dict[str, float]] = []
    for width in (1400, 800, 1200):
        before = seen[-1]["outWidth"] if seen else None
        seen.append(settle(dashboard, viewport(dashboard, width), f"{width} px", before))
        check(seen)
    assert seen[2]["svgWidth"] > seen[1]["svgWidth"] + 40, show(seen)  # it grew back when widened


def test_timeline_follows_the_cell_when_the_side_panel_opens_and_closes(dashboard):
    """The window keeps its size: only the cell changes width (plotly's own resize is on the
    window's resize event)."""
    toggle = "window.jupyterapp.commands.execute('application:toggle-left-area')"
    seen = [settle(dashboard, viewport(dashboard, 1200), "1200 px", None)]
    for what in ("side panel toggled", "side panel toggled back"):
        change = lambda: dashboard.page.evaluate(toggle)  # noqa: E731
        seen.append(settle(dashboard, change, what, seen[-1]["outWidth"]))
        check(seen)
    assert abs(seen[1]["svgWidth"] - seen[2]["svgWidth"]) > 100, show(seen)  # it followed the cell
