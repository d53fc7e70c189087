"""Claims about damaged run directories: ``Session.open``, ``freeride-lab status``,
``freeride-lab report`` and the dashboard work on what is left, each damaged event file gives
one warning naming it (with the count and the first bad line), and a damaged run.json is one
clear error naming it (see [Note: damaged run directories] in ``lab/session.py``).

One real run (two sleep-timed ranks, three steps) finishes once for the module; each test
copies its directory and damages the copy.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from runs import synthetic_config

from freeride_lab import cli
from freeride_lab.core.runtime_options import RuntimeOptions
from freeride_lab.lab.session import Session
from freeride_lab.pipeline.launcher import RunState

pytestmark = pytest.mark.slow  # reads damaged copies of whole runs

STARTUP_S = 240.0  # a fresh run on a loaded two-core box
CONFIG = synthetic_config(steps=3, microbatches=2, phase_ms=5.0, runtime=RuntimeOptions())
RANK_0 = "events/rank-0.jsonl"


@dataclass(frozen=True)
class Source:
    """The finished run every test copies, with its tables' sizes."""

    path: Path
    sizes: Mapping[str, int]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Source:
    path = tmp_path_factory.mktemp("damaged") / "source"
    with Session.launch(CONFIG, run_dir=path, grace_s=3) as session:
        assert session.wait(timeout_s=STARTUP_S) == RunState.FINISHED
        sizes = {"actions": len(session.actions), "steps": len(session.steps)}
    assert sizes["steps"] == 6 and sizes["actions"] > 0
    return Source(path, sizes)


# -- damage --------------------------------------------------------------------------------------


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")[:-1]


def write_lines(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(line + b"\n" for line in lines))


def first_of(run: Path, kind: str) -> int:
    """Index (from 0) of the first ``kind`` event in rank 0's file."""
    return next(
        i for i, line in enumerate(lines_of(run / RANK_0)) if json.loads(line)["kind"] == kind
    )


def rewrite_first(kind: str, rewrite: Callable[[bytes], bytes]) -> Callable[[Path], int]:
    """Damage: ``rewrite`` the line of the first ``kind`` event of rank 0; its line number."""

    def damage(run: Path) -> int:
        path = run / RANK_0
        lines = lines_of(path)
        i = first_of(run, kind)
        lines[i] = rewrite(lines[i])
        write_lines(path, lines)
        return i + 1

    return damage


def change_first(kind: str, change: Callable[[dict[str, Any]], Any]) -> Callable[[Path], int]:
    """Damage: change the first ``kind`` event of rank 0 (still JSON); its line number."""

    def changed(line: bytes) -> bytes:
        event = json.loads(line)
        change(event)
        return json.dumps(event).encode()

    return rewrite_first(kind, changed)


def replace_first(kind: str, text: bytes) -> Callable[[Path], int]:
    """Damage: put ``text`` in place of the first ``kind`` event of rank 0; its line number."""
    return rewrite_first(kind, lambda _line: text)


def insert(at: int, text: bytes) -> Callable[[Path], int]:
    """Damage: insert a line ``text`` as line ``at`` of rank 0's file."""

    def damage(run: Path) -> int:
        path = run / RANK_0
        lines = lines_of(path)
        write_lines(path, [*lines[: at - 1], text, *lines[at - 1 :]])
        return at

    return damage


def truncate_last_line(run: Path) -> int:
    path = run / RANK_0
    data = path.read_bytes()
    path.write_bytes(data[:-20])  # its newline and the end of the last event
    return len(lines_of(path)) + 1


def garbage_in_three_places(run: Path) -> int:
    path = run / RANK_0
    lines = lines_of(path)
    for at in (len(lines), 9, 4):
        lines.insert(at, b"this is not an event")
    write_lines(path, lines)
    return 5


