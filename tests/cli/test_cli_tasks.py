"""Claims about the command line for live runs: ``launch`` returns at once and the run outlives
it; ``attach``, ``status``, ``checkpoint``, ``detach``, ``list``, ``stop`` and ``report`` work
from separate invocations on a run none of them launched; errors are one line with exit code 2.

One detached run (two sleep-timed ranks) serves the module; its tests run in file order.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from waits import run_processes, wait_until

from freeride_lab.lab.session import Session

REPO = Path(__file__).resolve().parents[2]
TOYS = REPO / "tests" / "sidetasks" / "tasks_for_tests.py"
STARTUP_S = 240.0  # first step of a fresh run on a loaded two-core box
# Each command that opens the run builds its RunConfig, which imports torch (seconds), and
# reads the run's events; slow stages keep the event files small.
TINY = [
    "--schedule", "1F1B", "--stages", "2", "--microbatches", "2", "--workload", "synthetic",
    "--t-forward-ms", "20", "--t-backward-input-ms", "20", "--t-backward-weight-ms", "20",
    "--d-model", "16", "--seq-len", "8", "--microbatch-size", "2", "--grace-s", "3",
    "--steps", "100000",
]  # fmt: skip


def cli(*args: str, cwd: Path, timeout_s: float = STARTUP_S) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "freeride_lab.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cli-tasks")


@pytest.fixture(scope="module")
def run_dir(workdir: Path) -> Iterator[Path]:
    launched = cli("launch", *TINY, cwd=workdir)
    assert launched.returncode == 0, launched.stderr
    path = Path(launched.stdout.strip())
    try:
        yield path
    finally:
        with Session.open(path) as session:
            session.stop()


def test_launch_returns_and_the_run_trains_after_the_command_exited(
    run_dir: Path, workdir: Path
) -> None:
    assert run_dir.parent == workdir / "runs"
    session = Session.open(run_dir)
    assert not session.owner
    wait_until(lambda: session.steps_done >= 2, timeout_s=STARTUP_S, what="two training steps")


def test_attach_status_checkpoint_and_detach_work_from_separate_invocations(
    run_dir: Path, workdir: Path
) -> None:
    attached = cli(
        "attach", str(run_dir), f"{TOYS}:Counting", "--stage", "1", "--budget-ms", "4",
        "--option", "step_s=0.002", cwd=workdir,
    )  # fmt: skip
    assert attached.returncode == 0, attached.stderr
    task_id = attached.stdout.strip()
    assert task_id.startswith("counting-")
    session = Session.open(run_dir)

    def progress() -> float:
        return float(next(t for t in session.tasks if t["id"] == task_id)["progress"])

    wait_until(lambda: progress() > 0, timeout_s=STARTUP_S, what="the side task's progress")
    status = cli("status", str(run_dir), cwd=workdir)
    assert status.returncode == 0, status.stderr
    line = next(x for x in status.stdout.splitlines() if task_id in x)
    assert " 1 " in line and ("PAUSED" in line or "RUNNING" in line)
    saved = cli("checkpoint", str(run_dir), task_id, cwd=workdir)
    assert saved.returncode == 0, saved.stderr
    assert saved.stdout.startswith(f"{task_id} (Counting) stage 1: ")
    assert (run_dir / "tasks" / task_id / "checkpoint.pt").exists()
    detached = cli("detach", str(run_dir), task_id, cwd=workdir)
    assert detached.returncode == 0, detached.stderr
    assert f"{task_id} (Counting) stage 1: STOPPED" in detached.stdout
    status = cli("status", str(run_dir), cwd=workdir)
    assert "STOPPED" in next(x for x in status.stdout.splitlines() if task_id in x)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["attach", "{run}", "no_such_task"], "unknown side task 'no_such_task'"),
        (["attach", "{run}", f"{TOYS}:Counting", "--option", "oops"], "is not KEY=VALUE"),
        (["status", "/nonexistent/run"], "is not a run directory"),
    ],
)
def test_errors_are_one_line_with_exit_code_2(
    run_dir: Path, workdir: Path, args: list[str], message: str
) -> None:
    done = cli(*[a.format(run=run_dir) for a in args], cwd=workdir)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert done.stderr.startswith("freeride-lab: error: ")
    assert message in done.stderr


def test_list_shows_the_run_with_its_state(run_dir: Path, workdir: Path) -> None:
    listed = cli("list", cwd=workdir)
    assert listed.returncode == 0, listed.stderr
    line = next(x for x in listed.stdout.splitlines() if str(run_dir) in x)
    assert "running" in line and "1F1B S=2 M=2" in line


def test_stop_ends_the_detached_run_and_leaves_no_process(run_dir: Path, workdir: Path) -> None:
    keeper = psutil.Process(int(Session.open(run_dir).run_dir.read_run()["owner_pid"]))
    stopped = cli("stop", str(run_dir), cwd=workdir)
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped" in stopped.stdout
    wait_until(lambda: not keeper.is_running(), timeout_s=30, what="the keeper to exit")
    wait_until(lambda: not run_processes(run_dir), timeout_s=30, what="no process of the run")
    assert Session.open(run_dir).state == "stopped"


def test_report_writes_the_report_of_a_run(run_dir: Path, workdir: Path) -> None:
    out = workdir / "report" / "report.html"
    done = cli("report", str(run_dir), str(out), cwd=workdir)
    assert done.returncode == 0, done.stderr
    assert out.is_file()
    assert Path(done.stdout.strip()) == out
