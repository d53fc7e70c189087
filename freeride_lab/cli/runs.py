"""``freeride-lab`` subcommands for live runs and their side tasks (registered in
``freeride_lab.cli.app.SUBCOMMANDS``; the grammar is ``freeride_lab.cli.app.build_parser``).

    freeride-lab launch --workload synthetic --steps 500     # prints the run directory
    freeride-lab attach RUN_DIR pagerank --option n_nodes=2000 --budget-ms 20   # prints the id
    freeride-lab status RUN_DIR                               # state, steps, side tasks
    freeride-lab tune RUN_DIR TASK_ID --sm 50
    freeride-lab checkpoint RUN_DIR TASK_ID                   # save its state now
    freeride-lab detach RUN_DIR TASK_ID
    freeride-lab stop RUN_DIR
    freeride-lab report RUN_DIR report.html
    freeride-lab list [--root runs]

``launch`` detaches the run: a keeper process (``freeride_lab.lab.keeper``) owns it and outlives
the command. The other commands open the run directory (``Session.open``); ``attach``, ``tune``,
``checkpoint``, ``detach`` and ``stop`` ask the keeper, the one process that commands the run,
so they work on runs started with ``launch`` (a run a notebook or script launched refuses them,
naming its owner). ``status``, ``list`` and ``report`` read any run, damaged ones for what is
left. Errors print one line and exit 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from freeride_lab.cli.app import PROG, UsageError, add_run_options, run_config_fields
from freeride_lab.io.rundir import RunDir

if TYPE_CHECKING:
    from freeride_lab.lab.session import Session

__all__ = [
    "add_attach",
    "add_checkpoint",
    "add_detach",
    "add_launch",
    "add_list",
    "add_report",
    "add_status",
    "add_stop",
    "add_tune",
    "cmd_attach",
    "cmd_checkpoint",
    "cmd_detach",
    "cmd_launch",
    "cmd_list",
    "cmd_report",
    "cmd_status",
    "cmd_stop",
    "cmd_tune",
]

EXIT_OK = 0
_TASK_COLUMNS = (
    "id", "name", "stage", "state", "progress", "unit", "steps", "overruns", "budget_ms",
    "memory_bytes", "sm_pct", "error",
)  # fmt: skip


@contextlib.contextmanager
def _usage_errors() -> Iterator[None]:
    """Turn the errors a request can meet into ``UsageError`` (one line, exit 2)."""
    try:
        yield
    except (ValueError, RuntimeError, OSError, TimeoutError, KeyError) as e:
        text = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
        raise UsageError(text.splitlines()[0] if text else type(e).__name__) from None


def _run_dir_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (printed by launch)")


def _task_parser(subparsers: Any, name: str, help_text: str) -> argparse.ArgumentParser:
    """A command on one side task of a run: ``RUN_DIR TASK_ID``."""
    p: argparse.ArgumentParser = subparsers.add_parser(name, help=help_text)
    _run_dir_arg(p)
    p.add_argument("task_id", metavar="TASK_ID")
    return p


def _limit_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--memory", default=None, help="memory cap, e.g. 4GB, 512MiB or bytes")
    p.add_argument("--sm", type=float, default=None, help="SM share in percent (MPS only)")
    p.add_argument("--priority", type=int, default=None, help="MPS client priority: 0 or 1")
    p.add_argument("--budget-ms", type=float, default=None, help="step budget (ms)")


# -- launch ------------------------------------------------------------------------------------


def add_launch(subparsers: Any) -> argparse.ArgumentParser:
    """``launch``: like ``run``, but detached: print the run directory and return."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "launch",
        help="start a run in the background; print its run directory",
        description="Start a pipeline training run owned by a background keeper process and "
        "return at once; the run survives this command. Follow it with status, attach side "
        "tasks with attach, end it with stop.",
    )
    add_run_options(p)
    p.add_argument(
        "--start-timeout-s",
        type=float,
        default=120.0,
        help="how long to wait for the keeper to report the run (default 120)",
    )
    return p


