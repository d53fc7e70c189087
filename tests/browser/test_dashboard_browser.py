"""The dashboard as a user sees it in JupyterLab (system Chromium): it fits the cell at 800, 1200
and 1800 px with nothing overlapping and no horizontal scroll, the figures' tool bar covers no
title, it follows the dark theme, every card says its state and why (and a task on the
leftovers says so), both spellings of a task are on the page, and cards and sliders work from
the keyboard.

One notebook serves the module: a ``FakeSession`` (tests/ui/fake_session.py) with four side
tasks in four states, its ``Dashboard`` ticked by hand (no pump, so nothing moves under the
test) and a GPU monitor fed by a fake sampler. The tests save ``docs/screenshots/*.png``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from dashboard_notebook import dashboard_cell, draw

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "docs" / "screenshots"
MAX_PNG_BYTES = 200 * 1024
HEIGHT = 2000  # px: the whole dashboard fits the page

# Tasks in four states (t2 runs) and a GPU monitor fed by a fake sampler.
SETUP = (
    "from freeride_lab.gpu.nvml import GpuSample, NvmlSampler\n"
    "from freeride_lab.ui.gpu_monitor import GpuMonitor, ProcessRole\n\n"
    "GIB = 1024**3\n"
    "session._tasks['t1'].update(state='PAUSED', budget_ms=400.0)  # no bubble is that long\n"
    "session._tasks['t3'].update(state='FAILED', error='CUDA out of memory allocating 2.0 GiB')\n"
    "session._tasks['t4'].update(state='STOPPED', reason='overran its bubble 3 times (KILL)',\n"
    "                            gating='leftovers')  # beside t3 on stage 2\n"
    "readings = iter(range(1, 10**6))\n\n"
    "def read():\n"
    "    t = next(readings)\n"
    "    return [GpuSample(index=0, t_ns=t, utilization_pct=40 + 40 * (t % 5 == 0) + t % 7,\n"
    "                      memory_used_bytes=(30 + t % 4) * GIB, memory_total_bytes=80 * GIB,\n"
    "                      power_w=300 + 5 * (t % 9), sm_clock_mhz=1980 - 15 * (t % 3),\n"
    "                      processes=((100, 24 * GIB), (200, 6 * GIB)), cuda_ordinal=0)]\n\n"
    "gpu = GpuMonitor(NvmlSampler(reader=read),\n"
    "                 roles={100: ProcessRole('training', 'rank 0'),\n"
    "                        200: ProcessRole('side_task', 'SGD-MF (t1)')})\n"
    "for _ in range(40):\n"
    "    gpu.update(gpu.sampler.tick())\n"
)
CELLS = [
    dashboard_cell(
        (("sgd_mf", 0), ("pagerank", 1), ("resnet18", 2), ("image", 2)),
        setup=SETUP,
        options=", gpu_monitor=gpu",
    )
]

# [Note: layout probe] The dashboard's parts must stack without overlapping, and nothing inside
# it may reach past its right edge, nor may the output cell or the page scroll sideways.
_JS_LAYOUT = """
() => {
  const dash = document.querySelector('.fr-dash');
  const out = dash.closest('.jp-OutputArea-output');
  const box = dash.getBoundingClientRect();
  const shown = (e) => { const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0; };
  const stacked = (parent) => {
    const rects = Array.from(parent.children).filter(shown).map((e) => e.getBoundingClientRect());
    const bad = [];
    for (let i = 1; i < rects.length; i++)
      if (rects[i].top < rects[i - 1].bottom - 1) bad.push([i - 1, i]);
    return bad;
  };
  const wide = Array.from(dash.querySelectorAll('*')).filter((e) => !e.ownerSVGElement)
    .filter(shown)
    .filter((e) => e.getBoundingClientRect().right > box.right + 1)
    .map((e) => `${e.tagName}.${String(e.className.baseVal ?? e.className).slice(0, 50)}`);
  const notebook = dash.closest('.jp-WindowedPanel-outer') || dash.closest('.jp-Notebook');
  return {
    overlaps: stacked(dash),
    timelineOverlaps: stacked(dash.querySelector('.fr-timeline')),
    wide: wide.slice(0, 8),
    outScroll: out.scrollWidth - out.clientWidth,
    notebookScroll: notebook.scrollWidth - notebook.clientWidth,
    pageScroll: document.scrollingElement.scrollWidth - window.innerWidth,
    right: box.right, outRight: out.getBoundingClientRect().right,
  };
}
"""

_JS_TOOLBAR_COVERS = """
() => {
  const hit = (a, b) =>
    a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  const bars = Array.from(document.querySelectorAll('.fr-dash .modebar'))
    .map((e) => e.getBoundingClientRect()).filter((r) => r.width > 0);
  const titles = Array.from(document.querySelectorAll(
    '.fr-dash .fr-dash-title, .fr-dash .fr-title, .fr-dash .gtitle, .fr-dash .legendtext'));
  const covered = titles.filter((t) => bars.some((b) => hit(b, t.getBoundingClientRect())));
  return {bars: bars.length, covered: covered.map((t) => t.textContent.slice(0, 40))};
}
"""


@pytest.fixture(scope="module")
def dashboard(lab_module: Any, notebook_factory: Callable[[list[str]], str]) -> Iterator[Any]:
    """The notebook with the dashboard drawn (timeline bars, cards, sparklines)."""
    lab = lab_module
    path = lab.server.add_notebook("dashboard.ipynb", notebook_factory(CELLS))
    draw(
        lab,
        path,
        width=800,  # drawn narrow, then widened
        height=HEIGHT,
        selectors=(
            ".fr-dash [data-testid=card-t4]",
            ".fr-dash .fr-timeline .barlayer path",
            ".fr-dash .fr-spark",
        ),
    )
    lab.page.locator(".fr-dash").scroll_into_view_if_needed()
    yield lab


def settle(lab: Any, width: int) -> None:
    """Resize the page and wait until the figures fit the new width."""
    lab.page.set_viewport_size({"width": width, "height": HEIGHT})
    try:
        lab.wait_until(
            lambda: not lab.page.evaluate(_JS_LAYOUT)["wide"],
            timeout_s=30,
            what=f"the dashboard to fit {width} px",
        )
    except TimeoutError as exc:
        raise AssertionError(f"{exc}: {lab.page.evaluate(_JS_LAYOUT)}") from None


def save(lab: Any, name: str) -> Path:
    """A PNG of the dashboard's output under docs/screenshots (checked to stay small)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    lab.page.locator(".jp-OutputArea-output:has(.fr-dash)").screenshot(
        path=str(path), animations="disabled", scale="css"
    )
    assert path.stat().st_size <= MAX_PNG_BYTES, f"{path.name}: {path.stat().st_size} bytes"
    return path


