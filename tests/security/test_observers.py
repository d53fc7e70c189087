"""Claims about who may command a run: only the process that launched it. A ``Session.open``
elsewhere is read-only (its commands raise ``PermissionError`` naming the owner), and a run
started with ``freeride-lab launch`` takes commands from other processes only through its
keeper, which owns it (see [Note: one commander per run] in ``lab/owner_channel.py``).

Two real runs serve the module: one launched by a separate Python process that attaches a side
task itself (what a notebook kernel does), and one detached run kept by ``lab.keeper``.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import struct
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Client
from pathlib import Path
from typing import Any

import pytest
from waits import run_processes, wait_until

from freeride_lab.io.rundir import RunDir
from freeride_lab.lab.session import Session
from freeride_lab.pipeline.launcher import RunState

REPO = Path(__file__).resolve().parents[2]
TOYS = REPO / "tests" / "sidetasks" / "tasks_for_tests.py"
COUNTING = f"{TOYS}:Counting"
STARTUP_S = 240.0  # first steps of a fresh run on a loaded two-core box
SHAPE = {
    "schedule": "1F1B",
    "stages": 2,
    "microbatches": 2,
    "steps": 100_000,
    "workload": "synthetic",
    "t_forward_ms": 20.0,
    "t_backward_input_ms": 20.0,
    "t_backward_weight_ms": 20.0,
    "d_model": 16,
    "seq_len": 8,
    "microbatch_size": 2,
}


def env() -> dict[str, str]:
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join([str(REPO), out.get("PYTHONPATH", "")])
    return out


def progress(session: Session, task_id: str) -> float:
    return float(next(t for t in session.tasks if t["id"] == task_id)["progress"])


def acks(run_dir: Path) -> list[dict[str, Any]]:
    """Every command a side-task worker of the run answered."""
    found = []
    for path in sorted((run_dir / "events").glob("worker-*.jsonl")):
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event.get("kind") == "control_ack":
                found.append(event)
    return found


# -- a run owned by another Python process ------------------------------------------------------

OWNER = textwrap.dedent(
    """
    import json, os, sys, time
    from freeride_lab.core.config import RunConfig
    from freeride_lab.lab.session import Session

    session = Session.launch(
        RunConfig(**json.loads(os.environ["FREERIDE_TEST_CONFIG"])),
        run_dir=os.environ["FREERIDE_TEST_RUN_DIR"],
        grace_s=3,
    )
    task = session.attach(os.environ["FREERIDE_TEST_TASK"], stage=1, budget_ms=4,
                          options={"step_s": 0.002}, policy="WARN")
    print(json.dumps({"task_id": task["id"]}), flush=True)
    session.wait()
    """
)


@dataclass
class Owned:
    """A run launched by a separate process, and the side task that process attached."""

    run_dir: Path
    proc: subprocess.Popen[str]
    task_id: str = ""
    lines: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def owned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Owned]:
    tmp = tmp_path_factory.mktemp("owned")
    script = tmp / "owner.py"
    script.write_text(OWNER)
    variables = {
        "FREERIDE_TEST_CONFIG": json.dumps(SHAPE),
        "FREERIDE_TEST_RUN_DIR": str(tmp / "run"),
        "FREERIDE_TEST_TASK": COUNTING,
    }
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        env={**env(), **variables},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    run = Owned(tmp / "run", proc)

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            run.lines.append(line.rstrip())
            if line.startswith('{"task_id"'):
                run.task_id = json.loads(line)["task_id"]

    threading.Thread(target=read, daemon=True).start()
    try:
        wait_until(
            lambda: run.task_id or proc.poll() is not None,
            timeout_s=STARTUP_S,
            what=f"the owner's side task (owner output: {run.lines[-5:]})",
        )
        assert run.task_id, f"the owner failed: {run.lines[-10:]}"
        # its attach is answered before the worker's event of it is on disk: the tests
        # count those events, so the owner's own must be there first
        wait_until(lambda: acks(run.run_dir), timeout_s=30, what="the owner's attach event")
        yield run
    finally:
        proc.terminate()  # the launcher sees its parent go and stops the run
        proc.wait(timeout=60)
        wait_until(lambda: not run_processes(run.run_dir), timeout_s=60, what="the run to end")


COMMANDS: dict[str, tuple[str, Callable[[Session, str], Any]]] = {
    "attach": ("attach or resume side tasks", lambda s, t: s.attach(COUNTING, stage=0)),
    "resume": ("attach or resume side tasks", lambda s, t: s.attach(t)),
    "tune": ("tune side tasks", lambda s, t: s.tune(t, budget_ms=8)),
    "move": ("move side tasks", lambda s, t: s.move(t, 0)),
    "detach": ("detach side tasks", lambda s, t: s.detach(t)),
    "stop": ("stop it", lambda s, t: s.stop()),
    "enable_governor": ("run the overhead governor", lambda s, t: s.enable_governor(0.05)),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_observer_cannot_command_a_run_it_does_not_own(owned: Owned, command: str) -> None:
    what, call = COMMANDS[command]
    observer = Session.open(owned.run_dir)
    assert not observer.owner
    answered = len(acks(owned.run_dir))
    with pytest.raises(PermissionError) as refused:
        call(observer, owned.task_id)
    message = str(refused.value)
    assert f"cannot {what}" in message and f"belongs to pid {owned.proc.pid}" in message
    assert "Session.open" in message and "freeride-lab launch" in message
    assert len(acks(owned.run_dir)) == answered  # no worker heard of it
    assert [t["id"] for t in observer.tasks] == [owned.task_id]
    assert observer.state == RunState.RUNNING


def test_an_observers_stop_names_the_launcher_to_signal_instead(owned: Owned) -> None:
    launcher_pid = RunDir(owned.run_dir).read_run()["launcher_pid"]
    with pytest.raises(PermissionError, match=rf"read-only.*kill -TERM {launcher_pid}"):
        Session.open(owned.run_dir).stop()


def test_an_observer_reads_the_owners_side_task_while_it_runs_on(owned: Owned) -> None:
    observer = Session.open(owned.run_dir)
    with pytest.raises(PermissionError):
        observer.detach(owned.task_id)
    before = progress(observer, owned.task_id)
    wait_until(
        lambda: progress(observer, owned.task_id) > before + 10,
        timeout_s=120,
        what="the owner's side task to go on",
    )
    assert next(t for t in observer.tasks if t["id"] == owned.task_id)["state"] in (
        "PAUSED",
        "RUNNING",
    )


# -- a detached run: its keeper carries out other processes' commands --------------------------


@pytest.fixture(scope="module")
def kept(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    workdir = tmp_path_factory.mktemp("kept")
    options = [f"--{k.replace('_', '-')}={v}" for k, v in SHAPE.items()]
    launched = subprocess.run(
        [sys.executable, "-m", "freeride_lab.cli", "launch", *options, "--grace-s", "3"],
        cwd=workdir,
        env=env(),
        capture_output=True,
        text=True,
        timeout=STARTUP_S,
        check=False,
    )
    assert launched.returncode == 0, launched.stderr
    run_dir = Path(launched.stdout.strip())
    try:
        yield run_dir
    finally:
        Session.open(run_dir).stop()
        wait_until(lambda: not run_processes(run_dir), timeout_s=60, what="the run to end")


def keeper_address(run_dir: Path) -> tuple[str, int]:
    host, port = RunDir(run_dir).read_run()["keeper"]["address"]
    return str(host), int(port)


def test_an_observer_of_a_detached_run_commands_it_through_its_keeper(kept: Path) -> None:
    observer = Session.open(kept)
    assert not observer.owner
    task = observer.attach(COUNTING, stage=1, budget_ms=4, options={"step_s": 0.002})
    wait_until(lambda: progress(observer, task["id"]) > 0, timeout_s=STARTUP_S, what="progress")
    detached = observer.detach(task["id"])
    assert detached["state"] == "STOPPED" and detached["detached"]
    log = (kept / "logs" / "keeper.log").read_text()
    assert f"attached {task['id']}" in log and f"detached {task['id']}" in log  # the keeper did


def test_the_keeper_passes_its_refusals_on_unchanged(kept: Path) -> None:
    observer = Session.open(kept)
    with pytest.raises(ValueError, match="unknown side task 'no_such_task'"):
        observer.attach("no_such_task")
    with pytest.raises(ValueError, match="no side task 'nope' in this run"):
        observer.tune("nope", budget_ms=5)
    log = (kept / "logs" / "keeper.log").read_text()
    assert "owner channel: attach refused" in log and "owner channel: tune refused" in log


def test_the_keeper_refuses_a_peer_without_the_secret(kept: Path) -> None:
    with socket.create_connection(keeper_address(kept), timeout=10) as sock:
        sock.settimeout(10)
        header = sock.recv(4)  # the keeper's challenge comes first
        assert len(header) == 4
        sock.recv(struct.unpack("!i", header)[0])
        answer = b"{sha256}" + b"0" * 32  # not the HMAC of the challenge
        sock.sendall(struct.pack("!i", len(answer)) + answer)
        assert sock.recv(1024).startswith(b"\x00\x00\x00\x09#FAILURE#")
    log = kept / "logs" / "keeper.log"
    wait_until(
        lambda: "owner channel: refused a connection" in log.read_text(),
        timeout_s=10,
        what="the keeper to log the refusal",
    )


def test_the_keeper_never_unpickles_even_an_authenticated_peer(kept: Path, tmp_path: Path) -> None:
    planted = tmp_path / "planted"

    class Plant:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, (f"touch {planted}",))

    with Client(keeper_address(kept), authkey=RunDir(kept).secret()) as conn:
        conn.send_bytes(pickle.dumps(Plant()))
        reply = json.loads(conn.recv_bytes())
    assert reply["ok"] is False and "not JSON" in reply["message"]
    assert not planted.exists()
