"""The ``%freeride`` and ``%%freeride_task`` magics in a real IPython shell.

Parsing, errors and the extension's life cycle use ``FakeSession`` or no session at all; the
claims about acting on a run share one small real CPU run (``live``: two sleep-timed ranks,
launched through the magic) for the whole module, and the last of them stops it.

Over 500 lines: the claims share one real IPython shell and one small real run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

for _ui_package in ("IPython", "plotly", "anywidget"):
    pytest.importorskip(_ui_package, reason="the notebook UI packages are not installed")
from fake_session import FakeSession  # noqa: E402
from IPython.core.completer import provisionalcompleter  # noqa: E402
from IPython.core.error import UsageError  # noqa: E402
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402
from IPython.utils.capture import capture_output  # noqa: E402
from waits import wait_until  # noqa: E402

from freeride_lab.magics import FreerideMagics, _parser  # noqa: E402
from freeride_lab.ui.dashboard import dashboard_for, mimebundle, user_tasks  # noqa: E402

LAUNCH = (
    "launch --schedule 1F1B --stages 2 --microbatches 4 --steps 3000 --workload synthetic "
    "--t-forward-ms 10 --t-backward-input-ms 10 --t-backward-weight-ms 10 --grace-s 5"
)
STARTUP_S = 240.0  # first step of a fresh run on a loaded two-core box
PROGRESS_S = 180.0  # a side task's first steps: its process starts and imports torch

COUNTER_CELL = textwrap.dedent(
    """
    from freeride_lab import IterativeSideTask

    class Counter(IterativeSideTask):
        unit = "ticks"

        def step(self):
            total = 0
            for i in range(2000):
                total += i
            return 1.0
    """
)


@pytest.fixture(scope="module")
def shell() -> InteractiveShell:
    return InteractiveShell.instance()


@pytest.fixture
def ip(shell: InteractiveShell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The shell with the extension loaded, working in a fresh directory; unloaded after."""
    monkeypatch.chdir(tmp_path)
    shell.user_ns.pop("session", None)
    shell.run_line_magic("load_ext", "freeride_lab")
    yield shell
    shell.run_line_magic("unload_ext", "freeride_lab")
    shell.user_ns.pop("session", None)


def magics(shell: InteractiveShell) -> FreerideMagics:
    found = shell.magics_manager.registry[FreerideMagics.__name__]
    assert isinstance(found, FreerideMagics)
    return found


def run(shell: InteractiveShell, source: str) -> Any:
    return shell.run_cell(source, store_history=False)


# -- loading -------------------------------------------------------------------------------------


def test_loading_imports_no_torch_and_starts_no_thread():
    code = (
        "import sys, threading\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "ip = InteractiveShell.instance()\n"
        "before = threading.active_count()\n"
        "ip.run_line_magic('load_ext', 'freeride_lab')\n"
        "assert 'freeride' in ip.magics_manager.magics['line']\n"
        "print('torch' in sys.modules, threading.active_count() - before)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == ["False", "0"]


def test_help_of_the_magic_is_written_for_the_notebook(ip):
    doc = ip.find_line_magic("freeride").__doc__
    for command in ("launch", "attach", "tune", "detach", "stop", "report", "list", "status"):
        assert f"%freeride {command}" in doc
    assert "RUN_DIR may be left out" in doc
    example = "%freeride launch --stages 4 --microbatches 8 --steps 500 --workload synthetic"
    assert example in doc and "%freeride attach pagerank --stage 1" in doc
    assert "%freeride report\n" in doc  # the example report needs no path
    # optional arguments are not shown as required, and it is not the CLI's usage text
    assert "%freeride attach [RUN_DIR] TASK [--options]" in doc
    assert "%freeride report [RUN_DIR] [PATH]" in doc
    assert "usage:" not in doc and "RUN_DIR TASK" not in doc


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        # ``?`` and the bare magic show the notebook help
        ("%freeride?", ["Example session:", "%%freeride_task NAME"]),
        ("%freeride", ["Example session:", "%freeride attach [RUN_DIR] TASK"]),
        # a subcommand's help shows what may be left out
        (
            "%freeride report --help",
            [
                "usage: %freeride report [-h] [RUN_DIR] [PATH]",
                "default: the run this kernel launched",
            ],
        ),
        ("%freeride attach --help", ["--budget-ms"]),
    ],
)
def test_help_is_printed_without_ending_the_kernel(ip, capsys, line, shown):
    assert run(ip, line).success
    out = capsys.readouterr().out
    assert [text for text in shown if text not in out] == []


# -- Tab completion ------------------------------------------------------------------------------


