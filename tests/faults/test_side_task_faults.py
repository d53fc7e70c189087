"""Side-task faults in a real run: a side task killed with SIGKILL, its worker
killed with SIGKILL, a task that raises in teardown, and user strings holding HTML.

One 2-stage sleep-timed CPU run (torchrun, gloo) serves the module: stage 0's worker runs, in
order, a task that raises in teardown, a task the test kills with SIGKILL, and a task whose unit
is an HTML tag; stage 1's worker runs a task until the test kills the worker itself (and then
reads nothing of the tasks until the session's watchdog has written the failure down). A run
without side tasks gives the reference losses. Processes are found by walking the process
table (psutil), not through our own bookkeeping. Waits are for named conditions with deadlines.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from runs import (
    Runs,
    assert_trains_every_step,
    failed_in,
    processes,
    runs_with_tasks,
    synthetic_config,
    task,
    toy,
    wait_in_run,
)

from freeride_lab.lab.session import Session
from freeride_lab.pipeline.launcher import RunState

pytestmark = pytest.mark.slow  # a live run with failing side tasks

HTML_TASK = "<img src=x onerror=alert(1)>"  # tasks_for_tests.HTML
HTML_CONFIG = "<script>alert(1)</script>"
KILLED_WORKER = "worker for rank 1 died: killed by SIGKILL"  # as its rank recorded it
STARTUP_S = 240.0  # the first step of two fresh runs on a loaded two-core box
LIVE_S = 120.0
STEPS = 150
CONFIG = synthetic_config(steps=STEPS, seed=11, notes={"note": HTML_CONFIG})


def attach_tasks(main: Session) -> dict[str, dict[str, Any]]:
    counting = {"step_s": 0.003}
    return {  # stage 0 runs them in this order, one at a time
        "teardown": main.attach(toy("RaisingInTeardown"), stage=0, policy="WARN"),
        "victim": main.attach(toy("Counting"), stage=0, options=counting, policy="WARN"),
        "html": main.attach(
            toy("HtmlUnit"), stage=0, options={**counting, "limit": 5}, policy="WARN"
        ),
        "orphan": main.attach(toy("Counting"), stage=1, options=counting, policy="WARN"),
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    root = tmp_path_factory.mktemp("side-task-faults")
    with runs_with_tasks(CONFIG, root, attach_tasks, startup_s=STARTUP_S) as started:
        yield started


# -- while training runs -----------------------------------------------------------------------


def test_a_task_raising_in_teardown_ends_failed_with_its_reason(runs: Runs) -> None:
    run, tid = runs.main, runs.ids["teardown"]
    wait_in_run(lambda: task(run, tid)["state"] == "FAILED", LIVE_S, "the teardown failure", run)
    assert re.search(r"teardown raised RuntimeError: boom in teardown", task(run, tid)["error"])
    assert task(run, tid)["progress"] >= 3


def test_a_side_task_killed_with_sigkill_ends_failed_with_its_reason(runs: Runs) -> None:
    run, tid = runs.main, runs.ids["victim"]
    wait_in_run(lambda: task(run, tid)["progress"] >= 2, LIVE_S, "the victim's progress", run)
    (victim,) = processes("freeride_lab.sidetasks.host", tid)
    victim.send_signal(signal.SIGKILL)
    wait_in_run(lambda: task(run, tid)["state"] == "FAILED", 30.0, "the victim to fail", run)
    error = task(run, tid)["error"]
    assert re.search(r"exited with code -9|SIGKILL", error), error
    # the worker goes on with the next task in its queue
    html = runs.ids["html"]
    wait_in_run(lambda: task(run, html)["state"] == "FINISHED", LIVE_S, "the next task", run)


def test_a_worker_killed_with_sigkill_fails_its_tasks_without_anyone_reading_them(
    runs: Runs,
) -> None:
    run, tid = runs.main, runs.ids["orphan"]
    wait_in_run(lambda: task(run, tid)["progress"] >= 2, LIVE_S, "the orphan's progress", run)
    (worker,) = processes("freeride_lab.sidetasks.worker", str(run.run_dir.path), "--rank 1 ")
    worker.send_signal(signal.SIGKILL)
    # Nobody reads run.tasks from here on: the session's watchdog must notice by itself.
    lab_events = run.run_dir.events_dir / "lab-1.jsonl"
    wait_in_run(lambda: failed_in(lab_events, tid), 30.0, "the watchdog to record the failure")
    recorded = failed_in(lab_events, tid)
    assert recorded is not None and KILLED_WORKER in recorded["reason"], recorded
    events = run.events  # the session's own tables show it too
    fails = events[(events["task_id"] == tid) & (events["event"] == "FAIL")]
    assert fails["reason"].str.contains(KILLED_WORKER).any(), fails
    # its task process does not outlive it
    wait_in_run(
        lambda: not processes("freeride_lab.sidetasks.host", tid), 30.0, "the orphan to exit"
    )


def test_a_task_of_a_killed_worker_names_the_worker_in_its_error(runs: Runs) -> None:
    run, tid = runs.main, runs.ids["orphan"]
    wait_in_run(lambda: task(run, tid)["state"] == "FAILED", 30.0, "the orphan to fail", run)
    error = task(run, tid)["error"]
    assert re.search(KILLED_WORKER, error), error


# -- after training ----------------------------------------------------------------------------


def test_training_completes_every_step_with_the_losses_of_a_run_without_faults(
    runs: Runs,
) -> None:
    run = runs.main
    assert_trains_every_step(run, steps=STEPS, ranks=2, timeout_s=STARTUP_S + STEPS * 2.0)
    assert runs.vanilla.wait(timeout_s=STARTUP_S) == RunState.FINISHED
    with_faults = run.steps.query("rank == 1").sort_values("step")["loss"].tolist()
    without = runs.vanilla.steps.query("rank == 1").sort_values("step")["loss"].tolist()
    assert with_faults == without


def test_the_run_directory_stays_readable_with_every_failure_in_it(runs: Runs) -> None:
    run = runs.main
    assert run.wait(timeout_s=STARTUP_S + STEPS * 2.0) == RunState.FINISHED
    reopened = Session.open(run.run_dir.path)
    assert len(reopened.steps) == len(run.steps) == STEPS * 2
    ended = reopened.events.query("kind == 'side_task_state' and event == 'FAIL'")
    assert {runs.ids["teardown"], runs.ids["victim"], runs.ids["orphan"]} <= set(ended["task_id"])
    orphan = task(reopened, runs.ids["orphan"])  # the session wrote its worker's death down
    assert orphan["state"] == "FAILED" and KILLED_WORKER in orphan["error"]


def test_html_in_a_task_and_in_the_config_renders_inert_in_the_report(
    runs: Runs, tmp_path: Path
) -> None:
    run = runs.main
    html = runs.ids["html"]
    wait_in_run(lambda: task(run, html)["state"] == "FINISHED", LIVE_S, "the HTML task")
    assert task(run, html)["unit"] == HTML_TASK
    page = run.report(tmp_path / "report.html").read_text()
    for raw, escaped in [
        (HTML_TASK, "&lt;img src=x onerror=alert(1)&gt;"),
        (HTML_CONFIG, "&lt;script&gt;alert(1)&lt;/script&gt;"),
    ]:
        assert raw not in page
        assert escaped in page


def test_no_process_of_the_run_is_left_after_stop(runs: Runs) -> None:
    runs.main.stop()
    runs.vanilla.stop()
    path = str(runs.main.run_dir.path)
    wait_in_run(lambda: not processes(path), 10.0, "every process of the run to exit")
    assert os.access(path, os.R_OK)