def cmd_launch(args: argparse.Namespace) -> int:
    """Start the keeper in its own session, print the run directory it reports."""
    from freeride_lab.core.config import RunConfig
    from freeride_lab.sidetasks.process import child_env

    with _usage_errors():
        config = RunConfig(**run_config_fields(args))
    command = [
        sys.executable, "-m", "freeride_lab.lab.keeper",
        "--config", config.to_json(), "--grace-s", str(args.grace_s),
    ]  # fmt: skip
    if args.run_dir is not None:
        command += ["--run-dir", str(Path(args.run_dir).expanduser().absolute())]
    with tempfile.TemporaryFile() as errors:
        # A new session on purpose: the run must outlive this command and the terminal's
        # Ctrl-C and hang-up (the keeper also ignores SIGINT and SIGHUP).
        keeper = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=errors,
            env=child_env(),
            start_new_session=True,
        )
        line = _first_line(keeper, args.start_timeout_s)
        if not line:
            errors.seek(0)
            tail = errors.read().decode(errors="replace").strip().splitlines()
            why = tail[-1] if tail else f"exit code {keeper.poll()}"
            raise UsageError(f"the run's keeper did not start it: {why}")
    assert keeper.stdout is not None
    keeper.stdout.close()
    reply = json.loads(line)
    if "error" in reply:
        raise UsageError(str(reply["error"]))
    print(reply["run_dir"])
    print(
        f"run {reply['run_id']} launched (keeper pid {keeper.pid}); follow it with: "
        f"{PROG} status {reply['run_dir']}",
        file=sys.stderr,
    )
    return EXIT_OK


def _first_line(proc: subprocess.Popen[bytes], timeout_s: float) -> str:
    """The first line ``proc`` writes to its stdout pipe ("" at EOF or after ``timeout_s``)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            return ""
        ready, _, _ = select.select([proc.stdout], [], [], min(left, 0.5))
        if ready:
            chunk = proc.stdout.read1(4096)  # type: ignore[attr-defined]
            if not chunk:
                break
            data += chunk
    return data.decode(errors="replace").partition("\n")[0].strip()


# -- status and list -----------------------------------------------------------------------------


def add_status(subparsers: Any) -> argparse.ArgumentParser:
    """``status``: a run's state, steps, MPS and side tasks."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "status", help="show a run's state and its side tasks"
    )
    _run_dir_arg(p)
    return p


def cmd_status(args: argparse.Namespace) -> int:
    """Print the run line, its failure if any, and the side-task table."""
    import pandas as pd

    from freeride_lab.lab.session import Session

    with _usage_errors():
        session = Session.open(args.run_dir)
        state = session.state
        cfg = session.config
        print(f"run {session.run_id}: {state}, step {session.steps_done}/{cfg.steps}")
        mps = session.run_dir.read_run().get("mps", {})
        side = "on" if cfg.side_tasks else "off (vanilla)"
        print(f"side tasks: {side}; MPS: {'on' if mps.get('active') else 'off'}", end="")
        print(f" ({mps['reason']})" if mps.get("reason") else "")
        failure = session.failure
        if failure is not None:
            print(f"failure: {failure.reason}")
        tasks = session.tasks if cfg.side_tasks else []
    if tasks:
        table = pd.DataFrame(tasks)[list(_TASK_COLUMNS)]
        with pd.option_context("display.width", 160, "display.max_colwidth", 60):
            print(table.to_string(index=False))
    else:
        print("no side tasks")
    return EXIT_OK