def completions(shell: InteractiveShell, line: str) -> list[str]:
    """What Tab offers at the end of ``line``, through IPython's own completer."""
    with provisionalcompleter():
        return [c.text for c in shell.Completer.completions(line, len(line))]


def test_tab_completes_subcommands(ip):
    offered = completions(ip, "%freeride ")
    assert {"launch", "attach", "status", "report", "stop", "tune", "detach"} <= set(offered)
    assert completions(ip, "%freeride at") == ["attach"]
    assert completions(ip, "%freeride re") == ["report"]


def test_tab_completes_task_names_after_attach(ip):
    assert run(ip, f"%%freeride_task counter\n{COUNTER_CELL}").success
    offered = completions(ip, "%freeride attach ")
    assert {"pagerank", "resnet18", "sgd_mf", "counter"} <= set(offered)
    assert completions(ip, "%freeride attach pag") == ["pagerank"]
    assert completions(ip, "%freeride attach res") == ["resnet18", "resnet50"]


def test_tab_completes_task_names_after_an_explicit_run_directory(ip, tmp_path):
    other = tmp_path / "other-run"
    other.mkdir()
    (other / "run.json").write_text("{}")
    assert completions(ip, f"%freeride attach {other} pag") == ["pagerank"]


def test_tab_completes_the_options_of_the_subcommand(ip):
    assert completions(ip, "%freeride attach pagerank --bud") == ["--budget-ms"]
    offered = completions(ip, "%freeride launch --")
    assert {"--stages", "--schedule", "--steps", "--workload"} <= set(offered)
    assert "--budget-ms" not in offered
    given = completions(ip, "%freeride launch --stages 2 --st")
    assert "--steps" in given and "--stages" not in given  # given once, not offered again


def test_tab_completes_option_values_with_a_fixed_set(ip):
    assert "Interleaved1F1B" in completions(ip, "%freeride launch --schedule ")
    assert completions(ip, "%freeride launch --workload s") == ["synthetic"]
    assert completions(ip, "%freeride attach pagerank --policy SH") == ["SHRINK_BUDGET"]


def test_tab_completes_the_current_runs_task_ids(ip, fake):
    first, second = fake.attach("pagerank", stage=0), fake.attach("resnet18", stage=1)
    assert completions(ip, "%freeride tune ") == sorted([first["id"], second["id"]])
    assert completions(ip, "%freeride detach ") == sorted([first["id"], second["id"]])
    assert completions(ip, "%freeride checkpoint ") == sorted([first["id"], second["id"]])
    after_the_id = completions(ip, f"%freeride tune {first['id']} ")
    assert not {first["id"], second["id"]} & set(after_the_id)  # only one TASK_ID


def test_tab_elsewhere_is_left_to_ipython(ip):
    ip.user_ns["freeride_value"] = 1
    assert "freeride_value" in completions(ip, "freeride_va")
    assert "print" in completions(ip, "pri")