@pytest.mark.parametrize("width", [800, 1200, 1800])
def test_dashboard_fits_the_cell_without_overlap_or_sideways_scroll(dashboard, width):
    settle(dashboard, width)
    layout = dashboard.page.evaluate(_JS_LAYOUT)
    assert layout["overlaps"] == [] and layout["timelineOverlaps"] == [], layout
    assert layout["wide"] == [], layout
    assert layout["outScroll"] <= 0 and layout["pageScroll"] <= 0, layout
    assert layout["notebookScroll"] <= 0, layout
    if width == 800:
        save(dashboard, "dashboard-narrow")


@pytest.mark.parametrize("width", [1800, 1200])
def test_figure_tool_bar_covers_no_title(dashboard, width):
    settle(dashboard, width)
    page = dashboard.page
    for figure in page.locator(".fr-dash .js-plotly-plot").all():
        figure.hover()
        covers = page.evaluate(_JS_TOOLBAR_COVERS)
        assert covers["covered"] == [], covers


def test_phase_line_is_the_first_thing_shown(dashboard):
    first = dashboard.page.locator(".fr-dash > *").first
    assert "step 6 of 20" in first.inner_text()


def test_every_card_says_its_state_and_why(dashboard):
    page = dashboard.page
    t = page.get_by_test_id
    assert "never runs" in t("why-t1").inner_text()
    assert "42" not in t("fix-t1").inner_text() and "set budget to" in t("fix-t1").inner_text()
    assert "failed: CUDA out of memory" in t("why-t3").inner_text()
    assert "failed" in t("state-t3").inner_text() and "✕" in t("state-t3").inner_text()
    assert "stopped: overran its bubble" in t("why-t4").inner_text()
    assert "running" in t("state-t2").inner_text()


