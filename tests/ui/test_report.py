"""The HTML report: self-contained, escaped, with its Parquet, JSON and trace files beside it."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

for _ui_package in ("plotly",):
    pytest.importorskip(_ui_package, reason="the notebook UI packages are not installed")

from drawn_tables import drawn_tables  # noqa: E402

from freeride_lab.ui.report import bubble_table, environment_info, step_table, write_report  # noqa: E402
from freeride_lab.ui.report_format import percent  # noqa: E402

EVIL = "<img src=x onerror=alert(1)>"
EVIL_CONFIG = "</script><script>alert('config')</script>"


def fake_run(ranks: int = 2, steps: int = 3):
    actions, bubbles, side, step_rows = [], [], [], []
    for step in range(steps):
        for rank in range(ranks):
            t = step * 50.0 + rank * 2.0
            actions += [
                (step, rank, rank, "F", 0, t, t + 3, 3.0),
                (step, rank, rank, "B", 0, t + 13, t + 19, 6.0),
            ]
            bubbles.append(
                (
                    step,
                    rank,
                    rank,
                    0,
                    t + 3,
                    t + 13,
                    10.0,
                    "steady",
                    "A" if rank else None,
                    f"{rank}B0",
                    f"{rank}F0",
                )
            )
            side.append(
                (
                    "t1",
                    EVIL,
                    rank,
                    rank,
                    step,
                    t + 4,
                    t + 12,
                    8.0,
                    16.0,
                    "samples",
                    0.5 if step == 1 else 0.0,
                    float("nan"),  # seen_ms
                    float("nan"),  # expected_ms
                    float("nan"),  # spin_from_ms
                    float("nan"),  # spin_until_ms
                    float("nan"),  # guard_ms
                )
            )
            step_rows.append((step, rank, t, t + 20, 20.0 + step, 1.0, 2.5, 512))
    return (
        *drawn_tables(actions, bubbles, side),
        pd.DataFrame(
            step_rows,
            columns=[
                "step",
                "rank",
                "start_ms",
                "end_ms",
                "duration_ms",
                "optimizer_ms",
                "loss",
                "tokens",
            ],
        ),
    )


SUMMARY = pd.DataFrame({"rank": [0, 1], "measured_frac": [0.31, 0.29], "theory_frac": [0.33, 0.33]})
COSTS = {"overhead_frac": 0.01, "saving_published_frac": 0.08, "saving_corrected_frac": 0.07}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    actions, bubbles, side, steps = fake_run()
    out = tmp_path_factory.mktemp("report") / "report.html"
    path = write_report(
        out,
        config={"schedule": "1F1B", "stages": 2, "microbatches": 4, "note": EVIL_CONFIG},
        environment={"python": "3.11", "nvml": "NVML library not found"},
        actions=actions,
        bubbles=bubbles,
        steps=steps,
        summary=SUMMARY,
        side_task_steps=side,
        costs=COSTS,
        overheads={"training_overhead_frac": 0.01, "instrumentation_ms_per_step": 0.2},
    )
    return path, path.read_text(encoding="utf-8")


def test_report_returns_the_html_path(report):
    path, _ = report
    assert path.name == "report.html"
    assert path.is_file()


def report_in(tmp_path, actions, bubbles, steps, **fields):
    """``write_report`` of these tables to ``tmp_path / "r.html"``, with an empty environment;
    ``fields`` add the other arguments (``config`` is {"stages": 2}, ``summary`` None unless
    given)."""
    fields = {"config": {"stages": 2}, "environment": {}, "summary": None, **fields}
    return write_report(
        tmp_path / "r.html", actions=actions, bubbles=bubbles, steps=steps, **fields
    )


PLOTLY_BANNER = re.compile(r"\* plotly\.js (\([a-z -]+\) )?v\d")


def test_plotly_js_is_embedded_exactly_once(report):
    _, html = report
    assert len(PLOTLY_BANNER.findall(html)) == 1


def test_report_loads_no_external_script(report):
    _, html = report
    assert not re.search(r"<script[^>]+src\s*=\s*[\"']?https?:", html, re.IGNORECASE)
    assert not re.search(r"<link[^>]+href\s*=\s*[\"']?https?:", html, re.IGNORECASE)


def test_figures_have_stable_div_ids(report):
    _, html = report
    for div_id in ("timeline", "bubble-fractions", "side-task-progress", "cost-saving"):
        assert f'id="{div_id}"' in html


def test_side_task_name_never_appears_unescaped(report):
    _, html = report
    assert EVIL not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html  # the ledger table shows it as text


def test_config_html_cannot_break_out_of_script(report):
    _, html = report
    assert "<script>alert(" not in html
    assert "&lt;/script&gt;&lt;script&gt;alert(&#39;config&#39;)&lt;/script&gt;" in html


def test_plotly_json_escapes_closing_tags():
    import plotly.graph_objects as go

    fragment = go.Figure(go.Bar(name="</script><script>alert(1)</script>")).to_html(
        include_plotlyjs=False, full_html=False
    )
    assert "</script><script>alert(1)" not in fragment
    assert "\\u003c\\u002fscript\\u003e" in fragment


def test_report_shows_both_cost_savings(report):
    _, html = report
    assert "as published" in html
    assert "overhead-corrected" in html
    headline = html[html.index('id="headline-cost"') :]
    assert "7% overhead-corrected (8% as published)" in headline


def test_tables_are_written_as_parquet_beside_the_report(report):
    path, _ = report
    for name in ("actions", "bubbles", "steps", "side_task_steps"):
        frame = pd.read_parquet(path.parent / f"{name}.parquet")
        assert len(frame) > 0, name
    assert len(pd.read_parquet(path.parent / "actions.parquet")) == 12


def test_summary_json_holds_config_and_per_rank_fractions(report):
    path, _ = report
    doc = json.loads((path.parent / "summary.json").read_text())
    assert doc["config"]["schedule"] == "1F1B"
    assert [r["measured_frac"] for r in doc["bubbles_per_rank"]] == [0.31, 0.29]
    assert doc["side_task_ledger"][0]["progress"] == 96.0


def test_chrome_traces_per_rank_are_written_and_linked(report):
    path, html = report
    traces = sorted(p.name for p in (path.parent / "trace").iterdir())
    assert traces == ["rank-0.json", "rank-1.json"]
    assert 'href="trace/rank-1.json"' in html


def test_report_without_side_tasks_or_costs_still_renders(tmp_path):
    actions, bubbles, _, steps = fake_run()
    html = report_in(tmp_path, actions, bubbles, steps).read_text()
    assert len(PLOTLY_BANNER.findall(html)) == 1
    assert 'id="side-task-progress"' not in html
    assert pd.read_parquet(tmp_path / "side_task_steps.parquet").empty


def test_report_accepts_a_cost_saving_dataclass(tmp_path):
    from freeride_lab.core.accounting import cost_saving

    actions, bubbles, _, steps = fake_run()
    costs = cost_saving({"resnet18": 2000.0}, vanilla_s=10.0, freeride_s=10.1)
    html = report_in(tmp_path, actions, bubbles, steps, costs=costs).read_text()
    assert 'id="cost-saving"' in html
    assert percent(costs.saving_corrected_frac) in html


def test_bubble_table_splits_the_bubble_time_per_step_beside_the_fractions():
    _, bubbles, _, _ = fake_run()
    split = bubbles.assign(schedule_ms=6.0, peer_ms=3.0, host_ms=1.0)
    table = bubble_table(split, SUMMARY)
    assert list(table.columns[5:]) == [
        "schedule_ms_per_step",
        "peer_ms_per_step",
        "host_ms_per_step",
        "measured_frac",
        "theory_frac",
    ]
    parts = table[["schedule_ms_per_step", "peer_ms_per_step", "host_ms_per_step"]]
    assert list(parts.sum(axis=1)) == list(table["bubble_ms_per_step"])


def test_bubble_table_merges_measured_and_theory():
    _, bubbles, _, _ = fake_run()
    table = bubble_table(bubbles, SUMMARY)
    assert list(table.columns) == [
        "rank",
        "steps",
        "bubbles_per_step",
        "bubble_ms_per_step",
        "mean_bubble_ms",
        "measured_frac",
        "theory_frac",
    ]
    assert list(table["bubble_ms_per_step"]) == [10.0, 10.0]


def test_step_table_leaves_out_the_first_step():
    *_, steps = fake_run(steps=3)
    table = step_table(steps)
    assert list(table["steps"]) == [2, 2]
    assert list(table["p50_ms"]) == [21.5, 21.5]


def test_environment_info_reports_missing_nvml_without_raising():
    info = environment_info()
    assert info["python"]
    assert isinstance(info["nvml"], str)


@pytest.mark.browser
def test_report_renders_offline_in_chromium(report):
    import shutil

    from playwright.sync_api import sync_playwright

    path, _ = report
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    args = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=args)
        try:
            page = browser.new_page(viewport={"width": 1366, "height": 768})  # a laptop screen
            errors: list[str] = []
            remote: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: r.url.startswith("http") and remote.append(r.url))
            page.goto(path.as_uri())
            page.wait_for_selector("#cost-saving .main-svg", timeout=60_000)
            drawn = {
                div: page.locator(f"#{div} .main-svg").count()
                for div in ("timeline", "bubble-fractions", "side-task-progress", "cost-saving")
            }
            page_width = page.evaluate("document.documentElement.scrollWidth")
            headline = page.locator("#headline").bounding_box()
            timeline = page.locator("#timeline").bounding_box()
        finally:
            browser.close()
    assert (errors, remote) == ([], [])
    assert all(count > 0 for count in drawn.values()), drawn
    assert page_width <= 1366  # no horizontal scrolling
    assert headline is not None and timeline is not None
    assert headline["y"] + headline["height"] <= 768 and headline["y"] < timeline["y"]


def test_headline_leads_and_config_comes_last(report):
    _, html = report
    order = [html.index(f'id="{i}"') for i in ("headline", "timeline", "bubble-table", "config")]
    assert order == sorted(order)
    first_screen = html[order[0] : order[1]]
    assert "30% measured vs 33% theory" in first_screen  # mean over ranks
    assert "7% overhead-corrected (8% as published)" in first_screen


def test_numbers_are_written_for_people_with_units_in_headers(report):
    _, html = report
    bubbles = html[html.index('id="bubble-table"') :]
    bubbles = bubbles[: bubbles.index("</table>")]
    assert '<th scope="col">bubble per step (ms)</th>' in bubbles
    assert '<th scope="col">measured (%)</th>' in bubbles
    assert "<td>10</td>" in bubbles and "10.000" not in bubbles
    config = html[html.index('id="config-table"') :]
    assert "<td>stages</td><td>2</td>" in config


def test_overhead_headline_shows_its_95_percent_interval(tmp_path):
    from freeride_lab.ui.report import overheads

    actions, bubbles, side, steps = fake_run(steps=8)
    side = side[side["step"].isin([2, 4, 6])]
    numbers = overheads(steps, side)
    assert numbers["training_overhead_lo_frac"] < numbers["training_overhead_mean_frac"]
    html = report_in(
        tmp_path, actions, bubbles, steps, summary=SUMMARY, side_task_steps=side, overheads=numbers
    ).read_text()
    overhead = html[html.index('id="headline-overhead"') :]
    assert "[95% interval " in overhead[: overhead.index("</div>")]


def test_failed_side_tasks_are_listed_with_their_error(tmp_path):
    actions, bubbles, side, steps = fake_run()
    tasks = [
        {"id": "t1", "name": "fine", "stage": 0, "state": "RUNNING", "error": ""},
        {"id": "t2", "name": EVIL, "stage": 1, "state": "FAILED", "error": "boom <b>x</b>"},
    ]
    html = report_in(
        tmp_path, actions, bubbles, steps, config={}, side_task_steps=side, tasks=tasks
    ).read_text()
    failed = html[html.index('id="failed-side-tasks-table"') :]
    failed = failed[: failed.index("</table>")]
    assert "boom &lt;b&gt;x&lt;/b&gt;" in failed and "t2" in failed and "t1" not in failed
    assert "1 side task failed" in html[: html.index('id="timeline"')]


def test_a_long_run_draws_a_bounded_window_and_stays_small(tmp_path):
    actions, bubbles, side, steps = fake_run(ranks=8, steps=600)
    path = report_in(
        tmp_path,
        actions,
        bubbles,
        steps,
        config={"stages": 4},
        summary=SUMMARY,
        side_task_steps=side,
        timeline_steps=5000,
    )
    assert path.stat().st_size <= 1_500_000
    assert "of 600 drawn" in path.read_text()


def test_timeline_window_caps_bars_per_rank_and_leaves_out_tiny_gaps():
    from freeride_lab.ui.report_figures import timeline_window

    actions, bubbles, side, _ = fake_run(ranks=2, steps=50)
    bubbles.loc[bubbles["step"] == 49, "duration_ms"] = 0.01
    window = timeline_window(
        actions, bubbles, side, last_steps=20, max_bars_per_rank=12, min_bubble_ms=0.05
    )
    # F, B, bubble and side-task step: 4 bars per rank and step, 3 in step 49 (its bubble is
    # too short to draw): 3 + 4 + 4 <= 12 < 3 + 4 + 4 + 4
    assert window.steps == [47, 48, 49]
    assert window.total_steps == 50 and window.hidden_bubbles == 2
    assert (window.bubbles["duration_ms"] >= 0.05).all()
    one = timeline_window(actions, bubbles, side, last_steps=20, max_bars_per_rank=1)
    assert one.steps == [49]  # at least one step, whatever the cap


def test_timeline_window_refuses_a_cap_below_one():
    from freeride_lab.ui.report_figures import timeline_window

    actions, bubbles, side, _ = fake_run()
    with pytest.raises(ValueError, match=r"max_bars_per_rank=0 must be >= 1"):
        timeline_window(actions, bubbles, side, max_bars_per_rank=0)