def test_unload_removes_the_completion(shell, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shell.run_line_magic("load_ext", "freeride_lab")
    shell.run_line_magic("reload_ext", "freeride_lab")
    assert completions(shell, "%freeride at") == ["attach"]  # one matcher after a reload
    shell.run_line_magic("unload_ext", "freeride_lab")
    assert "attach" not in completions(shell, "%freeride at")


# -- errors are one line -------------------------------------------------------------------------


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def test_a_typo_in_the_subcommand_says_which_was_meant(ip, capsys):
    result = run(ip, "%freeride stauts")
    assert isinstance(result.error_in_exec, UsageError)
    assert "did you mean 'status'?" in one_line_error(capsys)


def test_a_typo_in_an_option_says_which_was_meant(ip, fake, capsys):
    result = run(ip, "%freeride attach pagerank --stage 1 --budgetms 50")
    assert isinstance(result.error_in_exec, UsageError)
    err = one_line_error(capsys)
    assert "unrecognized arguments: --budgetms 50" in err and "did you mean '--budget-ms'?" in err
    assert fake.calls == []


def test_a_typo_in_the_task_name_says_which_was_meant(ip, fake, capsys):
    result = run(ip, "%freeride attach pagernak --stage 1")
    assert isinstance(result.error_in_exec, UsageError)
    err = one_line_error(capsys)
    assert "unknown side task 'pagernak'; did you mean 'pagerank'?" in err
    assert fake.calls == []


def test_a_typo_in_a_cell_task_name_says_which_was_meant(ip, fake, capsys):
    assert run(ip, f"%%freeride_task counter\n{COUNTER_CELL}").success
    capsys.readouterr()
    result = run(ip, "%freeride attach countr --stage 0")
    assert isinstance(result.error_in_exec, UsageError)
    assert "did you mean 'counter'?" in one_line_error(capsys)


def test_task_names_nothing_is_close_to_reach_the_session(ip, fake):
    assert run(ip, "%freeride attach mypkg.tasks:Mine --stage 0").success
    assert fake.calls[-1][1] == "mypkg.tasks:Mine"


def test_unknown_subcommand_is_one_usage_error_line(ip, capsys):
    result = run(ip, "%freeride bogus")
    assert isinstance(result.error_in_exec, UsageError)
    err = capsys.readouterr().err
    assert "invalid choice: 'bogus'" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_bad_option_value_is_a_usage_error(ip, capsys):
    result = run(ip, "%freeride launch --stages four")
    assert isinstance(result.error_in_exec, UsageError)
    assert "invalid int value: 'four'" in capsys.readouterr().err


def test_unbalanced_quote_is_a_usage_error(ip):
    result = run(ip, '%freeride attach "pagerank')
    assert isinstance(result.error_in_exec, UsageError)


def test_commands_on_a_run_say_how_to_start_one(ip, capsys):
    result = run(ip, "%freeride attach pagerank --stage 1")
    assert isinstance(result.error_in_exec, UsageError)
    assert "no run in this kernel yet" in capsys.readouterr().err


def test_invalid_config_is_refused_before_anything_starts(ip, capsys, tmp_path):
    result = run(ip, "%freeride launch --schedule 1F2B --stages 2")
    assert isinstance(result.error_in_exec, UsageError)
    assert "'1F2B'" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("value", ["-1", "nan"])
def test_a_bad_min_bubble_is_refused_before_anything_starts(ip, capsys, tmp_path, value):
    result = run(ip, f"%freeride run --stages 2 --min-bubble-ms {value}")
    assert isinstance(result.error_in_exec, UsageError)
    assert "--min-bubble-ms" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


# -- the current run -----------------------------------------------------------------------------


@pytest.fixture
def fake(ip, tmp_path) -> FakeSession:
    session = FakeSession(run_dir=tmp_path / "fake-run")
    session.advance(2)
    magics(ip).session = session
    return session


def test_attach_acts_on_the_current_session_with_cli_options(ip, fake):
    line = "%freeride attach pagerank --stage 1 --budget-ms 50 --sm 30 --option n_nodes=2000"
    assert run(ip, line).success
    assert fake.calls[-1] == ("attach", "pagerank", 1, None, 30.0, 1, 50.0, {"n_nodes": 2000})
    assert ip.user_ns["session"] is fake


def test_an_explicit_run_directory_is_not_replaced(ip, fake, tmp_path):
    other = tmp_path / "other-run"
    other.mkdir()
    (other / "run.json").write_text("{}")
    argv = magics(ip)._with_run_dir(["status", str(other)], _parser())
    assert argv == ["status", str(other)]


def test_session_refusal_is_one_usage_error_line(ip, fake, capsys):
    result = run(ip, "%freeride attach pagerank --stage 1 --memory 99000000000")
    assert isinstance(result.error_in_exec, UsageError)
    err = capsys.readouterr().err
    assert "attach: memory=99000000000" in err and "Traceback" not in err
    assert fake.tasks == []


def test_tune_without_a_limit_is_refused(ip, fake):
    task = fake.attach("pagerank", stage=0)
    result = run(ip, f"%freeride tune {task['id']}")
    assert isinstance(result.error_in_exec, UsageError)
    assert "nothing to change" in str(result.error_in_exec)


def test_tune_and_detach_reach_the_session(ip, fake, capsys):
    task = fake.attach("pagerank", stage=0)
    assert run(ip, f"%freeride tune {task['id']} --budget-ms 25 --priority 0").success
    assert fake.tasks[0]["budget_ms"] == 25 and fake.tasks[0]["priority"] == 0
    assert run(ip, f"%freeride detach {task['id']}").success
    assert fake.tasks == []
    assert f"detached {task['id']}" in capsys.readouterr().out


def test_checkpoint_reaches_the_current_session(ip, fake, capsys):
    task = fake.attach("pagerank", stage=0)
    result = run(ip, f"%freeride checkpoint {task['id']}")
    assert isinstance(result.error_in_exec, UsageError)  # its process is not started yet
    assert "checkpoint: could not checkpoint" in str(result.error_in_exec)
    fake.advance()
    assert run(ip, f"%freeride checkpoint {task['id']}").success
    assert fake.calls[-1] == ("checkpoint", task["id"])
    assert f"saved the state of {task['id']} (pagerank) at 10 iterations" in capsys.readouterr().out


def test_status_lists_the_side_tasks(ip, fake, capsys):
    fake.attach("pagerank", stage=1)
    assert run(ip, "%freeride status").success
    out = capsys.readouterr().out
    assert "step 2/10" in out and "t1  pagerank  stage 1" in out


def test_report_without_a_path_writes_beside_the_notebook_and_links_it(ip, fake, tmp_path):
    with capture_output() as captured:
        result = run(ip, "%freeride report")
    assert result.success, result.error_in_exec
    (written,) = tmp_path.glob("freeride-report-fake-run-*/report.html")  # named by the run
    assert (written.parent / "summary.json").is_file()  # the tables go in its folder
    links = [o.data["text/html"] for o in captured.outputs if "text/html" in o.data]
    assert len(links) == 1 and f"href='{written.relative_to(tmp_path)}'" in links[0]


def test_report_to_a_path_links_that_path(ip, fake, tmp_path):
    with capture_output() as captured:
        assert run(ip, "%freeride report out/run.html").success
    assert (tmp_path / "out" / "run.html").is_file()
    links = [o.data["text/html"] for o in captured.outputs if "text/html" in o.data]
    assert len(links) == 1 and "href='out/run.html'" in links[0]


# -- %%freeride_task -----------------------------------------------------------------------------


def test_cell_task_is_written_checked_and_registered(ip, tmp_path, capsys):
    assert run(ip, f"%%freeride_task counter\n{COUNTER_CELL}").success
    task = user_tasks(tmp_path / ".freeride_tasks")["counter"]
    assert task.ref == f"{tmp_path / '.freeride_tasks' / 'counter.py'}:Counter"
    assert task.unit == "ticks"
    assert ip.user_ns["Counter"]().step() == 1.0
    assert "attach it with `%freeride attach counter" in capsys.readouterr().out


def test_attach_by_cell_task_name_passes_its_file_reference(ip, fake, tmp_path):
    assert run(ip, f"%%freeride_task counter\n{COUNTER_CELL}").success
    assert run(ip, "%freeride attach counter --stage 0").success
    assert fake.calls[-1][1] == f"{tmp_path / '.freeride_tasks' / 'counter.py'}:Counter"


def test_rerun_cell_task_picks_up_the_new_code(ip, tmp_path):
    assert run(ip, f"%%freeride_task counter\n{COUNTER_CELL}").success
    changed = COUNTER_CELL.replace('unit = "ticks"', 'unit = "tocks"')
    assert run(ip, f"%%freeride_task counter\n{changed}").success
    assert user_tasks(tmp_path / ".freeride_tasks")["counter"].unit == "tocks"
    assert ip.user_ns["Counter"].unit == "tocks"


def test_cell_without_a_side_task_class_is_refused(ip):
    result = run(ip, "%%freeride_task empty\nclass NotATask:\n    pass\n")
    assert isinstance(result.error_in_exec, UsageError)
    assert "exactly one IterativeSideTask or ImperativeSideTask" in str(result.error_in_exec)


def test_cell_with_two_side_task_classes_names_both(ip):
    two = COUNTER_CELL + "\nclass Other(Counter):\n    pass\n"
    result = run(ip, f"%%freeride_task two\n{two}")
    assert isinstance(result.error_in_exec, UsageError)
    assert "Counter, Other" in str(result.error_in_exec)


def test_cell_syntax_error_names_the_line(ip):
    result = run(ip, "%%freeride_task broken\nclass Broken(:\n    pass\n")
    assert isinstance(result.error_in_exec, UsageError)
    assert "broken: line 1" in str(result.error_in_exec)


def test_cell_task_may_not_shadow_a_builtin(ip):
    result = run(ip, f"%%freeride_task pagerank\n{COUNTER_CELL}")
    assert isinstance(result.error_in_exec, UsageError)
    assert "built-in side task" in str(result.error_in_exec)


# -- unload and reload ---------------------------------------------------------------------------


def pumps() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("freeride-dashboard-")]