def add_list(subparsers: Any) -> argparse.ArgumentParser:
    """``list``: the runs under a directory, with their states."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "list", help="list the runs under ./runs (or --root) with their states"
    )
    p.add_argument("--root", default="runs", help="where run directories are (default ./runs)")
    return p


def cmd_list(args: argparse.Namespace) -> int:
    """One line per run directory: run id, state, shape, created, path (newest last)."""
    from datetime import datetime

    root = Path(args.root).expanduser().absolute()
    if not root.is_dir():
        raise UsageError(f"--root {str(root)!r} is not a directory; runs go to ./runs by default")
    rows = []
    for path in sorted(p for p in root.iterdir() if (p / "run.json").is_file()):
        rd = RunDir(path)
        try:
            run = rd.read_run()
        except (OSError, ValueError):  # listed, so that a damaged run does not just vanish
            with contextlib.suppress(OSError):
                created = datetime.fromtimestamp(rd.run_json.stat().st_mtime)
                rows.append((created, path.name, "damaged", "run.json unreadable", path))
            continue
        cfg = run.get("config", {})
        try:
            created = datetime.fromtimestamp(run.get("created_ns", 0) / 1e9)
        except (OverflowError, OSError, ValueError):  # a damaged time: sorted first
            created = datetime.fromtimestamp(0)
        shape = f"{cfg.get('schedule')} S={cfg.get('stages')} M={cfg.get('microbatches')}"
        rows.append((created, run.get("run_id", path.name), _light_state(rd, run), shape, path))
    if not rows:
        print(f"no runs under {root}")
        return EXIT_OK
    for created, run_id, state, shape, path in sorted(rows, key=lambda r: r[0]):
        print(f"{run_id}  {state:<9}  {shape:<22}  {created:%Y-%m-%d %H:%M:%S}  {path}")
    return EXIT_OK


def _light_state(rd: RunDir, run: dict[str, Any]) -> str:
    """A run's state from status.json and its launcher's liveness, without reading events."""
    import psutil

    from freeride_lab.pipeline.launcher import RunState

    status = rd.read_status()  # {} when missing or damaged
    state = str(status.get("state", RunState.STARTING))
    if state in (RunState.FINISHED, RunState.FAILED, RunState.STOPPED):
        return state
    pid = status.get("launcher_pid") or run.get("launcher_pid")
    with contextlib.suppress(psutil.Error, TypeError, ValueError):
        p = psutil.Process(int(str(pid)))
        if p.status() != psutil.STATUS_ZOMBIE and str(rd.path.name) in " ".join(p.cmdline()):
            return state
    return "gone"  # the launcher died without a final status


# -- side tasks ----------------------------------------------------------------------------------


def add_attach(subparsers: Any) -> argparse.ArgumentParser:
    """``attach``: run a side task in a live run's bubbles."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "attach",
        help="attach a side task to a live run; prints its task id",
        description="Attach a side task (built-in name, pkg.module:Class, path/file.py:Class, "
        "or the id of a detached task to resume) to a live run, placed on --stage or by the "
        "placement rules. Without --budget-ms the task is profiled inside bubbles first.",
    )
    _run_dir_arg(p)
    p.add_argument("task", metavar="TASK", help="task reference or a detached task's id")
    p.add_argument("--stage", type=int, default=None, help="stage index (default: placed)")
    _limit_options(p)
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a task option; VALUE is read as JSON when it parses (42, 1e-3, true), else text",
    )
    p.add_argument(
        "--policy", default="KILL", help="overrun policy: WARN, SHRINK_BUDGET, PAUSE, KILL"
    )
    p.add_argument(
        "--gating",
        default="bubbles",
        choices=["bubbles", "trickle", "leftovers", "none"],  # sidetasks.spec.GATINGS
        help="trickle = also between bubbles, as the overhead governor allows; leftovers = "
        "only the bubble time the stage's main task leaves; none = naive co-location",
    )
    p.add_argument(
        "--placement",
        default="freeride",
        choices=["freeride", "harvest"],
        help="without --stage: FreeRide's queue order, or the stage its steps fill most",
    )
    return p


