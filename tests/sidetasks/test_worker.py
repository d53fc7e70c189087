"""The side-task worker as a real process: commands and acks, one task at a time, overrun kills,
SIGSTOP/SIGCONT of imperative tasks, restarts on tune, and clean exits."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from multiprocessing import AuthenticationError
from pathlib import Path
from typing import Any

import psutil
import pytest
from runs import read_events
from tasks_for_tests import read_counter, ref

from freeride_lab.core import events as ev
from freeride_lab.io.rundir import RunDir
from freeride_lab.sidetasks.client import WorkerClient, WorkerProcess, start_worker
from freeride_lab.sidetasks.process import child_env
from freeride_lab.sidetasks.spec import checkpoint_path


@pytest.fixture
def worker(run_dir: RunDir) -> Iterator[WorkerProcess]:
    process = start_worker(run_dir.path, 0)
    yield process
    process.stop()


@pytest.fixture
def client(worker: WorkerProcess) -> WorkerClient:
    return worker.client(timeout_s=60)


def wait_until(condition: Callable[[], bool], *, timeout_s: float = 60.0, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


def events(run_dir: RunDir) -> list[ev.Event]:
    """Worker and task events, in file order (worker first)."""
    return [e for p in sorted(run_dir.events_dir.glob("*.jsonl")) for e in read_events(p)]


def steps(run_dir: RunDir, task_id: str) -> list[ev.SideTaskStep]:
    found = read_events(run_dir.events_dir / f"task-{task_id}.jsonl")
    return [e for e in found if isinstance(e, ev.SideTaskStep)]


def states(run_dir: RunDir, task_id: str) -> list[ev.SideTaskStateChanged]:
    return [
        e
        for e in events(run_dir)
        if isinstance(e, ev.SideTaskStateChanged) and e.task_id == task_id
    ]


def attach_counting(
    client: WorkerClient, task_id: str, gating: str = "bubbles", **limits: Any
) -> ev.ControlAck:
    """Queue a ``Counting`` task (2 ms steps) under a 4 ms step budget, plus ``limits``."""
    limits = {"budget_s": 0.004, **limits}
    return client.attach(ref("Counting"), task_id=task_id, gating=gating, limits=limits)


def has_state(run_dir: RunDir, task_id: str, state: str) -> bool:
    return any(s.state == state for s in states(run_dir, task_id))


class Trainer:
    """Plays the rank: announces bubbles through the worker's edges until a condition holds."""

    def __init__(self, worker: WorkerProcess) -> None:
        self.worker = worker
        self.run_dir = RunDir(worker.run_dir)
        self.step = 0

    def bubble(self, length_s: float = 0.04, predicted_s: float = 0.05) -> None:
        start_ns = time.time_ns()
        self.worker.bubble_start(self.step, 0, start_ns, start_ns + int(predicted_s * 1e9))
        time.sleep(length_s)  # the bubble itself: the scenario, not a synchronisation
        self.worker.bubble_end(self.step, 0, time.time_ns())
        self.step += 1
        time.sleep(0.03)  # training computes

    def until(self, condition: Callable[[], bool], *, what: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s} s of bubbles waiting for {what}")
            self.bubble()

    def until_steps(self, task_id: str, count: int) -> None:
        """Announce bubbles until ``task_id`` has logged at least ``count`` steps."""
        self.until(
            lambda: len(steps(self.run_dir, task_id)) >= count, what=f"{count} steps of {task_id}"
        )


@pytest.fixture
def trainer(worker: WorkerProcess) -> Trainer:
    return Trainer(worker)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_attach_is_acknowledged_and_the_task_steps_in_bubbles(
    run_dir: RunDir, trainer: Trainer, client: WorkerClient
) -> None:
    ack = attach_counting(client, "c1")
    assert (ack.ok, ack.payload["task_id"]) == (True, "c1")
    trainer.until_steps("c1", 3)
    detached = client.detach("c1")
    assert (detached.ok, detached.payload["state"]) == (True, "STOPPED")
    assert checkpoint_path(run_dir.path, "c1").exists()
    wait_until(
        lambda: (
            [a.command for a in events(run_dir) if isinstance(a, ev.ControlAck)]
            == ["attach", "detach"]
        ),
        what="attach and detach acks in the worker's event file",
    )