def test_unload_stops_the_pump_and_removes_the_magics(shell, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shell.run_line_magic("load_ext", "freeride_lab")
    session = FakeSession()
    mimebundle(session)  # displayed: its pump runs
    assert dashboard_for(session).running
    shell.run_line_magic("unload_ext", "freeride_lab")
    assert not dashboard_for(session).running
    assert "freeride" not in shell.magics_manager.magics["line"]
    assert "freeride_task" not in shell.magics_manager.magics["cell"]


def test_reload_leaves_one_pump_per_displayed_session(ip):
    session = FakeSession()
    mimebundle(session)
    ip.run_line_magic("reload_ext", "freeride_lab")
    mimebundle(session)  # displayed again after the reload
    assert len([t for t in pumps() if session.run_id in t.name]) == 1
    dashboard_for(session).stop()


# -- a real run ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def live(shell, tmp_path_factory) -> Iterator[tuple[InteractiveShell, Any, Path]]:
    """One real run launched through the magic, shared by the module; stopped at the end."""
    workdir = tmp_path_factory.mktemp("magics-live")
    cwd = os.getcwd()
    os.chdir(workdir)
    shell.user_ns.pop("session", None)
    shell.run_line_magic("load_ext", "freeride_lab")
    try:
        result = run(shell, f"%freeride {LAUNCH}")
        assert result.success, result.error_in_exec
        session = shell.user_ns["session"]
        yield shell, session, workdir
    finally:
        session = shell.user_ns.get("session")
        if session is not None:
            session.stop()
        shell.run_line_magic("unload_ext", "freeride_lab")
        shell.user_ns.pop("session", None)
        os.chdir(cwd)


def test_launch_names_the_run_session_and_returns_while_it_trains(live):
    _, session, workdir = live
    assert type(session).__name__ == "Session" and session.owner
    assert session.run_dir.path.parent == workdir / "runs"
    assert not session.state.done


def test_relaunch_with_the_same_config_reuses_the_live_run(live, capsys):
    shell, session, workdir = live
    assert run(shell, f"%freeride {LAUNCH}").success
    assert "already live with this config: reusing it" in capsys.readouterr().out
    assert shell.user_ns["session"] is session
    assert len(list((workdir / "runs").iterdir())) == 1


def test_relaunch_with_another_config_is_refused_and_names_the_change(live):
    shell, _, workdir = live
    result = run(shell, f"%freeride {LAUNCH.replace('--steps 3000', '--steps 10')}")
    assert isinstance(result.error_in_exec, UsageError)
    assert "steps: 3000 → 10" in str(result.error_in_exec)
    assert len(list((workdir / "runs").iterdir())) == 1


def test_attach_tune_detach_act_on_the_real_run(live):
    shell, session, _ = live
    assert run(shell, "%freeride attach pagerank --stage 1 --option n_nodes=2000").success
    task = session.tasks[-1]
    assert (task["name"], task["stage"]) == ("pagerank", 1)
    assert run(shell, f"%freeride tune {task['id']} --budget-ms 40").success
    assert next(t for t in session.tasks if t["id"] == task["id"])["budget_ms"] == 40
    assert run(shell, f"%freeride detach {task['id']}").success
    state = next(t for t in session.tasks if t["id"] == task["id"])["state"]
    assert state in ("STOPPED", "DETACHED", "FINISHED")


def test_rejected_attach_leaves_the_real_run_untouched(live):
    shell, session, _ = live
    before = session.tasks
    result = run(shell, "%freeride attach pagerank --stage 7")
    assert isinstance(result.error_in_exec, UsageError)
    assert "stage=7" in str(result.error_in_exec)
    assert session.tasks == before and not session.state.done


def test_a_cell_task_runs_in_the_real_run(live):
    shell, session, _ = live
    assert run(shell, f"%%freeride_task counter\n{COUNTER_CELL}").success
    assert run(shell, "%freeride attach counter --stage 0 --budget-ms 5").success
    task_id = session.tasks[-1]["id"]

    def progressed() -> bool:
        task = next(t for t in session.tasks if t["id"] == task_id)
        assert not task["error"], task["error"]
        return task["progress"] > 0

    wait_until(progressed, timeout_s=STARTUP_S + PROGRESS_S, what="the cell task's progress")
    assert run(shell, f"%freeride detach {task_id}").success


def test_report_writes_html_and_tables(live):
    shell, _, workdir = live
    wait_until(
        lambda: shell.user_ns["session"].steps_done >= 2, timeout_s=STARTUP_S, what="two steps"
    )
    assert run(shell, "%freeride report report/run.html").success
    assert (workdir / "report" / "run.html").is_file()
    assert (workdir / "report" / "actions.parquet").is_file()


def test_stop_ends_the_run_and_its_processes(live, capsys):
    import psutil

    shell, session, _ = live
    assert run(shell, "%freeride stop").success
    assert session.state.done
    assert "stopped after" in capsys.readouterr().out
    needle = str(session.run_dir.path)
    left = [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if any(needle in a for a in (p.info.get("cmdline") or []))
    ]
    assert left == []
