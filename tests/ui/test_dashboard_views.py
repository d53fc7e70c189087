"""What the dashboard tells a user: the phase line, why each side task is in its state, final
states after the run, no overhead without side tasks, figures that agree with
``Session.summary()``, one spelling per task, and the theme.

Most claims use ``FakeSession`` (fake_session.py); the agreement with ``Session.summary()`` is
also checked on one small real CPU run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

for _ui_package in ("plotly", "anywidget"):
    pytest.importorskip(_ui_package, reason="the notebook UI packages are not installed")
from fake_session import FakeSession  # noqa: E402
from runs import synthetic_config  # noqa: E402
from waits import wait_until  # noqa: E402

from freeride_lab.pipeline.launcher import RunState  # noqa: E402
from freeride_lab.ui.dashboard import Dashboard, explain, html_summary  # noqa: E402

STAGES = [{"stage": 0, "bubbles_ms": [42.3, 12.0]}, {"stage": 1, "bubbles_ms": [8.0]}]


def make_dash(session: Any, tmp_path: Path, **kwargs: Any) -> Dashboard:
    dash = Dashboard(session, tasks_dir=tmp_path / "tasks", busy_frac=1.0, **kwargs)
    dash.widget  # noqa: B018 - built, not started: tests tick it themselves
    return dash


class PhasedSession(FakeSession):
    """A session that reports its phase, as ``Session.progress`` does."""

    progress = "starting 4 ranks…"


# -- the phase line ------------------------------------------------------------------------------


def test_phase_line_shows_at_the_top_before_the_first_tick(tmp_path):
    dash = make_dash(PhasedSession(steps=10), tmp_path)
    top = dash.widget.children[0]
    assert top is dash._parts["phase"]
    assert "starting 4 ranks…" in top.value and dash.ticks == 0


def test_phase_line_follows_the_session(tmp_path):
    session = PhasedSession(steps=10)
    dash = make_dash(session, tmp_path)
    session.progress = "step 12"
    dash.tick()
    assert "step 12" in dash._parts["phase"].value


def test_a_session_without_a_phase_shows_no_phase_line(tmp_path):
    dash = make_dash(FakeSession(steps=10), tmp_path)
    dash.tick()
    assert dash._parts["phase"].value == ""


# -- why a task is in its state ------------------------------------------------------------------


def task(**changes: Any) -> dict[str, Any]:
    return {
        "id": "t1",
        "name": "sgd_mf",
        "stage": 0,
        "state": "PAUSED",
        "budget_ms": None,
    } | changes


def test_a_budget_longer_than_every_bubble_says_it_never_runs_and_offers_a_fix():
    said = explain(task(budget_ms=80.0), STAGES, run_over=False)
    assert "never runs" in said["why"] and "80 ms" in said["why"] and "42.3 ms" in said["why"]
    assert said["fix"]["limits"]["budget_ms"] <= 42.3
    assert said["fix"]["label"].startswith("set budget to")


def test_a_budget_that_fits_a_bubble_needs_no_fix():
    said = explain(task(budget_ms=40.0), STAGES, run_over=False)
    assert said["fix"] is None and "never runs" not in said["why"]


@pytest.mark.parametrize(
    ("state", "fields", "expected"),
    [
        ("FAILED", {"error": "CUDA out of memory"}, "failed: CUDA out of memory"),
        ("STOPPED", {"reason": "overran its bubble 3 times (policy KILL)"}, "stopped: overran"),
        ("RUNNING", {}, "running inside the bubbles"),
        ("SUBMITTED", {}, "starting"),
    ],
)
def test_each_state_says_why(state, fields, expected):
    assert explain(task(state=state, **fields), STAGES, run_over=False)["why"].startswith(expected)


@pytest.fixture
def over_budget(tmp_path) -> tuple[FakeSession, Dashboard]:
    """A session whose one task (sgd_mf on stage 0) has a 500 ms step budget, longer than every
    bubble, and its dashboard, ticked twice: the second tick explains with the stages read on
    the first."""
    session = FakeSession(steps=10)
    session.advance(2)
    session.attach("sgd_mf", stage=0, budget_ms=500.0)
    dash = make_dash(session, tmp_path)
    dash.tick()
    dash.tick()
    return session, dash


def test_the_board_card_carries_state_reason_label_code_name_and_id(over_budget):
    _, dash = over_budget
    card = dash.board.tasks[0]
    assert card["label"] == "SGD-MF" and card["name"] == "sgd_mf"
    assert card["caption"] == "SGD-MF · sgd_mf · t1"
    assert "never runs" in card["why"] and card["fix"]["limits"]["budget_ms"] < 500


def test_the_fix_is_a_tune_the_session_accepts(over_budget):
    session, dash = over_budget
    fix = dash.board.tasks[0]["fix"]
    assert dash.board.submit({"op": "tune", "id": "t1", "limits": fix["limits"]})
    dash.tick()
    assert session.tasks[0]["budget_ms"] == fix["limits"]["budget_ms"]
    assert dash.board.tasks[0]["fix"] is None


def test_tasks_stay_on_the_board_with_their_final_state_after_the_run(tmp_path):
    session = FakeSession(steps=10)
    session.advance(2)
    session.attach("pagerank", stage=1)
    session.advance(1)
    dash = make_dash(session, tmp_path)
    dash.tick()
    session.finish(RunState.FINISHED)
    session._tasks.clear()  # a session that no longer lists its tasks once the run is over
    assert dash.tick()  # the final tick
    (card,) = dash.board.tasks
    assert card["id"] == "t1" and card["final"] is True
    assert card["why"] == "the run ended while it was running"


def test_html_fallback_says_why_too():
    session = FakeSession(steps=10)
    session.attach("sgd_mf", stage=0)
    page = html_summary(session)
    assert "SGD-MF" in page and "sgd_mf" in page and "starting" in page


# -- overhead and agreement with Session.summary() -----------------------------------------------


def test_no_overhead_and_no_side_task_legend_while_no_side_task_ran(tmp_path):
    session = FakeSession(steps=10)
    session.advance(3)
    dash = make_dash(session, tmp_path)
    dash.tick()
    assert "no side task has run" in dash._parts["costs"].value
    assert "training overhead" not in dash._parts["costs"].value
    listed = [t.name for t in dash.timeline.figure.data if t.showlegend is not False]
    assert "overrun" not in listed and "bubble" in listed


def test_fraction_chart_shows_session_summary_for_the_whole_run(tmp_path):
    session = FakeSession(steps=40)
    session.advance(12)  # more steps than the dashboard's history
    dash = make_dash(session, tmp_path, history_steps=4, window_steps=2)
    dash.tick()
    summary = session.summary()
    measured, theory = dash.timeline.fractions.data
    assert list(measured.x) == [str(r) for r in summary["rank"]]
    np.testing.assert_allclose(measured.y, summary["measured_frac"])
    np.testing.assert_allclose(theory.y, summary["theory_frac"])


@pytest.mark.slow
def test_fraction_chart_agrees_with_session_summary_on_a_real_run(tmp_path):
    from freeride_lab.lab.session import Session

    config = synthetic_config(steps=6, phase_ms=5.0)
    session = Session.launch(config, run_dir=tmp_path / "run", grace_s=5)
    try:
        wait_until(lambda: session.state.done, timeout_s=240, what="the run to finish")
        dash = make_dash(session, tmp_path, history_steps=3, window_steps=2)
        assert dash.tick()
        summary = session.summary()
        measured, theory = dash.timeline.fractions.data
        np.testing.assert_allclose(measured.y, summary["measured_frac"])
        np.testing.assert_allclose(theory.y, summary["theory_frac"])
        assert "no side task has run" in dash._parts["costs"].value
    finally:
        session.stop()


# -- theme ---------------------------------------------------------------------------------------


def test_dark_theme_from_the_page_switches_the_plotly_template(tmp_path):
    dash = make_dash(FakeSession(steps=10), tmp_path)
    dash.theme.theme = "dark"  # what widgets/theme.js writes for JupyterLab Dark
    for fig in (dash.timeline.figure, dash.timeline.fractions):
        assert fig.layout.template.layout.paper_bgcolor == "rgb(17,17,17)"  # plotly_dark's
        assert fig.layout.paper_bgcolor == "rgba(0,0,0,0)"  # the notebook's own background
    dash.theme.theme = "light"
    assert dash.timeline.figure.layout.template.layout.paper_bgcolor == "white"


def test_unknown_theme_is_refused():
    from freeride_lab.ui.timeline import figure_theme

    with pytest.raises(ValueError, match="theme='blue'"):
        figure_theme("blue")  # type: ignore[arg-type]
