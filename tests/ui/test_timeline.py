"""Timeline: one trace per category, bounded window, one batch_update per redraw, pump."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import numpy as np
import pandas as pd
import pytest

for _ui_package in ("plotly",):
    pytest.importorskip(_ui_package, reason="the notebook UI packages are not installed")

from drawn_tables import drawn_tables  # noqa: E402

from freeride_lab.ui.timeline import (  # noqa: E402
    Timeline,
    TimelinePump,
    TimelineTables,
    fractions_figure,
    session_tables,
    steps_in_window,
    timeline_figure,
)


def fake_tables(
    ranks: int = 2, steps: int = 5, microbatches: int = 2, side: str | None = "resnet18"
):
    """A GPipe-like run: per rank and step, F then B per micro-batch with a bubble between."""
    actions, bubbles, side_rows = [], [], []
    for step in range(steps):
        t0 = step * 100.0
        for rank in range(ranks):
            t = t0 + rank * 5.0
            for kind in ("F", "B"):
                for mb in range(microbatches):
                    actions.append((step, rank, rank, kind, mb, t, t + 4.0, 4.0))
                    t += 4.0
                if kind == "F":
                    bubbles.append(
                        (step, rank, rank, 0, t, t + 10.0, 10.0, "steady", "A", f"{rank}B0", "")
                    )
                    if side:
                        side_rows.append(
                            (
                                "t1",
                                side,
                                rank,
                                rank,
                                step,
                                t + 1,
                                t + 9.5,
                                8.5,
                                32.0,
                                "samples",
                                1.5 if step == steps - 1 else 0.0,
                                float("nan"),  # seen_ms
                                float("nan"),  # expected_ms
                                float("nan"),  # spin_from_ms
                                float("nan"),  # spin_until_ms
                                float("nan"),  # guard_ms
                            )
                        )
                    t += 10.0
    return drawn_tables(actions, bubbles, side_rows)


def summary_frame(ranks: int = 2) -> pd.DataFrame:
    return pd.DataFrame(
        {"rank": range(ranks), "measured_frac": [0.2] * ranks, "theory_frac": [0.25] * ranks}
    )


def trace(fig, name: str):
    return next(t for t in fig.data if t.name == name)


def test_static_figure_has_one_horizontal_bar_trace_per_category():
    actions, bubbles, side = fake_tables()
    fig = timeline_figure(actions, bubbles, side)
    names = [t.name for t in fig.data]
    assert names == [
        "forward F",
        "backward B",
        "backward input I",
        "backward weight W",
        "bubble",
        "ResNet-18",
        "overrun",
    ]
    assert all(t.type == "bar" and t.orientation == "h" for t in fig.data)
    assert not fig.layout.shapes


def test_bars_use_start_as_base_and_duration_as_x():
    actions, bubbles, side = fake_tables(ranks=1, steps=1, microbatches=1)
    fig = timeline_figure(actions, bubbles, side)
    forward = trace(fig, "forward F")
    assert list(forward.base) == [0.0]
    assert list(forward.x) == [4.0]
    assert list(forward.y) == [0.0]


def test_static_figure_last_steps_keeps_only_newest_steps():
    actions, bubbles, side = fake_tables(ranks=2, steps=5, microbatches=2)
    fig = timeline_figure(actions, bubbles, side, last_steps=2)
    steps = {row[1] for row in trace(fig, "forward F").customdata}
    assert steps == {3, 4}


def test_action_hover_shows_short_form_step_and_duration():
    actions, bubbles, _ = fake_tables(ranks=2, steps=1, microbatches=1)
    fig = timeline_figure(actions, bubbles)
    backward = trace(fig, "backward B")
    assert [row[0] for row in backward.customdata] == ["0B0", "1B0"]
    assert backward.customdata[0][2] == "4.00"
    assert "%{customdata[0]}" in backward.hovertemplate


def test_bubble_hover_carries_label_kind_and_predicted():
    actions, bubbles, _ = fake_tables(steps=1)
    bubbles["predicted_duration_ms"] = 9.0
    row = trace(timeline_figure(actions, bubbles), "bubble").customdata[0]
    assert list(row[:5]) == ["A", "steady", 0, "10.00", "9.00"]


def test_bubble_hover_says_why_the_bubble_is_there_when_the_table_has_the_split():
    actions, bubbles, _ = fake_tables(steps=1)
    plain = trace(timeline_figure(actions, bubbles), "bubble")
    assert plain.customdata[0][7] == ""  # no split known: no line
    split = bubbles.assign(schedule_ms=6.0, peer_ms=3.5, host_ms=0.5)
    bubble = trace(timeline_figure(actions, split), "bubble")
    assert bubble.customdata[0][7] == "<br>schedule 6.00 · peer 3.50 · host 0.50 ms"
    assert "%{customdata[7]}" in bubble.hovertemplate


def test_overrun_bar_ends_at_side_task_step_end():
    actions, bubbles, side = fake_tables(ranks=1, steps=2)
    over = trace(timeline_figure(actions, bubbles, side), "overrun")
    last = side.iloc[-1]
    assert list(over.base + over.x) == pytest.approx([last["end_ms"]])


def test_side_task_name_is_escaped_for_plotly_pseudo_html():
    actions, bubbles, side = fake_tables(side="<img src=x onerror=alert(1)>")
    names = [t.name for t in timeline_figure(actions, bubbles, side).data]
    assert "&lt;img src=x onerror=alert(1)&gt;" in names
    assert "<img src=x onerror=alert(1)>" not in names


def test_window_is_last_steps_unless_one_is_selected():
    assert steps_in_window([0, 1, 2, 3, 4, 4], last=3) == [2, 3, 4]
    assert steps_in_window([0, 1, 2], last=3, selected=1) == [1]


def test_live_timeline_shows_last_window_steps_by_default():
    actions, bubbles, side = fake_tables(steps=6)
    tl = Timeline(window_steps=3)
    tl.update(actions, bubbles, side)
    assert tl.shown_steps == [3, 4, 5]
    assert {row[1] for row in trace(tl.figure, "forward F").customdata} == {3, 4, 5}


def test_select_step_pins_one_step_and_follow_latest_returns():
    actions, bubbles, side = fake_tables(steps=6)
    tl = Timeline()
    tl.update(actions, bubbles, side)
    tl.select_step(1)
    assert {row[1] for row in trace(tl.figure, "forward F").customdata} == {1}
    tl.update(*fake_tables(steps=7))
    assert tl.shown_steps == [1]
    tl.follow_latest()
    assert tl.shown_steps == [4, 5, 6]


def test_live_duration_and_lane_arrays_are_float64():
    tl = Timeline()
    tl.update(*fake_tables())
    forward = trace(tl.figure, "forward F")
    assert {forward.x.dtype, forward.y.dtype} == {np.dtype("float64")}
    assert all(isinstance(b, float) for b in forward.base)  # plotly stores base as objects


def test_update_sends_one_update_message():
    tl = Timeline()
    tl.update(*fake_tables(steps=3))  # first update adds the side-task trace
    messages = []
    for name in ("_py2js_update", "_py2js_restyle", "_py2js_relayout"):
        tl.figure.observe(lambda c, n=name: c["new"] is not None and messages.append(n), names=name)
    tl.update(*fake_tables(steps=4))
    assert messages == ["_py2js_update"]


def test_new_side_task_gets_its_own_trace_and_keeps_it():
    actions, bubbles, side = fake_tables(steps=4)
    tl = Timeline()
    tl.update(actions, bubbles, side)
    other = side.assign(name="pagerank", task_id="t2", step=side["step"] + 10)
    tl.update(actions, bubbles, pd.concat([side, other]))
    names = [t.name for t in tl.figure.data]
    assert names.count("ResNet-18") == 1
    assert names.count("PageRank") == 1
    assert len(trace(tl.figure, "PageRank").x) == 0  # its steps are outside the window


def test_fractions_show_measured_and_theory_per_rank():
    fig = fractions_figure(summary_frame(3))
    assert [t.name for t in fig.data] == ["measured", "theory"]
    assert list(fig.data[0].y) == [0.2, 0.2, 0.2]
    assert list(fig.data[1].x) == ["0", "1", "2"]


def test_timeline_update_with_summary_fills_fractions():
    tl = Timeline()
    tl.update(*fake_tables(), summary=summary_frame())
    assert list(tl.fractions.data[1].y) == [0.25, 0.25]


def test_widget_controls_select_and_follow():
    tl = Timeline()
    tl.update(*fake_tables(steps=5))
    follow, slider = tl.widget.children[0].children
    follow.value = False
    assert tl.shown_steps == [4]
    slider.value = 2
    assert tl.shown_steps == [2]
    follow.value = True
    assert tl.shown_steps == [2, 3, 4]


class CountingTarget:
    def __init__(self) -> None:
        self.calls = 0
        self.updated = threading.Event()

    def update(self, actions, bubbles, side_task_steps=None, *, summary=None) -> None:
        self.calls += 1
        self.updated.set()


def test_pump_redraws_only_when_data_changed():
    tables = [TimelineTables(*fake_tables(steps=2)[:2])]
    pump = TimelinePump(lambda: tables[-1], CountingTarget())
    assert pump.tick() is True
    assert pump.tick() is False
    tables.append(TimelineTables(*fake_tables(steps=3)[:2]))
    assert pump.tick() is True
    assert (pump.redraws, pump.polls) == (2, 3)


def test_pump_uses_source_version_when_given():
    version = [1]
    actions, bubbles, _ = fake_tables()
    pump = TimelinePump(
        lambda: TimelineTables(actions, bubbles, version=version[0]), CountingTarget()
    )
    pump.tick()
    version[0] = 2
    assert pump.tick() is True


def test_pump_rejects_more_than_ten_hertz():
    with pytest.raises(ValueError, match=r"interval_s=0\.05"):
        TimelinePump(lambda: None, CountingTarget(), interval_s=0.05)


def test_pump_thread_redraws_and_stops_idempotently():
    actions, bubbles, _ = fake_tables()
    target = CountingTarget()
    pump = TimelinePump(lambda: TimelineTables(actions, bubbles), target, interval_s=0.1)
    pump.start()
    pump.start()
    assert target.updated.wait(timeout=30), "pump never redrew"
    pump.stop()
    pump.stop()
    assert not pump.running
    assert target.calls == 1


def test_pump_survives_a_failing_source():
    calls = []

    def source():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("table not ready")
        return TimelineTables(*fake_tables()[:2])

    target = CountingTarget()
    with TimelinePump(source, target, interval_s=0.1) as pump:
        assert target.updated.wait(timeout=30), "pump did not recover after the failure"
    assert pump.errors == 1


def test_session_tables_reads_a_session_like_object():
    actions, bubbles, side = fake_tables()

    class FakeSession:
        def __init__(self) -> None:
            self.actions, self.bubbles, self.side_task_steps = actions, bubbles, side

        def summary(self) -> pd.DataFrame:
            return summary_frame()

    tables = session_tables(FakeSession())
    assert tables.side_task_steps is side
    assert list(tables.summary.columns) == ["rank", "measured_frac", "theory_frac"]


def test_importing_ui_modules_does_not_import_torch():
    code = (
        "import sys; import freeride_lab.ui.timeline, freeride_lab.ui.report, "
        "freeride_lab.ui.trace, freeride_lab.ui.gpu_monitor, freeride_lab.ui.board; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_pump_does_not_redraw_when_source_has_no_tables():
    target = CountingTarget()
    pump = TimelinePump(lambda: None, target, interval_s=0.2).start()
    deadline = time.monotonic() + 30
    while pump.polls < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    pump.stop()
    assert pump.polls >= 2, "pump did not poll twice within 30 s"
    assert target.calls == 0
