"""Task code that tries to leave by the back door is contained: ``sys.exit()``, ``SystemExit``,
``KeyboardInterrupt`` and endless recursion, both where a task runs (its own process, during
setup or a step) and where a ``%%freeride_task`` cell is defined (the kernel).

The task process is a real ``task_host`` driven as its worker would (``TaskProcess``, bubble
edges through an ``EdgeWriter``); the kernel is a real IPython shell with the extension loaded.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from runs import serve_until, start_task_host
from unruly_tasks import ref

from freeride_lab.core import events as ev
from freeride_lab.core.sidetask_state import SideTaskState
from freeride_lab.io.rundir import RunDir
from freeride_lab.sidetasks.edges import EdgeWriter
from freeride_lab.sidetasks.process import TaskProcess

EXITS = {
    "exit": "SystemExit: 3",
    "systemexit": "SystemExit: leaving",
    "interrupt": "KeyboardInterrupt",
    "recursion": "RecursionError: maximum recursion depth exceeded",
}


def start_host(run_dir: RunDir, hosts: list[TaskProcess], **options: Any) -> TaskProcess:
    return start_task_host(
        run_dir, hosts, ref("Misbehaves"), options=options, limits={"budget_s": 0.001}
    )


def bubbles_until_exit(proc: TaskProcess, edges: EdgeWriter, timeout_s: float = 60.0) -> int:
    """Announce bubbles until the task process exits; its exit code."""
    assert proc.proc is not None
    deadline = time.monotonic() + timeout_s
    step = 0
    while proc.proc.poll() is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"task process still running after {timeout_s} s of bubbles")
        start_ns = time.time_ns()
        edges.bubble_start(step, 0, start_ns, start_ns + 50_000_000)
        time.sleep(0.04)  # the bubble itself: the scenario, not a synchronisation
        edges.bubble_end(step, 0, time.time_ns())
        step += 1
        time.sleep(0.03)
    return proc.proc.returncode


def final_state(run_dir: RunDir) -> ev.SideTaskStateChanged:
    path = run_dir.events_dir / "task-t1.jsonl"
    found = [ev.from_json(line) for line in path.read_text().splitlines() if line]
    return [e for e in found if isinstance(e, ev.SideTaskStateChanged)][-1]


@pytest.mark.parametrize("how", list(EXITS))
def test_a_task_leaving_setup_by_the_back_door_fails_with_the_reason(
    run_dir: RunDir, hosts: list[TaskProcess], how: str
) -> None:
    proc = start_host(run_dir, hosts, how=how, where="setup")
    assert proc.proc is not None
    assert proc.proc.wait(60) == 1
    failed = final_state(run_dir)
    assert (failed.state, failed.reason) == ("FAILED", f"setup raised {EXITS[how]}")
    assert EXITS[how].split(":")[0] in failed.traceback


@pytest.mark.parametrize("how", list(EXITS))
def test_a_task_leaving_a_step_by_the_back_door_fails_with_the_reason(
    run_dir: RunDir, edges: EdgeWriter, hosts: list[TaskProcess], how: str
) -> None:
    proc = start_host(run_dir, hosts, how=how, where="step")
    serve_until(proc, SideTaskState.CREATED)
    assert proc.request({"cmd": "activate"})
    assert bubbles_until_exit(proc, edges) == 1
    failed = final_state(run_dir)
    assert (failed.state, failed.reason) == ("FAILED", f"step raised {EXITS[how]}")


# -- %%freeride_task cells, defined in the kernel ----------------------------------------------

CELLS = {
    "exit": "import sys\nsys.exit(3)\n",
    "systemexit": "raise SystemExit('leaving')\n",
    "interrupt": "raise KeyboardInterrupt\n",
    "recursion": "def down(n):\n    return down(n + 1)\n\ndown(0)\n",
}
TASK_CLASS = (
    "from freeride_lab import IterativeSideTask\n\nclass Ok(IterativeSideTask):\n    pass\n"
)


@pytest.fixture(scope="module")
def shell() -> Any:
    """An IPython kernel shell (skipped where the notebook packages are not installed)."""
    for package in ("IPython", "anywidget", "plotly"):
        pytest.importorskip(package, reason="the notebook UI packages are not installed")
    from IPython.core.interactiveshell import InteractiveShell

    return InteractiveShell.instance()


@pytest.fixture
def ip(shell: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.chdir(tmp_path)
    shell.run_line_magic("load_ext", "freeride_lab")
    yield shell
    shell.run_line_magic("unload_ext", "freeride_lab")


@pytest.mark.parametrize("how", list(CELLS))
def test_a_cell_task_leaving_by_the_back_door_is_refused_and_the_kernel_goes_on(
    ip: Any, tmp_path: Path, how: str
) -> None:
    from IPython.core.error import UsageError

    from freeride_lab.ui.dashboard import user_tasks

    result = ip.run_cell(f"%%freeride_task rogue\n{TASK_CLASS}{CELLS[how]}", store_history=False)
    assert isinstance(result.error_in_exec, UsageError), repr(result.error_in_exec)
    assert str(result.error_in_exec).startswith(
        f"rogue: running the cell failed: {EXITS[how].split(':')[0]}"
    )
    assert "rogue" not in user_tasks(tmp_path / ".freeride_tasks")
    after = ip.run_cell("1 + 1", store_history=False)  # the kernel goes on
    assert after.success and after.result == 2
