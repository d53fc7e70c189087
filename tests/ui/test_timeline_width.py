"""The live timeline's width stays its container's: what the kernel sends never fixes it.

plotly.js, given a height alone, turns ``autosize`` off and pins the width of that moment; the
browser tests (tests/browser/test_timeline_fit_browser.py) show the figure following the cell,
these check the messages and the front-end module that make it so.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("plotly", reason="the notebook UI packages are not installed")
pytest.importorskip("anywidget", reason="the notebook UI packages are not installed")

from test_timeline import fake_tables

from freeride_lab.ui.plot_fit import PlotFit
from freeride_lab.ui.timeline import Timeline

REPO = Path(__file__).resolve().parents[2]


def layout_messages(tl: Timeline) -> list[dict]:
    """The layout part of every update and relayout message the lanes figure sends from now."""
    sent: list[dict] = []

    def keep(change: dict) -> None:
        if change["new"]:
            sent.append(change["new"].get("relayout_data") or change["new"].get("layout_data"))

    tl.figure.observe(keep, names=["_py2js_update", "_py2js_relayout"])
    return sent


def test_every_height_sent_keeps_autosize_on_and_no_width():
    tl = Timeline()
    sent = layout_messages(tl)
    tl.update(*fake_tables(ranks=2))
    tl.update(*fake_tables(ranks=4))  # two more lanes: a new height
    heights = [m for m in sent if m and "height" in m]
    assert [m["height"] for m in heights] == [120 + 48 * 2, 120 + 48 * 4]
    assert all(m.get("autosize") is True and "width" in m and m["width"] is None for m in heights)
    assert tl.figure.layout.height == 120 + 48 * 4 and tl.figure.layout.width is None


def test_an_unchanged_height_is_not_sent_again():
    tl = Timeline()
    tl.update(*fake_tables(ranks=2, steps=3))
    sent = layout_messages(tl)
    tl.update(*fake_tables(ranks=2, steps=4))
    assert not [m for m in sent if m and "height" in m]


def test_the_timeline_widget_carries_a_plot_fit():
    tl = Timeline()
    assert any(isinstance(child, PlotFit) for child in tl.widget.children)


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to parse the module")
def test_plot_fit_js_parses():
    subprocess.run(["node", "--check", str(REPO / "widgets" / "plot_fit.js")], check=True)
