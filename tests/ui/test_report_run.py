"""The report of a real quickstart-shaped run (1F1B, 4 stages, 4 micro-batches, CPU, gloo):
self-contained within 1.5 MB, the answer before the timeline, a failed side task listed with its
error, and the cost saving of a custom task that declares its reference throughput.

One run serves the module: two side tasks are attached once training has three steps (so the
run has steps without side-task work to compare), the run is stopped as soon as both have shown
what the report needs, and the report is written from the stopped run.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("plotly", reason="the notebook UI packages are not installed")

from freeride_lab.core.config import RunConfig
from freeride_lab.lab.session import Session

TASKS = Path(__file__).resolve().parent / "report_tasks.py"
STARTUP_S = 240.0  # first step of a fresh run on a loaded two-core box
LIVE_S = 180.0
MAX_BYTES = 1_500_000
QUICKSTART = RunConfig(schedule="1F1B", stages=4, microbatches=4, steps=30)

pytestmark = pytest.mark.slow  # a real 4-rank run: about a minute on two cores


def wait_until(predicate: Callable[[], object], timeout_s: float, what: str, run: Session) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if run.state.done:
            raise AssertionError(f"the run ended ({run.state}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, Session]]:
    root = tmp_path_factory.mktemp("report-run")
    run = Session.launch(QUICKSTART, run_dir=root / "run", grace_s=3)
    try:
        wait_until(lambda: run.steps_done >= 3, STARTUP_S, "three training steps", run)
        declared = run.attach(f"{TASKS}:DeclaredCounting", stage=1, policy="WARN")["id"]
        failing = run.attach(f"{TASKS}:FailingStep", stage=2)["id"]

        def shown() -> bool:
            steps = run.side_task_steps
            states = {t["id"]: t["state"] for t in run.tasks}
            return (steps["task_id"] == declared).sum() >= 3 and states[failing] == "FAILED"

        wait_until(shown, LIVE_S, "steps of the declared task and the failure", run)
        attached_at = run.steps_done
        wait_until(lambda: run.steps_done >= attached_at + 3, LIVE_S, "steps with side tasks", run)
    finally:
        run.stop()
    path = run.report(root / "report" / "report.html")
    yield path, path.read_text(encoding="utf-8"), run


def test_quickstart_report_is_self_contained_within_the_size_limit(report) -> None:
    path, html, _ = report
    assert path.stat().st_size <= MAX_BYTES, f"{path.stat().st_size:,} bytes"
    assert len(re.findall(r"\* plotly\.js (?:\([a-z -]+\) )?v\d", html)) == 1
    assert not re.search(r"<script[^>]+src\s*=", html, re.IGNORECASE)


def test_headline_comes_before_the_timeline_and_the_config_last(report) -> None:
    _, html, _ = report
    headline = html.index('id="headline"')
    timeline = html.index('id="timeline"')
    config = html.index('id="config-table"')
    assert headline < timeline < config
    first_screen = html[headline:timeline]
    assert re.search(r"[\d.]+% measured vs [\d.]+% theory", first_screen)
    assert "of the bubble time" in first_screen


def test_failed_side_task_is_listed_with_its_error_as_text(report) -> None:
    _, html, _ = report
    failed = html[html.index('id="failed-side-tasks-table"') :]
    failed = failed[: failed.index("</table>")]
    assert "FailingStep" in failed
    assert "lost the &lt;b&gt;dataset&lt;/b&gt; handle" in failed


def test_custom_task_with_a_reference_throughput_gets_its_cost_saving(report) -> None:
    _, html, run = report
    cost = html[html.index('id="headline-cost"') :]
    cost = cost[: cost.index("</div>")]
    assert "overhead-corrected" in cost and "as published" in cost
    assert "not available" not in html
    assert run.cost_model().theta("DeclaredCounting") == 500.0
    assert run.cost_saving().saving_published_frac > 0