def set_step_text(value: bytes) -> Callable[[Path], int]:
    """Damage: write ``value`` as it is (e.g. ``1e400``) as the step of rank 0's first memory
    report."""

    def damage(run: Path) -> int:
        path = run / RANK_0
        lines = lines_of(path)
        i = first_of(run, "memory")
        event = json.loads(lines[i])
        lines[i] = lines[i].replace(b'"step":%d' % event["step"], b'"step":' + value, 1)
        assert lines[i] != json.dumps(event).encode()
        write_lines(path, lines)
        return i + 1

    return damage


@dataclass(frozen=True)
class Case:
    """One damage to rank 0's event file: it returns the first bad line's number."""

    damage: Callable[[Path], int]
    bad: int = 1  # lines skipped
    lost: Mapping[str, int] = field(default_factory=dict)  # rows each table loses


def set_in(kind: str, **values: Any) -> Callable[[Path], int]:
    return change_first(kind, lambda e: e.update(values))


def drop(kind: str, key: str) -> Callable[[Path], int]:
    return change_first(kind, lambda e: e.pop(key))


BINARY = bytes(b for b in range(256) if b != ord("\n"))
ONE_ACTION, ONE_STEP = {"actions": 1}, {"steps": 1}
EVENT_CASES: dict[str, Case] = {
    "truncated last line": Case(truncate_last_line),
    "garbage text in three places": Case(garbage_in_three_places, bad=3),
    "binary junk": Case(insert(3, BINARY)),
    "a JSON list": Case(insert(2, b"[1, 2, 3]")),
    "JSON nested too deep to decode": Case(insert(2, b"[" * 100_000)),
    "a step's rank is 'zero'": Case(set_in("step", rank="zero"), lost=ONE_STEP),
    "a step's step is -1": Case(set_in("step", step=-1), lost=ONE_STEP),
    "a step's event cut in half": Case(replace_first("step", b'{"kind":"step","ra'), lost=ONE_STEP),
    "an action's step is null": Case(set_in("action", step=None), lost=ONE_ACTION),
    "an action's step is true": Case(set_in("action", step=True), lost=ONE_ACTION),
    "an action's end is beyond int64": Case(set_in("action", end_ns=10**30), lost=ONE_ACTION),
    "an action without its start": Case(drop("action", "start_ns"), lost=ONE_ACTION),
    "an event without a kind": Case(drop("action", "kind"), lost=ONE_ACTION),
    "a memory report's step is 1e400": Case(set_step_text(b"1e400")),
    "the rank's world size is 'two'": Case(set_in("rank_started", world_size="two")),
}


def damaged(source: Source, tmp_path: Path, damage: Callable[[Path], Any]) -> tuple[Path, Any]:
    run = tmp_path / "run"
    shutil.copytree(source.path, run)
    return run, damage(run)


def warnings_about(caplog: pytest.LogCaptureFixture, path: Path) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and str(path) in r.getMessage()
    ]


