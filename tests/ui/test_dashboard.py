"""The run dashboard: mime bundle, one pump per session, board ↔ session, timeline window.

Most claims use ``FakeSession`` (fake_session.py: planner tables, a validating side-task API).
The claims about real side tasks start one small CPU run shared by the module (``live``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

for _ui_package in ("plotly", "anywidget"):
    pytest.importorskip(_ui_package, reason="the notebook UI packages are not installed")
from fake_session import GIB, FakeSession  # noqa: E402
from runs import synthetic_config  # noqa: E402
from waits import wait_until  # noqa: E402

from freeride_lab.pipeline.launcher import RunState  # noqa: E402
from freeride_lab.sidetasks.spec import checkpoint_path  # noqa: E402
from freeride_lab.ui.dashboard import (  # noqa: E402
    WIDGET_MIME,
    Dashboard,
    SessionController,
    UserTask,
    builtin_palette,
    dashboard_for,
    html_summary,
    mimebundle,
    stop_all,
    user_tasks,
)


def pump_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("freeride-dashboard-")]


@pytest.fixture
def session() -> Iterator[FakeSession]:
    s = FakeSession(stages=2, steps=20)
    s.advance(3)
    yield s
    dashboard_for(s).stop()


@pytest.fixture
def dash(session: FakeSession, tmp_path: Path) -> Dashboard:
    # busy_frac=1: every tick redraws everything (no pacing between the tests' own ticks)
    d = Dashboard(session, tasks_dir=tmp_path / "tasks", busy_frac=1.0)
    d.widget  # noqa: B018 - built, not started: tests call tick() themselves
    return d


# -- mime bundle ---------------------------------------------------------------------------------


def test_mimebundle_has_plain_text_html_and_a_widget_view(session):
    bundle = mimebundle(session)
    assert bundle["text/plain"] == repr(session)
    assert "<table" in bundle["text/html"] or "no side tasks" in bundle["text/html"]
    assert bundle[WIDGET_MIME]["model_id"] == dashboard_for(session).widget.model_id


def test_mimebundle_include_plain_text_builds_no_dashboard():
    s = FakeSession()
    bundle = mimebundle(s, include=["text/plain"])
    assert set(bundle) == {"text/plain"}
    assert not pump_threads() or all(s.run_id not in t.name for t in pump_threads())


def test_mimebundle_exclude_drops_the_widget(session):
    bundle = mimebundle(session, exclude=[WIDGET_MIME])
    assert WIDGET_MIME not in bundle and "text/html" in bundle


def test_html_fallback_escapes_run_id_and_task_names(session):
    session.attach("<script>alert(1)</script>", stage=0)
    page = html_summary(session)
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "<b>1</b>" not in page  # the fake's run id carries markup


def test_displaying_a_session_twice_shares_one_dashboard_and_one_pump(session):
    first = mimebundle(session)[WIDGET_MIME]["model_id"]
    second = mimebundle(session)[WIDGET_MIME]["model_id"]
    assert first == second
    assert len([t for t in pump_threads() if session.run_id in t.name]) == 1


# -- the pump ------------------------------------------------------------------------------------


def test_interval_below_a_tenth_of_a_second_is_refused(session):
    with pytest.raises(ValueError, match=r"interval_s=0\.05"):
        Dashboard(session, interval_s=0.05)


def test_pump_redraws_at_most_ten_times_a_second():
    s = FakeSession(steps=10_000)
    d = Dashboard(s, interval_s=0.1)
    stop = threading.Event()

    def feed() -> None:  # new data far faster than any redraw
        while not stop.is_set():
            s.advance(1)
            time.sleep(0.005)

    feeder = threading.Thread(target=feed, daemon=True)
    started = time.monotonic()
    with d:
        feeder.start()
        wait_until(lambda: d.redraws >= 3, timeout_s=60, what="three redraws")
        stop.set()
    elapsed = time.monotonic() - started
    feeder.join()
    assert d.redraws <= elapsed / 0.1 + 1


def test_pump_stops_itself_after_drawing_the_finished_run(session):
    d = dashboard_for(session).start()
    session.advance(2)
    session.finish(RunState.FINISHED)
    wait_until(lambda: not d.running, timeout_s=30, what="the pump to end")
    assert d._parts["bar"].bar_style == "success"
    assert d._parts["counter"].value.startswith("5/20")
    d.start()
    assert not d.running  # nothing left to follow: start is a no-op


def test_stop_all_stops_every_pump():
    sessions = [FakeSession(), FakeSession()]
    for s in sessions:
        dashboard_for(s).start()
    assert stop_all() >= 2
    assert not any(dashboard_for(s).running for s in sessions)


def test_a_failing_session_table_is_counted_not_raised(dash, session, monkeypatch):
    monkeypatch.setattr(FakeSession, "stage_info", lambda self: 1 / 0)
    with dash:
        wait_until(lambda: dash.errors >= 1, timeout_s=30, what="a counted failure")
    assert not dash.running


# -- step counter, costs, timeline ---------------------------------------------------------------


def test_step_counter_and_progress_bar_follow_the_session(dash, session):
    dash.tick()
    assert dash._parts["bar"].value == 3 and dash._parts["bar"].max == 20
    session.advance(4)
    dash.tick()
    assert dash._parts["bar"].value == 7
    assert dash._parts["counter"].value == "7/20 · running"


def test_costs_say_training_ran_alone_until_a_side_task_runs(dash, session):
    dash.tick()
    costs = dash._parts["costs"].value
    assert "no side task has run" in costs and "overhead-corrected" not in costs
    session.attach("pagerank", stage=0)
    session.advance(2)
    dash.slow_s = 0.0
    dash.tick()
    costs = dash._parts["costs"].value
    assert "5.0% as published" in costs and "4.0% overhead-corrected" in costs


def test_timeline_keeps_only_the_newest_history_steps(session, tmp_path):
    d = Dashboard(session, history_steps=4, window_steps=2, tasks_dir=tmp_path, busy_frac=1.0)
    session.advance(10)
    d.tick()
    steps = sorted({int(s) for s in d.timeline._tables[0]["step"]})
    assert steps == [9, 10, 11, 12]
    assert d.timeline.shown_steps == [11, 12]


def test_timeline_bubble_trace_holds_the_sessions_bubbles_in_the_window(dash, session):
    dash.tick()
    shown = dash.timeline.shown_steps
    bubbles = session.bubbles
    expected = bubbles[bubbles["step"].isin(shown)]
    trace = next(t for t in dash.timeline.figure.data if t.name == "bubble")
    assert sorted(np.asarray(trace.base, dtype=float)) == pytest.approx(
        sorted(expected["start_ms"])
    )


def test_side_task_steps_appear_as_their_own_trace(dash, session):
    session.attach("pagerank", stage=1)
    session.advance(1)
    dash.tick()
    names = [t.name for t in dash.timeline.figure.data]
    assert "PageRank" in names
    trace = next(t for t in dash.timeline.figure.data if t.name == "PageRank")
    assert len(trace.x) >= 1


# -- board ↔ session -----------------------------------------------------------------------------


def test_palette_is_the_builtins_plus_registered_user_tasks(dash, tmp_path):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "counter.py").write_text("# a task\n")
    UserTask(name="counter", ref=f"{tasks / 'counter.py'}:Counter", unit="ticks").save(tasks)
    dash.tick()
    names = [p["name"] for p in dash.board.palette]
    assert names[: len(builtin_palette())] == [p["name"] for p in builtin_palette()]
    assert names[-1] == "counter"
    assert dash.board.palette[-1]["unit"] == "ticks"


def test_user_task_whose_file_is_gone_is_left_out(tmp_path):
    UserTask(name="gone", ref=f"{tmp_path / 'gone.py'}:Gone").save(tmp_path)
    assert user_tasks(tmp_path) == {}


def test_tick_echoes_session_tasks_and_stages_on_the_board(dash, session):
    session.attach("pagerank", stage=1)
    dash.tick()
    assert [(t["id"], t["name"], t["stage"]) for t in dash.board.tasks] == [("t1", "pagerank", 1)]
    assert [s["stage"] for s in dash.board.stages] == [0, 1]
    assert dash.board.stages[1]["free_bytes"] == 2 * GIB


def test_board_attach_reaches_the_session_with_its_argument_names(dash, session):
    dash.tick()
    dash.board.request = {
        "op": "attach",
        "name": "pagerank",
        "stage": 0,
        "limits": {"memory_bytes": GIB, "sm_pct": 30, "priority": 0, "budget_ms": 50},
        "seq": 1,
    }
    assert session.calls[-1] == ("attach", "pagerank", 0, GIB, 30.0, 0, 50.0, None)
    assert [t["id"] for t in session.tasks] == ["t1"]
    assert dash.board.tasks[0]["budget_ms"] == 50


def test_board_attach_of_a_user_task_passes_its_file_reference(dash, session, tmp_path):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "counter.py").write_text("# a task\n")
    ref = f"{tasks / 'counter.py'}:Counter"
    UserTask(name="counter", ref=ref).save(tasks)
    dash.tick()
    dash.board.request = {"op": "attach", "name": "counter", "stage": 1, "seq": 1}
    assert session.calls[-1][1] == ref


def test_board_rejection_leaves_the_session_untouched(dash, session):
    dash.tick()
    before = session.tasks
    dash.board.request = {
        "op": "attach",
        "name": "pagerank",
        "stage": 1,
        "limits": {"memory_bytes": 3 * GIB},
        "seq": 1,
    }
    assert session.tasks == before
    assert "free" in dash.board.notice and dash.board.tasks == []


def test_board_tune_move_and_detach_reach_the_session(dash, session):
    task = session.attach("pagerank", stage=0)
    dash.tick()
    dash.board.request = {"op": "tune", "id": task["id"], "limits": {"budget_ms": 80}, "seq": 1}
    assert session.tasks[0]["budget_ms"] == 80
    dash.board.request = {"op": "move", "id": task["id"], "stage": 1, "seq": 2}
    assert session.tasks[0]["stage"] == 1
    dash.board.request = {"op": "detach", "id": task["id"], "seq": 3}
    assert session.tasks == [] and dash.board.tasks == []


def test_board_checkpoint_reaches_the_session_and_its_refusal_shows(dash, session):
    task = session.attach("pagerank", stage=0)
    dash.tick()
    dash.board.request = {"op": "checkpoint", "id": task["id"], "seq": 1}
    assert session.calls[-1] == ("checkpoint", task["id"])
    assert "not started yet" in dash.board.tasks[0]["error"]
    assert "saved" not in dash.board.tasks[0]
    session.advance()
    dash.tick()
    dash.board.request = {"op": "checkpoint", "id": task["id"], "seq": 2}
    assert dash.board.tasks[0]["error"] == ""
    assert dash.board.tasks[0]["saved"].startswith("saved ")
    dash.tick()  # the session's next view keeps the line
    assert dash.board.tasks[0]["saved"].startswith("saved ")


def test_rejected_tune_shows_on_the_card_and_keeps_the_limits(dash, session):
    task = session.attach("pagerank", stage=0, sm_pct=30)
    dash.tick()
    dash.board.request = {"op": "tune", "id": task["id"], "limits": {"sm_pct": 150}, "seq": 1}
    assert session.tasks[0]["sm_pct"] == 30
    assert "sm_pct=150" in dash.board.tasks[0]["error"]


def test_attach_on_a_finished_run_is_a_rejection_not_a_crash(dash, session):
    session.finish(RunState.FINISHED)
    dash.tick()
    dash.board.request = {"op": "attach", "name": "pagerank", "stage": 0, "seq": 1}
    assert "attach needs a live run" in dash.board.notice


def test_controller_of_a_collected_session_refuses_politely():
    s = FakeSession()
    controller = SessionController(s)
    del s
    with pytest.raises(ValueError, match="session of this board is gone"):
        controller.attach("pagerank", 0)


# -- a real run ----------------------------------------------------------------------------------

STARTUP_S = 240.0  # first steps of a fresh run on a loaded two-core box
LIVE = ("PAUSED", "RUNNING")  # a side task's states with a process that can save its state


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One small real CPU run with its dashboard (not started: tests tick it), shared."""
    from freeride_lab.lab.session import Session

    config = synthetic_config(steps=3000, phase_ms=10.0)
    session = Session.launch(config, run_dir=tmp_path_factory.mktemp("dash") / "run", grace_s=5)
    try:
        wait_until(lambda: session.steps_done >= 3, timeout_s=STARTUP_S, what="three steps")
        dash = Dashboard(session, tasks_dir=tmp_path_factory.mktemp("tasks"), busy_frac=1.0)
        dash.widget  # noqa: B018
        dash.tick()
        yield dash
    finally:
        session.stop()