def test_a_checkpoint_on_request_saves_the_state_and_the_task_steps_on(
    run_dir: RunDir, trainer: Trainer, client: WorkerClient
) -> None:
    from freeride_lab.sidetasks.host.checkpoints import load_checkpoint

    attach_counting(client, "c1")
    trainer.until_steps("c1", 3)
    ack = client.checkpoint("c1")
    assert ack.ok, ack.message
    saved = load_checkpoint(Path(ack.payload["path"]))
    assert saved is not None and saved["progress"] >= 3

    def holds() -> list[ev.SideTaskCheckpoint]:
        return [e for e in events(run_dir) if isinstance(e, ev.SideTaskCheckpoint)]

    wait_until(lambda: bool(holds()), what="the checkpoint's event")  # the sink writes later
    (held,) = holds()
    assert (held.task_id, held.why) == ("c1", "request") and held.start_ns <= held.end_ns
    done = len(steps(run_dir, "c1"))
    trainer.until_steps("c1", done + 2)  # not paused, not stopped: it goes on
    unknown = client.checkpoint("zz")
    assert not unknown.ok and "no task 'zz' here; attached: c1" in unknown.message


def test_only_the_first_task_of_the_queue_takes_bubbles(
    run_dir: RunDir, trainer: Trainer, client: WorkerClient
) -> None:
    attach_counting(client, "first")
    attach_counting(client, "second")
    trainer.until_steps("first", 5)
    assert steps(run_dir, "second") == []
    client.detach("first")
    trainer.until_steps("second", 1)


def test_a_higher_priority_task_preempts_the_active_one_which_resumes_after_it(
    run_dir: RunDir, trainer: Trainer, client: WorkerClient
) -> None:
    attach_counting(client, "low")
    trainer.until_steps("low", 3)
    attach_counting(client, "high", priority=0)
    trainer.until_steps("high", 3)
    preempted = [s for s in states(run_dir, "low") if s.event == "PREEMPT"]
    assert preempted and preempted[0].state == "CREATED"
    low_before = steps(run_dir, "low")
    assert all(s.start_ns < steps(run_dir, "high")[0].start_ns for s in low_before)
    client.detach("high")
    trainer.until_steps("low", len(low_before) + 1)
    progress = [s.progress for s in steps(run_dir, "low")]
    assert sum(progress) == len(progress)  # one count per step, none lost or repeated


def overlaps(a: list[ev.SideTaskStep], b: list[ev.SideTaskStep]) -> list[tuple[int, int]]:
    """The (start of a, start of b) of steps of ``a`` and ``b`` that ran at the same time."""
    return [(x.start_ns, y.start_ns) for x in a for y in b
            if x.start_ns < y.end_ns and y.start_ns < x.end_ns]  # fmt: skip


def test_a_leftovers_task_steps_after_the_main_tasks_last_step_in_a_bubble_never_beside_it(
    run_dir: RunDir, trainer: Trainer, client: WorkerClient
) -> None:
    """Bubbles of 40 ms predicted 50: the main task's 15 ms steps under a 20 ms guard stop
    after two or three, and the leftovers task's 2 ms steps take the rest of each bubble,
    each after the main task's last step in it has ended."""
    client.attach(ref("Counting"), task_id="main", options={"step_s": 0.015},
                  limits={"budget_s": 0.02})  # fmt: skip
    attach_counting(client, "rest", gating="leftovers")
    trainer.until(
        lambda: len(steps(run_dir, "main")) >= 6 and len(steps(run_dir, "rest")) >= 6,
        what="steps of both tasks",
    )
    main, rest = steps(run_dir, "main"), steps(run_dir, "rest")
    assert overlaps(main, rest) == []
    after = 0  # leftovers steps in bubbles the main task stepped in
    for step in rest:
        before = [m for m in main if m.step == step.step]  # the main task's in that bubble
        if before:  # (one the main task's host saw too late for a step went on whole)
            assert step.start_ns >= max(m.end_ns for m in before)
            after += 1
    assert after >= len(rest) // 2, "the leftovers task stepped mostly in bubbles left whole"


def test_bubbles_too_short_for_the_main_tasks_steps_go_whole_to_the_leftovers_task(
    run_dir: RunDir, trainer: Trainer, client: WorkerClient
) -> None:
    attach_counting(client, "main", budget_s=0.2)  # no bubble of 50 ms holds its guard
    attach_counting(client, "rest", gating="leftovers")
    trainer.until(
        lambda: len({s.step for s in steps(run_dir, "rest")}) >= 3, what="three bubbles used"
    )
    assert steps(run_dir, "main") == []


