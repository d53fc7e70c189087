"""The report's cost saving: numbers for built-ins and for custom tasks that declare their
reference throughput; "not available for custom tasks" only for custom tasks that declare none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("plotly", reason="the notebook UI packages are not installed")

from fake_session import FakeSession

from freeride_lab.core.accounting import FREERIDE_REFERENCE_THROUGHPUT_PER_S, CostModel
from freeride_lab.ui.report import write_session_report

NOT_AVAILABLE = "not available for custom tasks"


class DeclaringSession(FakeSession):
    """A session whose cost model carries the reference throughputs its tasks declared."""

    def __init__(self, declared: dict[str, float], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.declared = declared

    def cost_model(self) -> CostModel:
        return CostModel(
            reference_throughput_per_s={**FREERIDE_REFERENCE_THROUGHPUT_PER_S, **self.declared}
        )


def cost_section(session: FakeSession, tmp_path: Path) -> str:
    html = write_session_report(session, tmp_path / "report.html").read_text()
    start = html.index('id="headline-cost"')
    return html[start : html.index("</div>", start)] + html[html.index('id="costs"') :]


def run_with(session: FakeSession, *tasks: str) -> FakeSession:
    for stage, task in enumerate(tasks):
        session.attach(task, stage=stage)
    session.advance(4)
    return session


def test_a_custom_task_that_declares_its_throughput_gets_cost_numbers(tmp_path: Path) -> None:
    session = run_with(DeclaringSession({"Custom": 50.0}), "pagerank", "pkg.mod:Custom")
    shown = cost_section(session, tmp_path)
    assert "4% overhead-corrected (5% as published)" in shown
    assert NOT_AVAILABLE not in shown


def test_a_custom_task_without_a_throughput_is_named_as_the_reason(tmp_path: Path) -> None:
    session = run_with(DeclaringSession({}), "pagerank", "pkg.mod:Custom")
    shown = cost_section(session, tmp_path)
    assert f"{NOT_AVAILABLE} without a reference throughput: Custom" in shown
    assert "reference_throughput" in shown
    assert "overhead-corrected (" not in shown


def test_built_in_tasks_alone_get_cost_numbers(tmp_path: Path) -> None:
    shown = cost_section(run_with(FakeSession(), "pagerank", "sgd_mf"), tmp_path)
    assert "4% overhead-corrected (5% as published)" in shown
    assert NOT_AVAILABLE not in shown