def test_board_attach_tune_and_detach_drive_real_side_tasks(real):
    session, board = real.session, real.board
    board.request = {"op": "attach", "name": "pagerank", "stage": 1, "seq": 1}
    assert board.notice == ""
    task_id = board.tasks[-1]["id"]
    assert [(t["name"], t["stage"]) for t in session.tasks if t["id"] == task_id] == [
        ("pagerank", 1)
    ]
    board.request = {"op": "tune", "id": task_id, "limits": {"budget_ms": 40}, "seq": 2}
    assert next(t for t in session.tasks if t["id"] == task_id)["budget_ms"] == 40
    wait_until(
        lambda: next(t for t in session.tasks if t["id"] == task_id)["state"] in LIVE,
        timeout_s=STARTUP_S,
        what="the side task's process",
    )
    board.request = {"op": "checkpoint", "id": task_id, "seq": 3}
    card = next(t for t in board.tasks if t["id"] == task_id)
    assert card["error"] == "" and card["saved"].startswith("saved ")
    assert checkpoint_path(session.run_dir.path, task_id).is_file()
    board.request = {"op": "detach", "id": task_id, "seq": 4}
    assert all(t["id"] != task_id for t in board.tasks)
    state = next(t for t in session.tasks if t["id"] == task_id)["state"]
    assert state in ("STOPPED", "DETACHED", "FINISHED")