def test_a_leftovers_task_waits_for_a_main_task_and_outlives_it(
    run_dir: RunDir, trainer: Trainer, client: WorkerClient
) -> None:
    """Alone, a leftovers task takes nothing; each main task attached hands on to it, the
    next one through the same file once the first is detached."""
    attach_counting(client, "rest", gating="leftovers")
    wait_until(
        lambda: has_state(run_dir, "rest", "PAUSED"), what="the leftovers task on the device"
    )
    for _ in range(5):
        trainer.bubble()
    assert steps(run_dir, "rest") == []
    for main in ("main-1", "main-2"):
        attach_counting(client, main, budget_s=0.2)
        before = len(steps(run_dir, "rest"))
        trainer.until_steps("rest", before + 3)
        assert client.detach(main).ok
    assert has_state(run_dir, "rest", "RUNNING") and not has_state(run_dir, "rest", "STOPPED")


def test_hung_step_is_killed_under_kill_policy_and_the_worker_goes_on(
    run_dir: RunDir, trainer: Trainer, client: WorkerClient
) -> None:
    client.attach(
        ref("HangingStep"),
        task_id="hang",
        overrun_policy="KILL",
        hang_after_s=0.2,
        limits={"budget_s": 0.001},
    )
    trainer.until(lambda: has_state(run_dir, "hang", "FAILED"), what="the hung task to fail")
    failed = [s for s in states(run_dir, "hang") if s.state == "FAILED"][-1]
    assert failed.reason.startswith("hung: step ")
    assert "over 2 x budget + 0.2 s = 0.202 s" in failed.reason
    attach_counting(client, "next")
    trainer.until_steps("next", 1)


def test_failing_task_leaves_the_worker_and_the_next_task_running(
    run_dir: RunDir, trainer: Trainer, client: WorkerClient
) -> None:
    client.attach(ref("RaisingInStep"), task_id="bad", limits={"budget_s": 0.001})
    attach_counting(client, "good")
    trainer.until_steps("good", 1)
    failed = [s for s in states(run_dir, "bad") if s.state == "FAILED"]
    assert failed[-1].reason == "step raised RuntimeError: boom in step"
    entry = {"task_id": "bad", "state": "FAILED", "exit_code": 1}
    wait_until(lambda: entry in client.status().payload["ended"], what="the failed task reaped")


def test_imperative_task_makes_no_progress_while_sigstopped(
    run_dir: RunDir, worker: WorkerProcess, client: WorkerClient, tmp_path: Path
) -> None:
    counter = tmp_path / "counter"
    ack = client.attach(ref("FreeCounter"), task_id="free", options={"counter_path": str(counter)})
    process = psutil.Process(ack.payload["pid"])
    wait_until(lambda: has_state(run_dir, "free", "PAUSED"), what="the task to be PAUSED")
    step_ns = time.time_ns()
    worker.bubble_start(0, 0, step_ns, step_ns + 60_000_000_000)
    wait_until(lambda: read_counter(counter) > 0, what="the counter to move in a bubble")
    worker.bubble_end(0, 0, time.time_ns())
    wait_until(lambda: process.status() == psutil.STATUS_STOPPED, what="SIGSTOP after the bubble")
    frozen = read_counter(counter)
    time.sleep(0.3)  # an observation window: it must not move while stopped
    assert read_counter(counter) == frozen
    step_ns = time.time_ns()
    worker.bubble_start(1, 0, step_ns, step_ns + 60_000_000_000)
    wait_until(lambda: read_counter(counter) > frozen, what="the counter to move again")
    worker.bubble_end(1, 0, time.time_ns())
    assert client.detach("free").ok


def test_tune_of_memory_restarts_the_process_and_keeps_its_progress(
    run_dir: RunDir, trainer: Trainer, client: WorkerClient
) -> None:
    attached = attach_counting(client, "c1")
    first_pid = attached.payload["pid"]
    trainer.until_steps("c1", 3)
    ack = client.tune("c1", memory_bytes="1GiB")
    assert (ack.ok, ack.payload["restarted"], ack.payload["fields"]) == (
        True,
        True,
        ["memory_bytes"],
    )
    assert ack.payload["pid"] != first_pid
    before = len(steps(run_dir, "c1"))
    trainer.until_steps("c1", before + 1)
    created = [s for s in states(run_dir, "c1") if s.state == "CREATED"]
    assert "restored progress" in created[-1].reason
    assert '"memory_bytes": 1073741824' in created[-1].reason