def test_both_spellings_and_the_id_are_on_the_page(dashboard):
    card = dashboard.page.get_by_test_id("card-t1")
    text = card.inner_text()
    assert "SGD-MF" in text and "sgd_mf" in text
    assert card.get_attribute("title") == "SGD-MF · sgd_mf · t1"  # the id, on hover
    labels = dashboard.page.locator(".fr-dash [data-testid^=card-]").evaluate_all(
        "(cards) => cards.map((c) => c.getAttribute('aria-label'))"
    )
    assert len(labels) == 4 and all(label and " · t" in label for label in labels)


def test_a_task_on_the_leftovers_says_so_on_its_card(dashboard):
    badge = dashboard.page.get_by_test_id("badge-t4")
    assert badge.inner_text() == "leftovers"
    assert "main task leaves" in (badge.get_attribute("title") or "")
    assert dashboard.page.get_by_test_id("badge-t2").count() == 0


def kernel_value(lab: Any, expression: str) -> Any:
    result = lab.run_code(f"import json; print(json.dumps({expression}))")
    assert result.error is None, result.error
    return json.loads(result.text)


def test_cards_and_sliders_work_from_the_keyboard(dashboard):
    lab, page = dashboard, dashboard.page
    settle(lab, 1200)
    t = page.get_by_test_id
    t("card-t2").focus()
    page.keyboard.press("ArrowRight")  # pagerank: stage 1 → stage 2
    lab.wait_until(
        lambda: kernel_value(lab, "session.tasks[1]['stage']") == 2,
        timeout_s=30,
        what="the move to reach the session",
    )
    t("stage-2").get_by_test_id("card-t2").wait_for(timeout=10_000)
    assert page.evaluate("document.activeElement.dataset.testid") == "card-t2"
    page.keyboard.press("Enter")  # opens its limits
    slider = t("slider-t2-sm_pct")
    slider.wait_for(timeout=10_000)
    assert slider.get_attribute("aria-label") == "SM % of PageRank · pagerank · t2"
    slider.focus()
    page.keyboard.press("ArrowRight")
    lab.wait_until(
        lambda: kernel_value(lab, "session.tasks[1]['sm_pct']") == 1,
        timeout_s=30,
        what="the slider's tune to reach the session",
    )
    t("fix-t1").focus()
    page.keyboard.press("Enter")
    lab.wait_until(
        lambda: kernel_value(lab, "session.tasks[0]['budget_ms']") == 2.0,
        timeout_s=30,
        what="the fix to reach the session",
    )


def test_dark_theme_colours_the_dashboard_and_its_figures(dashboard):
    lab, page = dashboard, dashboard.page
    settle(lab, 1200)
    save(lab, "dashboard-light")
    page.evaluate(
        "window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})"
    )
    lab.wait_until(
        lambda: page.evaluate("document.body.dataset.jpThemeLight") == "false",
        timeout_s=60,
        what="JupyterLab Dark",
    )
    lab.wait_until(
        lambda: kernel_value(lab, "[dash.theme.theme, dash.timeline.theme]") == ["dark", "dark"],
        timeout_s=30,
        what="the kernel to learn the dark theme",
    )
    luminance = """(e) => { const c = getComputedStyle(e)[%s].match(/[\\d.]+/g).map(Number);
      return (0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2]) / 255; }"""
    text = page.get_by_test_id("card-t1").evaluate(luminance % "'color'")
    card = page.get_by_test_id("card-t1").evaluate(luminance % "'backgroundColor'")
    assert text > 0.6 and card < 0.3, (text, card)
    tick = page.locator(".fr-timeline .xtick text").first
    lab.wait_until(
        lambda: tick.evaluate(luminance % "'fill'") > 0.6,
        timeout_s=30,
        what="the timeline's axis text to turn light",
    )
    save(lab, "dashboard-dark")
    page.evaluate(
        "window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Light'})"
    )