def test_board_rejection_leaves_the_real_run_untouched(real):
    session, board = real.session, real.board
    before = session.tasks
    board.request = {"op": "attach", "name": "pagerank", "stage": 7, "seq": 10}
    assert board.notice.startswith("attach pagerank: stage 7 is not on the board")
    board.request = {
        "op": "attach",
        "name": "pagerank",
        "stage": 0,
        "limits": {"sm_pct": 150},
        "seq": 11,
    }
    assert "sm_pct=150" in board.notice
    assert session.tasks == before
    assert not session.state.done


def test_board_stages_come_from_the_real_run(real):
    real.slow_s = 0.0
    real.tick()
    assert [s["stage"] for s in real.board.stages] == [0, 1]
    assert all(s["bubbles_ms"] for s in real.board.stages)


def test_timeline_traces_hold_the_bubbles_of_the_real_run(real):
    session = real.session
    real.tick()
    shown = real.timeline.shown_steps
    assert shown
    bubbles = session.bubbles
    expected = bubbles[bubbles["step"].isin(shown)]
    trace = next(t for t in real.timeline.figure.data if t.name == "bubble")
    drawn = np.sort(np.asarray(trace.base, dtype=float))
    # the session may have gained actions since the tick: the newest shown step may have been
    # in progress then (and its boundary bubbles need the next step's start), the older ones
    # were settled and are drawn in full
    drawn_ms = set(np.round(drawn, 3))
    assert len(drawn) and drawn_ms <= set(np.round(expected["start_ms"], 3))
    settled = expected[expected["step"] < max(shown)]
    assert len(settled) and set(np.round(settled["start_ms"], 3)) <= drawn_ms


