"""Launching small live runs in tests, and reading them while they train.

Importable from any test module (``tests/`` is on ``sys.path`` through its ``conftest.py``).
``synthetic_config`` is the one small run most live tests need (sleep-timed synthetic stages, so
a step costs the same on any machine); ``wait_in_run`` waits for something a live run should
show and fails at once, with the run's state, if the run ends first.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from freeride_lab.core import events as ev
from freeride_lab.core.config import RunConfig, RuntimeOptions
from freeride_lab.io.rundir import RunDir

if TYPE_CHECKING:
    from freeride_lab.core.sidetask_state import SideTaskState
    from freeride_lab.lab.session import Session
    from freeride_lab.sidetasks.process import TaskProcess

REPO = Path(__file__).resolve().parents[1]
#: The toy side tasks (no torch): ``f"{TOYS}:Counting"``.
TOYS = REPO / "tests" / "sidetasks" / "tasks_for_tests.py"


def synthetic_config(
    *, steps: int, stages: int = 2, microbatches: int = 4, phase_ms: float = 20.0, **changes: Any
) -> RunConfig:
    """A 1F1B run of ``stages`` synthetic stages, each F, B and W phase sleeping ``phase_ms``, a
    tiny model (micro-batches of 2), a 5 s stop grace; ``changes`` replace any field."""
    fields: dict[str, Any] = {
        "schedule": "1F1B",
        "stages": stages,
        "microbatches": microbatches,
        "steps": steps,
        "workload": "synthetic",
        "t_forward_ms": phase_ms,
        "t_backward_input_ms": phase_ms,
        "t_backward_weight_ms": phase_ms,
        "d_model": 16,
        "seq_len": 8,
        "microbatch_size": 2,
        "runtime": RuntimeOptions(stop_grace_s=5),
    }
    return RunConfig(**{**fields, **changes})


def wait_in_run(
    predicate: Callable[[], object],
    timeout_s: float,
    what: str,
    run: Session | None = None,
    *,
    poll_s: float = 0.2,
) -> None:
    """Poll ``predicate`` until it is true; AssertionError naming ``what`` after ``timeout_s``,
    or as soon as ``run`` has ended (a run that ends early cannot show it any more)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if run is not None and run.state.done:
            raise AssertionError(
                f"the run ended ({run.state}, step {run.steps_done}) while waiting for {what}; "
                "raise STEPS if this machine is slower"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(poll_s)


def task(run: Session, task_id: str) -> dict[str, Any]:
    """The row of ``run.tasks`` for ``task_id``."""
    return next(t for t in run.tasks if t["id"] == task_id)


def processes(*words: str) -> list[psutil.Process]:
    """Live (not zombie) descendants of this process whose command line holds every word."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            cmdline = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if all(w in cmdline for w in words):
            found.append(p)
    return found


def toy(name: str) -> str:
    """The reference of a toy side task: ``toy("Counting")``."""
    return f"{TOYS}:{name}"


def launch_with_vanilla(
    config: RunConfig, root: Path, *, grace_s: float = 3
) -> tuple[Session, Session]:
    """Two live runs under ``root``: ``main`` from ``config``, and ``vanilla``, the same run
    without side-task workers and with zero-time phases (it finishes first). Stop both."""
    from freeride_lab.lab.session import Session

    main = Session.launch(config, run_dir=root / "main", grace_s=grace_s)
    zero = {"t_forward_ms": 0.0, "t_backward_input_ms": 0.0, "t_backward_weight_ms": 0.0}
    vanilla = Session.launch(
        config.replace(side_tasks=False, **zero), run_dir=root / "vanilla", grace_s=grace_s
    )
    return main, vanilla


@dataclass
class Runs:
    """A live run with side tasks (``main``), the same run without them (``vanilla``: the
    reference losses), and the ids of the tasks attached to ``main``, by role."""

    main: Session
    vanilla: Session
    ids: dict[str, str]


@contextlib.contextmanager
def runs_with_tasks(
    config: RunConfig,
    root: Path,
    attach: Callable[[Session], dict[str, dict[str, Any]]],
    *,
    startup_s: float,
) -> Iterator[Runs]:
    """``launch_with_vanilla``, then ``attach(main)`` (the attached tasks' dicts, by role) once
    ``main`` trained its first step (within ``startup_s``); both runs stop on the way out."""
    main, vanilla = launch_with_vanilla(config, root)
    try:
        wait_in_run(lambda: main.steps_done >= 1, startup_s, "the first training step", main)
        attached = attach(main)
        yield Runs(main, vanilla, {role: task["id"] for role, task in attached.items()})
    finally:
        main.stop()
        vanilla.stop()


def assert_trains_every_step(session: Session, *, steps: int, ranks: int, timeout_s: float) -> None:
    """``session`` finishes within ``timeout_s`` with every one of its ``steps`` timed on each
    of its ``ranks``, and no failure."""
    from freeride_lab.pipeline.launcher import RunState

    assert session.wait(timeout_s=timeout_s) == RunState.FINISHED
    table = session.steps
    assert sorted(set(zip(table["step"], table["rank"], strict=True))) == [
        (s, r) for s in range(steps) for r in range(ranks)
    ]
    assert session.failure is None


def failed_in(path: Path, task_id: str) -> dict[str, Any] | None:
    """The FAIL event of ``task_id`` in an event file, if it holds one."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        event = json.loads(line)
        if event.get("task_id") == task_id and event.get("event") == "FAIL":
            return dict(event)
    return None


def read_events(path: Path) -> list[ev.Event]:
    """The events of one event file so far (a line still being written is left out)."""
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(ev.from_json(line))
    return out


def start_torchrun(path: Path, config: RunConfig) -> subprocess.Popen[bytes]:
    """Start the ranks of ``config`` under ``torchrun`` in a new run directory ``path``, without
    a Session (the run directory holds only run.json); its output goes to logs/torchrun.log."""
    run_dir = RunDir(path)
    run_dir.create()
    run_dir.write_json(run_dir.run_json, {"config": config.to_dict(), "run_id": path.name})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc-per-node={config.stages}", "-m", "freeride_lab.pipeline.rank"]
    cmd += ["--run-dir", str(path)]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    env["FREERIDE_LOG_LEVEL"] = "WARNING"
    log = open(run_dir.logs_dir / "torchrun.log", "wb")  # noqa: SIM115
    return subprocess.Popen(
        cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def finish_torchrun(proc: subprocess.Popen[bytes], path: Path, timeout_s: float) -> None:
    """Wait for a ``start_torchrun`` job; kill its process group after ``timeout_s``; assert it
    exited 0, showing the tails of its logs when not."""
    try:
        code = proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # our own job's process group
        proc.wait()
        code = None
    logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in (path / "logs").glob("*.log"))
    assert code == 0, f"{path.name}: torchrun exit {code}\n{logs}"


def log_tails(session: Session, chars: int = 1500) -> str:
    """The last ``chars`` of each of a run's log files, headed by its name: for assertion
    messages about a run that did not do what it should."""
    logs = session.run_dir.logs_dir
    return "\n".join(
        f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}" for p in sorted(logs.glob("*"))
    )


def start_task_host(
    run_dir: RunDir, hosts: list[TaskProcess], task: str, task_id: str = "t1", **fields: Any
) -> TaskProcess:
    """Start one side-task process for rank 0 / stage 0 of ``run_dir`` (``fields``: the rest of
    its ``TaskSpec``) and add it to ``hosts`` (the conftest fixture cleans them up)."""
    from freeride_lab.sidetasks.process import TaskProcess
    from freeride_lab.sidetasks.spec import HostSpec, TaskSpec

    spec = TaskSpec.from_dict({"task": task, "task_id": task_id, **fields})
    proc = TaskProcess(spec)
    host = HostSpec(task=spec, run_dir=str(run_dir.path), rank=0, stage=0)
    proc.start(host, log_path=run_dir.logs_dir / f"task-{task_id}.log")
    hosts.append(proc)
    return proc


def serve_until(proc: TaskProcess, *states: SideTaskState, timeout_s: float = 60.0) -> None:
    """Serve the messages of a task process (``proc.receive``) until its state is one of
    ``states``; AssertionError if that takes over ``timeout_s`` or its connection is gone."""
    deadline = time.monotonic() + timeout_s
    while proc.state not in states:
        if proc.conn is None or time.monotonic() > deadline:
            raise AssertionError(f"task {proc.task_id} is {proc.state}, waited for {states}")
        if proc.conn.poll(0.05):
            proc.receive()