# -- damaged event files -------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(EVENT_CASES))
def test_open_reads_what_is_left_of_a_damaged_event_file_and_warns_once_naming_the_line(
    source: Source, tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    case = EVENT_CASES[name]
    run, line = damaged(source, tmp_path, case.damage)
    with caplog.at_level(logging.WARNING):
        session = Session.open(run)
        assert session.state == RunState.FINISHED
        assert len(session.actions) == source.sizes["actions"] - case.lost.get("actions", 0)
        assert len(session.steps) == source.sizes["steps"] - case.lost.get("steps", 0)
        assert len(session.bubbles) > 0 and list(session.summary()["rank"]) == [0, 1]
        assert session.bad_lines == {"rank-0.jsonl": case.bad}
    (warning,) = warnings_about(caplog, run / RANK_0)
    assert f"skipped {case.bad} line(s)" in warning and f"first at line {line} (" in warning


@pytest.mark.parametrize("name", list(EVENT_CASES))
def test_status_and_report_commands_work_on_a_damaged_event_file(
    source: Source, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    run, _ = damaged(source, tmp_path, EVENT_CASES[name].damage)
    assert cli.main(["status", str(run)]) == 0
    assert ": finished, step 3/3" in capsys.readouterr().out
    report = tmp_path / "report" / "report.html"
    assert cli.main(["report", str(run), str(report)]) == 0
    assert report.is_file() and (report.parent / "steps.parquet").is_file()


@pytest.mark.parametrize("name", list(EVENT_CASES))
def test_the_dashboard_draws_a_damaged_run(source: Source, tmp_path: Path, name: str) -> None:
    run, _ = damaged(source, tmp_path, EVENT_CASES[name].damage)
    session = Session.open(run)
    pytest.importorskip("anywidget", reason="the notebook UI packages are not installed")
    from freeride_lab.ui.dashboard import Dashboard, html_summary

    dashboard = Dashboard(session, tasks_dir=tmp_path / "tasks", busy_frac=1.0)
    try:
        dashboard.widget  # noqa: B018 - built, not started: the test ticks it itself
        assert dashboard.tick() is True  # the run is over: this tick drew its final state
        assert "finished" in html_summary(session)
    finally:
        dashboard.stop()


def test_an_empty_event_file_gives_a_run_without_that_ranks_events(
    source: Source, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run, _ = damaged(source, tmp_path, lambda r: (r / RANK_0).write_bytes(b""))
    with caplog.at_level(logging.WARNING):
        session = Session.open(run)
        assert session.state == RunState.FINISHED
        assert set(session.steps["rank"]) == {1} and session.steps_done == 0
        assert session.bad_lines == {}
    assert warnings_about(caplog, run) == []


def test_a_run_without_its_events_folder_opens_with_empty_tables_and_one_warning(
    source: Source, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run, _ = damaged(source, tmp_path, lambda r: shutil.rmtree(r / "events"))
    with caplog.at_level(logging.WARNING):
        session = Session.open(run)
        assert session.state == RunState.FINISHED
        assert session.actions.empty and session.bubbles.empty and session.steps_done == 0
    (warning,) = warnings_about(caplog, run / "events")
    assert "is missing" in warning
    assert cli.main(["status", str(run)]) == 0


def test_an_event_file_that_cannot_be_read_is_named_once_and_the_rest_is_read(
    source: Source, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def make_a_directory(run: Path) -> None:
        (run / RANK_0).unlink()
        (run / RANK_0).mkdir()

    run, _ = damaged(source, tmp_path, make_a_directory)
    with caplog.at_level(logging.WARNING):
        session = Session.open(run)
        assert set(session.steps["rank"]) == {1}
        session.steps  # noqa: B018 - read again: no second warning
    (warning,) = warnings_about(caplog, run / RANK_0)
    assert "cannot read it" in warning


# -- damaged status.json -------------------------------------------------------------------------

STATUS_CASES: dict[str, Callable[[Path], None]] = {
    "missing": lambda run: (run / "status.json").unlink(),
    "not JSON": lambda run: (run / "status.json").write_text('{"state": "fini'),
    "a list": lambda run: (run / "status.json").write_text('["finished"]'),
    "fields of the wrong type": lambda run: (run / "status.json").write_text(
        json.dumps({"state": 5, "launcher_pid": "abc", "failed_rank": "x", "reason": ["?"]})
    ),
}


@pytest.mark.parametrize("name", list(STATUS_CASES))
def test_a_run_with_a_damaged_status_is_judged_from_its_events(
    source: Source, tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    run, _ = damaged(source, tmp_path, STATUS_CASES[name])
    with caplog.at_level(logging.WARNING):
        session = Session.open(run)
        assert (session.state, session.steps_done, session.failure) == (RunState.FINISHED, 3, None)
        assert session.wait(timeout_s=10) == RunState.FINISHED
    expected = 0 if name == "missing" else 1  # a missing status is no damage
    assert len(warnings_about(caplog, run / "status.json")) == expected


@pytest.mark.parametrize("name", list(STATUS_CASES))
def test_status_and_report_commands_work_with_a_damaged_status(
    source: Source, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    run, _ = damaged(source, tmp_path, STATUS_CASES[name])
    assert cli.main(["status", str(run)]) == 0
    assert ": finished, step 3/3" in capsys.readouterr().out
    assert cli.main(["list", "--root", str(tmp_path)]) == 0
    assert str(run) in capsys.readouterr().out  # "gone": list reads no events, only the status
    report = tmp_path / "report.html"
    assert cli.main(["report", str(run), str(report)]) == 0
    assert report.is_file()


def test_a_status_without_a_final_word_and_a_rank_that_never_finished_is_failed(
    source: Source, tmp_path: Path
) -> None:
    def lose_the_end(run: Path) -> None:
        (run / "status.json").unlink()
        path = run / RANK_0
        write_lines(path, [x for x in lines_of(path) if b'"rank_finished"' not in x])

    run, _ = damaged(source, tmp_path, lose_the_end)
    session = Session.open(run)
    assert session.state == RunState.FAILED
    assert session.failure is not None
    assert session.failure.reason.endswith("without a final status; rank 0 never said it finished")


# -- damaged run.json: one clear error naming it ---------------------------------------------------


def rewrite_run(change: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        data = json.loads((run / "run.json").read_text())
        change(data)
        (run / "run.json").write_text(json.dumps(data))

    return damage


def write_run(data: bytes) -> Callable[[Path], None]:
    return lambda run: (run / "run.json").write_bytes(data) and None


NOT_JSON, NO_CONFIG = "cannot be read as JSON", "holds no 'config'"
RUN_JSON_CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "not JSON": (write_run(b'{"config": {'), NOT_JSON),
    "binary junk": (write_run(BINARY), NOT_JSON),
    "empty": (write_run(b""), NOT_JSON),
    "a list": (write_run(b"[]"), "holds a JSON list"),
    "no config": (rewrite_run(lambda d: d.pop("config")), NO_CONFIG),
    "config of the wrong type": (rewrite_run(lambda d: d.update(config="1F1B")), NO_CONFIG),
    "config with a bad value": (
        rewrite_run(lambda d: d["config"].update(stages="two")),
        "is not a valid RunConfig",
    ),
}


@pytest.mark.parametrize("name", list(RUN_JSON_CASES))
def test_a_damaged_run_json_is_one_error_naming_the_file(
    source: Source, tmp_path: Path, name: str
) -> None:
    damage, why = RUN_JSON_CASES[name]
    run, _ = damaged(source, tmp_path, damage)
    with pytest.raises(ValueError, match="run's config is unknown") as raised:
        Session.open(run)
    message = str(raised.value)
    assert str(run / "run.json") in message and why in message
    assert "read_events" in message  # the way to what is still readable


@pytest.mark.parametrize("name", list(RUN_JSON_CASES))
def test_status_of_a_run_with_a_damaged_run_json_is_one_line_naming_the_file(
    source: Source, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    run, _ = damaged(source, tmp_path, RUN_JSON_CASES[name][0])
    assert cli.main(["status", str(run)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(run / "run.json") in err
    assert cli.main(["list", "--root", str(tmp_path)]) == 0
    assert str(run) in capsys.readouterr().out  # listed all the same ("damaged" if unreadable)


def test_run_json_fields_of_the_wrong_type_are_ignored_with_one_warning(
    source: Source, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    damage = rewrite_run(lambda d: d.update(run_id=7, grace_s="long", mps="on", detached="no"))
    run, _ = damaged(source, tmp_path, damage)
    with caplog.at_level(logging.WARNING):
        session = Session.open(run)
        assert (session.run_id, session.grace_s) == (run.name, 10.0)
        assert session.state == RunState.FINISHED and not session.mps_active
    (warning,) = warnings_about(caplog, run / "run.json")
    assert "grace_s='long'" in warning and "they are ignored" in warning
    assert cli.main(["status", str(run)]) == 0