def test_a_first_view_of_the_timeline_repaints_it_once(dash, session):
    """Plotly's front end drops messages sent before it loads; its first report triggers one
    repaint of what is drawn (see [Note: widget messages before the front end])."""
    dash.tick()
    before = dash.timeline.redraws
    report = {"trace_deltas": [], "trace_edit_id": 0}
    dash.timeline.figure._js2py_traceDeltas = report
    assert dash.timeline.redraws == before + 1
    dash.timeline.figure._js2py_traceDeltas = dict(report)  # a second view: nothing to repaint
    assert dash.timeline.redraws == before + 1
    trace = next(t for t in dash.timeline.figure.data if t.name == "bubble")
    assert len(trace.x) > 0  # cleared and drawn again


def test_a_costly_timeline_waits_while_the_step_counter_follows_every_tick(tmp_path):
    class SlowTables(FakeSession):
        @property
        def actions(self):  # a large run: reading the table takes a while
            time.sleep(0.05)
            return FakeSession.actions.fget(self)

    s = SlowTables(steps=100)
    s.advance(2)
    d = Dashboard(s, busy_frac=0.01, tasks_dir=tmp_path)  # heavy parts: 1% of a core
    d.widget  # noqa: B018
    d.tick()
    drawn = d.timeline.redraws
    s.advance(1)
    d.tick()
    assert d._parts["counter"].value.startswith("3/100")
    assert d.timeline.redraws == drawn  # due again only ~100x its cost later