def _options(pairs: list[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--option {pair!r} is not KEY=VALUE, e.g. --option n_nodes=2000")
        try:
            options[key.strip()] = json.loads(value)
        except ValueError:
            options[key.strip()] = value
    return options


def cmd_attach(args: argparse.Namespace) -> int:
    """Attach; print the task id (stdout) and where it went (stderr)."""
    from freeride_lab.lab.session import Session

    options = _options(args.option)
    with _usage_errors():
        session = Session.open(args.run_dir)
        task = session.attach(
            args.task,
            stage=args.stage,
            memory=args.memory,
            sm_pct=args.sm,
            priority=1 if args.priority is None else args.priority,
            budget_ms=args.budget_ms,
            options=options or None,
            policy=args.policy,
            gating=args.gating,
            placement=args.placement,
        )
    print(task["id"])
    print(f"attached {task['id']} ({task['name']}): {task['placement']}", file=sys.stderr)
    return EXIT_OK


def add_tune(subparsers: Any) -> argparse.ArgumentParser:
    """``tune``: change a live side task's limits."""
    p = _task_parser(
        subparsers, "tune", "change a side task's limits (memory, SM share, priority, budget)"
    )
    _limit_options(p)
    return p


def cmd_tune(args: argparse.Namespace) -> int:
    from freeride_lab.lab.session import Session

    with _usage_errors():
        task = Session.open(args.run_dir).tune(
            args.task_id,
            memory=args.memory,
            sm_pct=args.sm,
            priority=args.priority,
            budget_ms=args.budget_ms,
        )
    print(_task_line(task))
    return EXIT_OK


def add_checkpoint(subparsers: Any) -> argparse.ArgumentParser:
    """``checkpoint``: save a side task's state now."""
    return _task_parser(
        subparsers, "checkpoint", "save a side task's state now (it goes on from there)"
    )


def cmd_checkpoint(args: argparse.Namespace) -> int:
    return _on_task(args, lambda session: session.checkpoint(args.task_id))


def add_detach(subparsers: Any) -> argparse.ArgumentParser:
    """``detach``: checkpoint and stop a side task."""
    return _task_parser(
        subparsers, "detach", "checkpoint and stop a side task (attach TASK_ID resumes it)"
    )


def cmd_detach(args: argparse.Namespace) -> int:
    return _on_task(args, lambda session: session.detach(args.task_id))


def _on_task(args: argparse.Namespace, command: Callable[[Session], dict[str, Any]]) -> int:
    """Open ``args.run_dir``, run ``command`` on its Session and print the task it returns."""
    from freeride_lab.lab.session import Session

    with _usage_errors():
        task = command(Session.open(args.run_dir))
    print(_task_line(task))
    return EXIT_OK


def _task_line(task: dict[str, Any]) -> str:
    budget = "profiling" if task["budget_ms"] is None else f"{task['budget_ms']:g} ms"
    return (
        f"{task['id']} ({task['name']}) stage {task['stage']}: {task['state']}, progress "
        f"{task['progress']:g} {task['unit']}, budget {budget}, sm {task['sm_pct']}, "
        f"memory {task['memory_bytes']}, priority {task['priority']}"
        + (f"; error: {task['error']}" if task["error"] else "")
    )


# -- stop and report -----------------------------------------------------------------------------


def add_stop(subparsers: Any) -> argparse.ArgumentParser:
    """``stop``: end a detached run (launched with ``launch``)."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "stop", help="stop a run launched with launch (SIGTERM, grace, SIGKILL)"
    )
    _run_dir_arg(p)
    p.add_argument("--grace-s", type=float, default=None, help="SIGTERM to SIGKILL delay")
    return p


def cmd_stop(args: argparse.Namespace) -> int:
    from freeride_lab.lab.session import Session

    with _usage_errors():
        session = Session.open(args.run_dir)
        session.stop(grace_s=args.grace_s)
        print(f"run {session.run_id}: {session.state} after {session.steps_done} step(s)")
    return EXIT_OK


def add_report(subparsers: Any) -> argparse.ArgumentParser:
    """``report``: write a run's self-contained HTML report."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "report", help="write a run's report (HTML, tables beside it)"
    )
    _run_dir_arg(p)
    p.add_argument("path", metavar="PATH", help="where the report goes, e.g. report.html")
    return p


def cmd_report(args: argparse.Namespace) -> int:
    from freeride_lab.lab.session import Session

    with _usage_errors():
        written = Session.open(args.run_dir).report(args.path)
    print(written)
    return EXIT_OK
