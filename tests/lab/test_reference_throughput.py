"""A custom side task's declared ``reference_throughput`` is read when it is attached: kept with
its record (so a reopened run's cost model has it), refused with one clear message when bad."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from freeride_lab.lab.task_requests import check_task as _check_task
from freeride_lab.lab.taskbook import TaskRecord

TASK = """
from freeride_lab.sidetasks.api import IterativeSideTask


class Declared(IterativeSideTask):
    unit = "images"
    reference_throughput = 7.5

    def step(self):
        return 1.0


class Undeclared(IterativeSideTask):
    def step(self):
        return 1.0


class Negative(IterativeSideTask):
    reference_throughput = -2.0


class Text(IterativeSideTask):
    reference_throughput = "fast"
"""


@pytest.fixture
def tasks(tmp_path: Path) -> Path:
    path = tmp_path / "my_tasks.py"
    path.write_text(textwrap.dedent(TASK))
    return path


def test_a_declared_reference_throughput_is_read_from_the_class(tasks: Path) -> None:
    _, name, unit, theta = _check_task(f"{tasks}:Declared")
    assert (name, unit, theta) == ("Declared", "images", 7.5)
    assert _check_task(f"{tasks}:Undeclared")[3] is None
    assert _check_task("pagerank")[3] is None  # built-ins use FreeRide's own table


@pytest.mark.parametrize(("cls", "shown"), [("Negative", "-2.0"), ("Text", "'fast'")])
def test_a_bad_reference_throughput_is_refused_with_the_rule(
    tasks: Path, cls: str, shown: str
) -> None:
    with pytest.raises(ValueError, match=rf"{cls}.reference_throughput={shown} must be a finite"):
        _check_task(f"{tasks}:{cls}")


def test_the_task_record_keeps_it_and_reads_records_written_without_it() -> None:
    record = TaskRecord(id="t1", task="x.py:C", name="C", rank=0, stage=0, reference_throughput=3.0)
    assert TaskRecord.from_dict(record.__dict__).reference_throughput == 3.0
    old = {k: v for k, v in record.__dict__.items() if k != "reference_throughput"}
    assert TaskRecord.from_dict(old).reference_throughput is None
