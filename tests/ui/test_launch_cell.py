"""The ``%freeride launch`` cell of a cold kernel imports nothing heavy.

A notebook's launch cell must return at once: it shows the dashboard with its phase line, and
the timeline (plotly's figure widgets, pandas, nbformat, jsonschema: seconds in a cold kernel)
is built by the dashboard's pump after the cell has returned. Checked in a fresh interpreter,
standing in for a new kernel, on a small real CPU run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

for _ui_package in ("IPython", "plotly", "anywidget"):
    pytest.importorskip(_ui_package, reason="the notebook UI packages are not installed")

HEAVY = ("plotly.graph_objects", "nbformat", "jsonschema", "torch", "pandas")
STARTUP_S = 240.0  # first step of a fresh run on a loaded two-core box

KERNEL = textwrap.dedent(
    """
    import json, sys, time
    from IPython.core.interactiveshell import InteractiveShell

    HEAVY = {heavy!r}
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "freeride_lab")  # the notebook's first cell
    seen = {{"before": sorted(m for m in HEAVY if m in sys.modules)}}

    def returned(result):  # registered before the cell: IPython runs it first when it ends
        seen["at_return"] = sorted(m for m in HEAVY if m in sys.modules)

    ip.events.register("post_run_cell", returned)
    result = ip.run_cell(
        "%freeride launch --schedule 1F1B --stages 2 --microbatches 2 --steps 400 "
        "--workload synthetic --t-forward-ms 5 --t-backward-input-ms 5 "
        "--t-backward-weight-ms 5 --run-dir {run_dir}",
        store_history=False,
    )
    ip.events.unregister("post_run_cell", returned)
    seen["success"] = result.success
    from freeride_lab.ui.dashboard import existing_dashboard

    dash = existing_dashboard(ip.user_ns["session"])
    seen["displayed"] = dash is not None and dash.running
    seen["phase"] = dash.widget.children[0].value if dash is not None else ""
    deadline = time.monotonic() + {startup_s}
    bars = False
    while dash is not None and time.monotonic() < deadline and not bars:
        time.sleep(0.2)
        bars = dash.timeline_built and any(len(t.x) for t in dash.timeline.figure.data)
    seen["bars_after_the_cell"] = bars
    ip.run_line_magic("freeride", "stop")
    seen["stopped"] = ip.user_ns["session"].state.done
    print(json.dumps(seen))
    """
)


def test_the_launch_cell_imports_no_plotly_pandas_torch_and_the_bars_follow(tmp_path: Path):
    code = KERNEL.format(heavy=HEAVY, run_dir=tmp_path / "run", startup_s=STARTUP_S)
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=STARTUP_S + 120,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["before"] == []
    assert seen["success"], out.stdout[-2000:]
    assert seen["at_return"] == [], f"the launch cell imported {seen['at_return']}"
    assert seen["displayed"] and seen["phase"], "the dashboard and its phase line show at once"
    assert seen["bars_after_the_cell"], "the timeline's bars come after the cell has returned"
    assert seen["stopped"]
