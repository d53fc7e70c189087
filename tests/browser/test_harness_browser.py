"""The browser harness on tiny generated notebooks: widgets render, drags reach the kernel."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.browser

# Plotly's bar paths, as drawn by a FigureWidget (plotly 7, rendered through anywidget).
BAR_PATHS = ".js-plotly-plot .barlayer .trace.bars path"

WIDGETS_CELLS = [
    "import ipywidgets as widgets\n"
    "slider = widgets.IntSlider(value=3, min=0, max=10, description='microbatches')\n"
    "slider",
    "import numpy as np\n"
    "import plotly.graph_objects as go\n"
    "fig = go.FigureWidget([go.Bar(orientation='h', y=[0, 1, 2], base=np.array([0.0, 5.0, 9.0]),\n"
    "                              x=np.array([4.0, 3.0, 2.5]), name='forward')])\n"
    "fig.update_layout(height=260, barmode='overlay')\n"
    "fig",
]

# A toy drag-and-drop widget with the board's test ids: the drop reaches Python through a synced
# trait, exactly the path the real board (widgets/board.js) uses.
DROP_ESM = """
function render({ model, el }) {
  const card = document.createElement("div");
  card.textContent = "demo task";
  card.draggable = true;
  card.dataset.testid = "palette-demo";
  card.style.cssText = "padding:8px;border:1px solid #888;width:140px;cursor:grab";
  const onDragStart = (e) => e.dataTransfer.setData("text/plain", "demo");
  card.addEventListener("dragstart", onDragStart);
  const zone = document.createElement("div");
  zone.dataset.testid = "stage-1";
  zone.textContent = "stage 1";
  zone.style.cssText = "margin-top:24px;height:80px;width:300px;border:2px dashed #888";
  const onDragOver = (e) => e.preventDefault();
  const onDrop = (e) => {
    e.preventDefault();
    const name = e.dataTransfer.getData("text/plain");
    model.set("dropped", [...model.get("dropped"), { name, stage: 1 }]);
    model.save_changes();
  };
  zone.addEventListener("dragover", onDragOver);
  zone.addEventListener("drop", onDrop);
  el.append(card, zone);
  return () => {
    card.removeEventListener("dragstart", onDragStart);
    zone.removeEventListener("dragover", onDragOver);
    zone.removeEventListener("drop", onDrop);
  };
}
export default { render };
"""

DROP_CELLS = [
    "import anywidget\n"
    "import traitlets\n\n"
    f"ESM = {DROP_ESM!r}\n\n"
    "class DropDemo(anywidget.AnyWidget):\n"
    "    _esm = ESM\n"
    "    dropped = traitlets.List().tag(sync=True)\n\n"
    "demo = DropDemo()\n"
    "demo",
]


def test_harness_renders_widgets(lab: Any, notebook_factory: Callable[[list[str]], str]) -> None:
    path = lab.server.add_notebook("harness-widgets.ipynb", notebook_factory(WIDGETS_CELLS))
    lab.open(path)
    lab.run_all()

    lab.wait_for_selector_count(".jp-OutputArea-output .widget-slider", timeout_s=60)
    bars = lab.wait_for_selector_count(BAR_PATHS, at_least=3, timeout_s=60)
    lab.screenshot("widgets")
    assert bars == 3, f"expected one path per bar (3), found {bars}"


@pytest.mark.parametrize("method", ["mouse", "events"])
def test_harness_drag_reaches_the_kernel(
    lab: Any, notebook_factory: Callable[[list[str]], str], method: str
) -> None:
    path = lab.server.add_notebook(f"harness-drag-{method}.ipynb", notebook_factory(DROP_CELLS))
    lab.open(path)
    lab.run_all()
    page = lab.page
    lab.wait_for_selector_count("[data-testid=palette-demo]", timeout_s=60)

    lab.drag(
        page.locator("[data-testid=palette-demo]"),
        page.locator("[data-testid=stage-1]"),
        method=method,
    )

    def dropped() -> list[dict[str, object]]:
        result = lab.run_code("import json; print(json.dumps(demo.dropped))")
        assert result.error is None, result.error
        return list(json.loads(result.text))

    seen = lab.wait_until(
        dropped, timeout_s=60, what="the drop to reach demo.dropped", interval_s=0.5
    )
    assert seen == [{"name": "demo", "stage": 1}]