def test_tune_of_the_budget_needs_no_restart(worker: WorkerProcess, client: WorkerClient) -> None:
    client.attach(ref("Counting"), task_id="c1")
    ack = client.tune("c1", budget_s=0.01)
    assert (ack.ok, ack.payload["restarted"]) == (True, False)


def test_commands_on_unknown_tasks_are_refused_with_the_attached_ones(
    client: WorkerClient,
) -> None:
    client.attach(ref("Counting"), task_id="c1")
    ack = client.detach("zz")
    assert not ack.ok
    assert ack.message == "no task 'zz' here; attached: c1"


def test_tune_names_an_unknown_setting_and_the_valid_ones(client: WorkerClient) -> None:
    client.attach(ref("Counting"), task_id="c1")
    ack = client.tune("c1", memory="1GB")
    assert not ack.ok
    assert "unknown setting(s) memory; valid: memory_bytes, sm_pct" in ack.message


def test_attach_of_a_missing_file_is_refused_with_its_name(client: WorkerClient) -> None:
    ack = client.attach("missing/tasks.py:Task")
    assert not ack.ok
    assert "'missing/tasks.py' does not exist" in ack.message


def test_a_client_without_the_secret_is_refused(worker: WorkerProcess) -> None:
    address = worker.client().address
    with pytest.raises(AuthenticationError, match="digest"):
        WorkerClient(address, b"not the secret").status()


def test_sigint_does_not_stop_the_worker(worker: WorkerProcess, client: WorkerClient) -> None:
    assert worker.popen is not None
    os.kill(worker.popen.pid, signal.SIGINT)
    assert client.status().ok


def test_closing_the_edges_stops_the_tasks_and_the_worker(
    run_dir: RunDir, worker: WorkerProcess, client: WorkerClient
) -> None:
    pid = client.attach(ref("Counting"), task_id="c1").payload["pid"]
    wait_until(lambda: has_state(run_dir, "c1", "PAUSED"), what="the task to be PAUSED")
    worker.stop()
    assert worker.popen is not None and worker.popen.returncode == 0
    assert not _running(pid)
    assert has_state(run_dir, "c1", "STOPPED")
    assert checkpoint_path(run_dir.path, "c1").exists()


def test_sigterms_of_a_stop_end_the_worker_cleanly_not_killed(
    run_dir: RunDir, worker: WorkerProcess, client: WorkerClient
) -> None:
    """Stopping a run signals its whole tree, some processes more than once: the worker stops
    its tasks on the first SIGTERM and a later one, while it exits, must not turn that clean
    end into "killed by SIGTERM"."""
    pid = client.attach(ref("Counting"), task_id="c1").payload["pid"]
    wait_until(lambda: has_state(run_dir, "c1", "PAUSED"), what="the task to be PAUSED")
    assert worker.popen is not None
    deadline = time.monotonic() + 30
    while worker.popen.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(ProcessLookupError):  # it may be gone between poll and kill
            os.kill(worker.popen.pid, signal.SIGTERM)
        time.sleep(0.002)
    assert worker.popen.wait(30) == 0
    assert not _running(pid)
    assert has_state(run_dir, "c1", "STOPPED")


def test_worker_exits_when_its_parent_dies(run_dir: RunDir) -> None:
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import time
                from freeride_lab.sidetasks.client import start_worker
                worker = start_worker({str(run_dir.path)!r}, 0)
                print(worker.popen.pid, flush=True)
                time.sleep(3600)
                """
            ),
        ],
        env=child_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    worker_pid = int(parent.stdout.readline())
    WorkerClient.from_run_dir(run_dir.path, 0, timeout_s=60)  # it is up
    parent.kill()
    parent.wait()
    wait_until(lambda: not _running(worker_pid), what="the orphaned worker to exit")
    info = run_dir.path / "workers" / "worker-0.json"
    assert not info.exists(), json.loads(info.read_text())


def test_a_stop_command_is_acknowledged_before_the_worker_exits(run_dir: RunDir) -> None:
    """The ack must not be lost in the worker's exit (it once was, about one stop in two)."""
    for rank in range(5):
        process = start_worker(run_dir.path, rank)
        try:
            ack = process.client(timeout_s=60).stop()
            assert (ack.command, ack.ok) == ("stop", True)
            assert process.popen is not None and process.popen.wait(30) == 0
        finally:
            process.stop()
