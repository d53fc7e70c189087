"""The task process: steps only inside bubbles, checkpoints, failures that stay in the process.

Each test drives a real ``task_host`` process with an ``EdgeWriter`` and talks to it over its
control channel as the worker would (``TaskProcess``). Timing assertions only compare event
times with the edges the test wrote, never with wall-clock budgets.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from runs import serve_until, start_task_host
from tasks_for_tests import ref

from freeride_lab.core import events as ev
from freeride_lab.core.budget import OverrunPolicy
from freeride_lab.core.sidetask_state import SideTaskState
from freeride_lab.io.rundir import RunDir
from freeride_lab.sidetasks.edges import EdgeWriter
from freeride_lab.sidetasks.loader import load_task_class, parse_task_ref
from freeride_lab.sidetasks.process import TaskProcess
from freeride_lab.sidetasks.spec import TaskSpec, checkpoint_path, profile_path

R18 = "freeride_lab.tasks.vision:ResNet18Task"
S = SideTaskState


def start_active(
    run_dir: RunDir, hosts: list[TaskProcess], task: str, **fields: Any
) -> TaskProcess:
    """``start_task_host``, then activate the task: it waits for bubbles (PAUSED)."""
    proc = start_task_host(run_dir, hosts, task, **fields)
    serve_until(proc, S.CREATED)
    assert proc.request({"cmd": "activate"})
    serve_until(proc, S.PAUSED)
    return proc


def stop(proc: TaskProcess) -> int:
    assert proc.request({"cmd": "stop", "reason": "test"})
    proc.wait_exit(30)
    assert proc.proc is not None
    return proc.proc.returncode


def wait_exit(proc: TaskProcess, timeout_s: float = 60.0) -> int:
    assert proc.proc is not None
    return proc.proc.wait(timeout_s)


def drive_bubbles(
    edges: EdgeWriter,
    count: int,
    *,
    length_s: float = 0.04,
    predicted_s: float = 0.05,
    gap_s: float = 0.05,
    first_step: int = 0,
    written: list[int] | None = None,
) -> list[tuple[int, int]]:
    """Announce ``count`` bubbles (each really ``length_s`` long); their (start, end) in ns.
    ``written`` gets the time each end edge was on the file: a host cannot see an end before."""
    bubbles = []
    for step in range(first_step, first_step + count):
        start_ns = time.time_ns()
        edges.bubble_start(step, 0, start_ns, start_ns + int(predicted_s * 1e9))
        time.sleep(length_s)  # the bubble itself: the scenario, not a synchronisation
        end_ns = time.time_ns()
        edges.bubble_end(step, 0, end_ns)
        if written is not None:
            written.append(time.time_ns())
        bubbles.append((start_ns, end_ns))
        time.sleep(gap_s)  # training computes
    return bubbles


def task_events(run_dir: RunDir, task_id: str) -> list[ev.Event]:
    path = run_dir.events_dir / f"task-{task_id}.jsonl"
    return [ev.from_json(line) for line in path.read_text().splitlines() if line]


def steps_of(events: list[ev.Event]) -> list[ev.SideTaskStep]:
    return [e for e in events if isinstance(e, ev.SideTaskStep)]


def states_of(events: list[ev.Event]) -> list[ev.SideTaskStateChanged]:
    return [e for e in events if isinstance(e, ev.SideTaskStateChanged)]


def failed_state(run_dir: RunDir, proc: TaskProcess) -> ev.SideTaskStateChanged:
    """Wait for the task process to exit 1; its last state change, which must be FAILED."""
    assert wait_exit(proc) == 1
    last = states_of(task_events(run_dir, "t1"))[-1]
    assert last.state == "FAILED", last
    return last


def bubble_of(step: ev.SideTaskStep, bubbles: list[tuple[int, int]]) -> tuple[int, int]:
    """The last bubble that started before the step did."""
    started = [b for b in bubbles if b[0] <= step.start_ns]
    assert started, f"step at {step.start_ns} began before any bubble"
    return started[-1]


def test_iterative_steps_lie_inside_bubbles_except_counted_overruns(
    run_dir: RunDir, edges: EdgeWriter, hosts: list[TaskProcess]
) -> None:
    proc = start_active(
        run_dir, hosts, ref("Counting"), options={"step_s": 0.003}, limits={"budget_s": 0.005}
    )
    written: list[int] = []  # when each end edge was on the file (after its stamp)
    bubbles = drive_bubbles(edges, 6, written=written)
    assert stop(proc) == 0
    steps = steps_of(task_events(run_dir, "t1"))
    assert steps
    for step in steps:
        bubble = bubble_of(step, bubbles)
        end_ns, visible_ns = bubble[1], written[bubbles.index(bubble)]
        if step.end_ns <= end_ns:
            assert step.overrun_ns == 0
        elif step.end_ns <= visible_ns:  # ended before the end was there to be seen
            assert step.overrun_ns in (0, step.end_ns - end_ns)
        else:
            assert step.overrun_ns == step.end_ns - end_ns


def test_the_first_step_in_a_bubble_says_when_its_host_saw_the_bubble_start(
    run_dir: RunDir, edges: EdgeWriter, hosts: list[TaskProcess]
) -> None:
    """The hops of the signal latency: bubble start → the host saw it (``seen_ns``) → the
    step's start. Only a bubble's first step answered an edge; the others carry 0."""
    proc = start_active(
        run_dir, hosts, ref("Counting"), options={"step_s": 0.003}, limits={"budget_s": 0.005}
    )
    bubbles = drive_bubbles(edges, 6)
    assert stop(proc) == 0
    steps = steps_of(task_events(run_dir, "t1"))
    firsts = {}
    for step in steps:
        firsts.setdefault(bubble_of(step, bubbles), step)
    assert len(firsts) >= 2, "the task stepped in too few bubbles to tell"
    for bubble, first in firsts.items():
        assert bubble[0] <= first.seen_ns <= first.start_ns, (bubble, first)
    later = [s for s in steps if s not in firsts.values()]
    assert later and all(s.seen_ns == 0 for s in later)


def in_process_host(
    run_dir: RunDir,
    tmp_path: Path,
    task: Any,
    limits: dict[str, Any] | None = None,
    outlived: str = "stop",
    leftovers_file: str = "",
    edge_file: str = "",
    sink_name: str = "task.jsonl",
    device: str = "cpu",
    peers: bool = False,
) -> tuple[Any, Any]:
    """A ``TaskHost`` in this process, driving ``task`` (PAUSED, its edge reader open), and
    the sink its events go to (``tmp_path / sink_name``; close it before reading). Its
    spec names ``Counting``, which it never loads: ``task`` is given. The host moves the
    task's state onto ``device`` (its INIT), as a task process does onto its GPU."""
    from freeride_lab.core.sidetask_state import SideTaskEvent
    from freeride_lab.io.sink import EventSink
    from freeride_lab.sidetasks.host.task_host import TaskHost
    from freeride_lab.sidetasks.spec import HostSpec

    spec = TaskSpec.from_dict(
        {"task": ref("Counting"), "task_id": "t1",
         "limits": {"budget_s": 0.002} if limits is None else limits}
    )  # fmt: skip
    sink = EventSink(tmp_path / sink_name)
    host_spec = HostSpec(
        task=spec, run_dir=str(run_dir.path), rank=0, stage=0,
        leftovers_file=leftovers_file, edge_file=edge_file, device=device,
    )  # fmt: skip
    host = TaskHost(host_spec, conn=None, sink=sink, outlived=outlived, peers=peers)
    host._send = lambda message: None  # type: ignore[method-assign]
    host.task = task
    for event in (SideTaskEvent.CREATE, SideTaskEvent.INIT):
        assert host._apply(event)
    assert host._open_reader()
    return host, sink


def test_a_bubbles_first_step_is_launched_before_its_start_is_announced(
    run_dir: RunDir, edges: EdgeWriter, tmp_path: Path
) -> None:
    """[Note: launch, then tell]: between the edge and the first ``step()`` the host sends
    the worker nothing; RUNNING follows the launch, keeps its time and still comes first in
    the task's events, before the step's record and the PAUSE."""
    from tasks_for_tests import Counting

    order: list[str] = []

    class Recording(Counting):
        def step(self) -> float:
            order.append("step")
            return super().step()

    host, sink = in_process_host(run_dir, tmp_path, Recording(step_s=0.001, limit=None))
    host._send = lambda message: order.append(f"send {message.get('state')}")  # type: ignore[method-assign]
    now = time.time_ns()
    edges.bubble_start(0, 0, now, now + 50_000_000)
    edge = host._wait_for_edge(1.0)
    assert edge is not None and edge.in_bubble
    host._run_bubble(edge)
    sink.close()
    assert order[:2] == ["step", "send RUNNING"], order
    assert order[-1] == "send PAUSED"
    events = task_events_at(tmp_path / "task.jsonl")[2:]  # after CREATED and PAUSED
    kinds = [(type(e).__name__, getattr(e, "state", "")) for e in events]
    assert kinds[0] == ("SideTaskStateChanged", "RUNNING")
    assert kinds[-1] == ("SideTaskStateChanged", "PAUSED")
    running, first = events[0], steps_of(events)[0]
    assert isinstance(running, ev.SideTaskStateChanged)
    assert first.seen_ns <= running.t_ns <= first.start_ns  # stamped when it happened


def test_a_steps_start_is_stamped_at_its_launch_after_the_hosts_decisions(
    run_dir: RunDir, edges: EdgeWriter, tmp_path: Path
) -> None:
    """The signal latency ends at the step's start: the host's choice of size and group
    count, and the watchdog's mark, come before it, so they count in the latency rather than
    in the step."""
    from tasks_for_tests import Sized

    host, sink = in_process_host(run_dir, tmp_path, Sized(unit_s=0.001), {"budget_s": 0.004})
    decided: list[int] = []
    fitting_size = host._fitting_size

    def deciding(*args: Any) -> Any:
        size = fitting_size(*args)
        decided.append(host.reader.now_ns())
        return size

    host._fitting_size = deciding
    now = time.time_ns()
    edges.bubble_start(0, 0, now, now + 30_000_000)
    edge = host._wait_for_edge(1.0)
    assert edge is not None
    host._run_bubble(edge)
    sink.close()
    steps = steps_of(task_events_at(tmp_path / "task.jsonl"))
    assert len(steps) >= 2 and len(decided) >= len(steps)
    for step, decided_ns in zip(steps, decided, strict=False):
        assert decided_ns <= step.start_ns < step.end_ns
    # each records the guard its bubble had to clear: the smallest step's, at most the budget
    assert all(0 < step.guard_ns <= 4_000_000 for step in steps)


def test_a_spinning_host_tells_when_it_expected_the_bubble_and_how_long_it_spun(
    run_dir: RunDir, edges: EdgeWriter, tmp_path: Path
) -> None:
    """A host that spins for bubble starts (GPU runs) waits across its clock's spin window;
    the bubble's first step records the start the clock expected and the window, the
    data that says how many starts a spin catches. Later steps carry 0."""
    from tasks_for_tests import Counting

    host, sink = in_process_host(run_dir, tmp_path, Counting(step_s=0.001, limit=None))
    now = host.reader.now_ns()
    expected, window = now + 2_000_000, (now + 1_000_000, now + 3_000_000)

    class Clock:
        def spin_window(self, lead_ns: int, most_ns: int) -> tuple[int, int]:
            assert (lead_ns, most_ns) == (300_000, 4_000_000)
            return window

        def bubble_started(self, **edge: Any) -> int:
            return expected

    host._clock = Clock()
    host._spin_lead_s, host._spin_most_s = 300e-6, 4e-3  # as FREERIDE_SPIN_MOST_US=4000 sets
    writer = threading.Timer(0.002, lambda: edges.bubble_start(
        0, 0, host.reader.now_ns(), host.reader.now_ns() + 20_000_000))  # fmt: skip
    writer.start()
    edge = host._wait_for_edge(1.0)
    writer.join()
    assert edge is not None and edge.in_bubble
    host._run_bubble(edge)
    sink.close()
    steps = steps_of(task_events_at(tmp_path / "task.jsonl"))
    assert len(steps) >= 2
    assert (steps[0].expected_ns, steps[0].spin_from_ns, steps[0].spin_until_ns) == (
        expected,
        *window,
    )
    assert steps[0].seen_ns >= edge.start_ns
    assert all((s.seen_ns, s.expected_ns, s.spin_from_ns, s.spin_until_ns) == (0, 0, 0, 0)
               for s in steps[1:])  # fmt: skip


@pytest.mark.usefixtures("edges")
def test_guards_of_smaller_steps_follow_the_newest_step_times(
    run_dir: RunDir, tmp_path: Path
) -> None:
    """A smaller step's guard is the budget scaled by the sizes' recent medians; kept between
    steps, it changes as soon as new step times change those medians."""
    from tasks_for_tests import Sized

    host, sink = in_process_host(run_dir, tmp_path, Sized(unit_s=0.001), {"budget_s": 0.040})
    host._top_size = 4
    for _ in range(3):
        host._note_size_time(4, 1, 20_000_000)
        host._note_size_time(1, 1, 5_000_000)
    assert host._guard_ns(1) == 10_000_000  # 40 ms x 5 / 20
    assert host._guard_ns(1) == 10_000_000
    for _ in range(4):
        host._note_size_time(1, 1, 10_000_000)  # quarter steps slowed down
    assert host._guard_ns(1) == 20_000_000
    assert host._guard_ns(4) == 40_000_000
    sink.close()


def task_events_at(path: Path) -> list[ev.Event]:
    return [ev.from_json(line) for line in path.read_text().splitlines() if line]


def test_stepping_stops_at_an_observed_end_before_the_predicted_one(
    run_dir: RunDir, edges: EdgeWriter, hosts: list[TaskProcess]
) -> None:
    proc = start_active(run_dir, hosts, ref("Counting"), options={"step_s": 0.002})
    bubbles = drive_bubbles(edges, 3, length_s=0.03, predicted_s=10.0, gap_s=0.2)
    assert stop(proc) == 0
    steps = steps_of(task_events(run_dir, "t1"))
    assert steps
    late = [s for s in steps if s.start_ns > bubble_of(s, bubbles)[1] and s.overrun_ns == 0]
    assert late == []


def test_stop_reads_the_last_words_of_a_process_that_exited_first(
    run_dir: RunDir, hosts: list[TaskProcess]
) -> None:
    """A process that stopped and exited before its worker's stop (a stop command already
    sent, a task that finished) has its STOPPED state on the channel, unread: the stop takes
    it, so the worker's view of the task is its last state, not the one before."""
    proc = start_active(run_dir, hosts, ref("Counting"))
    assert proc.send({"cmd": "stop", "reason": "test"})
    assert wait_exit(proc) == 0  # exited; nothing read from its channel since PAUSED
    assert proc.state is S.PAUSED
    seen: list[dict[str, Any]] = []
    proc.stop("test", on_message=lambda _, m: seen.append(m))
    assert proc.state is S.STOPPED
    assert all(m.get("type") not in ("ack", "state") for m in seen)


def test_stop_saves_a_checkpoint_that_a_new_host_restores(
    run_dir: RunDir, edges: EdgeWriter, hosts: list[TaskProcess]
) -> None:
    first = start_active(run_dir, hosts, ref("Counting"), limits={"budget_s": 0.004})
    drive_bubbles(edges, 3)
    assert stop(first) == 0
    saved = json.loads(checkpoint_path(run_dir.path, "t1").read_text())["progress"]
    assert saved > 0

    second = start_active(run_dir, hosts, ref("Counting"), limits={"budget_s": 0.004})
    drive_bubbles(edges, 3, first_step=3)
    assert stop(second) == 0
    created = [s for s in states_of(task_events(run_dir, "t1")) if s.state == "CREATED"]
    assert f"restored progress {saved:g} iterations" in created[-1].reason
    assert json.loads(checkpoint_path(run_dir.path, "t1").read_text())["progress"] > saved


def test_a_periodic_checkpoint_that_holds_the_host_is_logged_with_its_length(
    run_dir: RunDir, edges: EdgeWriter, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A large task's periodic save keeps its host from its bubbles (and from handing any
    on); the task's log says how long, so missed bubbles can be told from it."""
    from tasks_for_tests import Counting

    class SlowToSave(Counting):
        def state_dict(self) -> dict[str, Any]:
            time.sleep(0.08)
            return super().state_dict()

    host, sink = in_process_host(run_dir, tmp_path, SlowToSave())
    host.task.progress = 3.0
    _due(host)
    with caplog.at_level("INFO", logger="freeride_lab.sidetasks.host"):
        host._maybe_checkpoint()
    host._finish_writing()
    sink.close()
    said = [r.getMessage() for r in caplog.records if "periodic checkpoint" in r.getMessage()]
    assert len(said) == 1
    assert "task t1: taking the state for a periodic checkpoint took 0." in said[0]
    assert checkpoint_path(run_dir.path, "t1").exists()


class _HeldWrites:
    """Stands in for ``save_checkpoint``: each write waits until ``go`` is set (or raises
    ``error``), then writes; the states it was given are kept."""

    def __init__(self, error: BaseException | None = None) -> None:
        from freeride_lab.sidetasks.host import checkpoints

        self.go, self.error, self.states = threading.Event(), error, []
        self._save = checkpoints.save_checkpoint

    def __call__(self, path: Path, state: dict[str, Any]) -> None:
        self.states.append(state)
        assert self.go.wait(30)
        if self.error is not None:
            raise self.error
        self._save(path, state)


def _saved(run_dir: RunDir) -> dict[str, Any]:
    """The task's checkpoint on disk (torch's format once torch is imported, else JSON)."""
    from freeride_lab.sidetasks.host.checkpoints import load_checkpoint

    state = load_checkpoint(checkpoint_path(run_dir.path, "t1"))
    assert state is not None
    return state


def _due(host: Any) -> None:
    host._last_checkpoint_s = time.monotonic() - host.spec.task.checkpoint_interval_s - 1


def _returns(call: Any) -> bool:
    """Whether ``call()`` returns within 10 s (it runs on a thread of its own)."""
    done = threading.Thread(target=call, daemon=True)
    done.start()
    done.join(10)
    return not done.is_alive()


def _due_at_progress_3(run_dir: RunDir, tmp_path: Path) -> tuple[Any, Any]:
    """An in-process host of a counting task at progress 3, its periodic checkpoint due."""
    from tasks_for_tests import Counting

    host, sink = in_process_host(run_dir, tmp_path, Counting())
    host.task.progress = 3.0
    _due(host)
    return host, sink


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> _HeldWrites:
    from freeride_lab.sidetasks.host import checkpoints

    writes = _HeldWrites()
    monkeypatch.setattr(checkpoints, "save_checkpoint", writes)
    return writes


def test_a_periodic_checkpoint_is_written_while_the_host_goes_back_to_its_bubbles(
    run_dir: RunDir, edges: EdgeWriter, tmp_path: Path, held: _HeldWrites
) -> None:
    host, sink = _due_at_progress_3(run_dir, tmp_path)
    assert _returns(host._maybe_checkpoint)  # the write waits; the host does not
    host.task.progress = 7.0  # it steps on meanwhile
    _due(host)
    host._maybe_checkpoint()  # due again, one still being written: none started
    assert len(held.states) == 1
    held.go.set()
    host._finish_writing()
    sink.close()
    assert _saved(run_dir)["progress"] == 3.0


def test_a_stop_checkpoint_waits_for_a_periodic_write_and_leaves_the_newest_state(
    run_dir: RunDir, edges: EdgeWriter, tmp_path: Path, held: _HeldWrites
) -> None:
    host, sink = _due_at_progress_3(run_dir, tmp_path)
    host._maybe_checkpoint()
    host.task.progress = 9.0
    stopping = threading.Thread(target=host._checkpoint, args=("stop",), daemon=True)
    stopping.start()
    stopping.join(0.2)
    assert stopping.is_alive()  # behind the periodic write
    held.go.set()
    stopping.join(10)
    sink.close()
    assert [s["progress"] for s in held.states] == [3.0, 9.0]
    assert _saved(run_dir)["progress"] == 9.0
    # each hold is an event: the periodic one's ends before its write; the stop's after
    periodic, stop = (
        e for e in task_events_at(tmp_path / "task.jsonl") if isinstance(e, ev.SideTaskCheckpoint)
    )
    assert (periodic.why, stop.why, periodic.task_id) == ("periodic", "stop", "t1")
    assert periodic.start_ns <= periodic.end_ns <= stop.start_ns <= stop.end_ns


def test_a_task_whose_state_is_live_is_copied_before_the_writer_saves_it(
    run_dir: RunDir, edges: EdgeWriter, tmp_path: Path, held: _HeldWrites
) -> None:
    import torch
    from tasks_for_tests import Counting

    class Live(Counting):
        def __init__(self) -> None:
            super().__init__()
            self.weights = torch.zeros(4)

        def state_dict(self) -> dict[str, Any]:
            return {"progress": self.progress, "weights": self.weights}  # the live tensor

    class Copied(Live):
        state_dict_is_copy = True

    host, sink = in_process_host(run_dir, tmp_path, Live())
    host.task.progress = 1.0
    _due(host)
    host._maybe_checkpoint()
    host.task.weights.add_(1.0)  # the next step, in place, while the writer waits
    held.go.set()
    host._finish_writing()
    assert torch.equal(held.states[0]["weights"], torch.zeros(4))
    assert torch.equal(_saved(run_dir)["weights"], torch.zeros(4))

    host.task = Copied()  # says its state is a copy: written as it is
    host.task.progress = 2.0
    _due(host)
    host._maybe_checkpoint()
    host._finish_writing()
    sink.close()
    assert held.states[1]["weights"] is host.task.weights


def test_a_checkpoint_on_request_waits_for_an_imperative_task_to_pause(
    run_dir: RunDir, edges: EdgeWriter, tmp_path: Path
) -> None:
    from types import SimpleNamespace

    from tasks_for_tests import Counting

    host, sink = in_process_host(run_dir, tmp_path, Counting())
    host._driver = SimpleNamespace(started=True, parked=False)  # run() between pause points
    ok, why = host._command("checkpoint", {"cmd": "checkpoint"})
    assert (ok, why) == (False, "run() is between pause points; its state is saved once it pauses")
    assert not checkpoint_path(run_dir.path, "t1").exists()
    host._driver = SimpleNamespace(started=True, parked=True)
    ok, where = host._command("checkpoint", {"cmd": "checkpoint"})
    sink.close()
    assert ok and Path(where).exists()


def test_the_task_changes_state_only_once_a_checkpoints_copies_have_landed(
    run_dir: RunDir, edges: EdgeWriter, tmp_path: Path
) -> None:
    from tasks_for_tests import Counting

    from freeride_lab.core.sidetask_state import SideTaskEvent

    class Copies:  # stands in for copies still in flight on a GPU
        waits = 0

        def wait(self) -> None:
            Copies.waits += 1

    host, sink = in_process_host(run_dir, tmp_path, Counting())
    host._copies = Copies()
    assert host._apply(SideTaskEvent.START)  # it may step now: its copies were waited for
    assert (Copies.waits, host._copies) == (1, None)
    assert host._apply(SideTaskEvent.PAUSE)
    sink.close()
    assert Copies.waits == 1


@pytest.mark.gpu
def test_a_periodic_checkpoints_gpu_copies_are_waited_for_off_the_host_and_before_a_step(
    run_dir: RunDir, edges: EdgeWriter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from tasks_for_tests import Counting

    from freeride_lab.core.sidetask_state import SideTaskEvent

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU; this machine has none")

    class Large(Counting):  # 256 MB: its copy to the host takes milliseconds
        def __init__(self) -> None:
            super().__init__()
            self.weights = torch.zeros(64 << 20, device="cuda")

        def state_dict(self) -> dict[str, Any]:
            return {"progress": self.progress, "weights": self.weights}

    waited_on: list[str] = []
    for kind in (torch.cuda.Event, torch.cuda.Stream):
        wait = kind.synchronize

        def recorded(self: Any, _wait: Any = wait) -> None:
            waited_on.append(threading.current_thread().name)
            _wait(self)

        monkeypatch.setattr(kind, "synchronize", recorded)
    host, sink = in_process_host(run_dir, tmp_path, Large(), device="cuda:0")
    assert host.task.weights.is_cuda  # on a "cpu" host, its INIT would move them off the GPU
    torch.cuda.synchronize()
    host.task.progress = 1.0
    _due(host)
    host._maybe_checkpoint()
    assert host._writer is not None, "no periodic checkpoint was started"
    assert host._copies, "the checkpoint queued no GPU copy"
    assert "MainThread" not in waited_on  # the host queued the copies and went on
    assert host._apply(SideTaskEvent.START)
    side = torch.cuda.Stream()  # a step on a stream of the task's own: nothing orders it
    with torch.cuda.stream(side):
        host.task.weights.fill_(1.0)
    host._finish_writing()
    sink.close()
    assert "task-checkpoint" in waited_on
    assert int(_saved(run_dir)["weights"].count_nonzero()) == 0


def test_a_periodic_write_that_fails_fails_the_task_at_the_hosts_next_look(
    run_dir: RunDir, edges: EdgeWriter, tmp_path: Path, held: _HeldWrites
) -> None:

    held.error = OSError(28, "No space left on device")
    held.go.set()
    host, sink = _due_at_progress_3(run_dir, tmp_path)
    host._maybe_checkpoint()
    assert host._writer is not None
    host._writer.join(10)
    with pytest.raises(OSError, match="No space left"):
        host._maybe_checkpoint()
    sink.close()
    assert host._where == "writing a periodic checkpoint"


def test_error_in_setup_fails_the_task_and_its_process_only(
    run_dir: RunDir, hosts: list[TaskProcess]
) -> None:
    proc = start_task_host(run_dir, hosts, ref("RaisingInSetup"))
    failed = failed_state(run_dir, proc)
    assert failed.reason == "setup raised ValueError: boom in setup"
    assert "boom in setup" in failed.traceback


def test_error_in_step_fails_the_task_with_its_reason(
    run_dir: RunDir, edges: EdgeWriter, hosts: list[TaskProcess]
) -> None:
    proc = start_active(run_dir, hosts, ref("RaisingInStep"), limits={"budget_s": 0.001})
    drive_bubbles(edges, 2)
    assert failed_state(run_dir, proc).reason == "step raised RuntimeError: boom in step"
    # the START held back while the step ran is announced before the failure, with its time
    states = states_of(task_events(run_dir, "t1"))
    assert [x.state for x in states][-2:] == ["RUNNING", "FAILED"]
    assert states[-2].t_ns <= states[-1].t_ns


def test_memory_hog_fails_out_of_memory_under_its_cpu_cap(
    run_dir: RunDir, edges: EdgeWriter, hosts: list[TaskProcess]
) -> None:
    proc = start_active(
        run_dir, hosts, ref("MemoryHog"), limits={"memory_bytes": "256MiB", "budget_s": 0.001}
    )
    assert proc.proc is not None
    deadline, step = time.monotonic() + 60.0, 0
    while proc.proc.poll() is None and time.monotonic() < deadline:  # steps until it runs out
        drive_bubbles(edges, 1, length_s=0.2, predicted_s=0.25, first_step=step)
        step += 1
    assert failed_state(run_dir, proc).reason.startswith("out of memory:")


def test_cpu_task_reports_that_gpu_limits_do_not_apply(
    run_dir: RunDir, hosts: list[TaskProcess]
) -> None:
    proc = start_task_host(run_dir, hosts, ref("Counting"), limits={"sm_pct": 50})
    serve_until(proc, S.CREATED)
    assert stop(proc) == 0
    created = next(s for s in states_of(task_events(run_dir, "t1")) if s.state == "CREATED")
    assert "cpu: memory cap via RLIMIT_AS; SM share and priority do not apply" in created.reason


def test_unknown_class_fails_with_the_classes_that_exist(
    run_dir: RunDir, hosts: list[TaskProcess]
) -> None:
    failed = failed_state(run_dir, start_task_host(run_dir, hosts, ref("Nope")))
    assert "has no class 'Nope'" in failed.reason
    assert "Counting" in failed.reason


# --- loader and specs (no processes) ------------------------------------------------------


def test_the_loader_knows_no_names_and_points_to_the_registry() -> None:
    with pytest.raises(ValueError, match=r"'resnet18' is not a 'where:Class'.*tasks\.registry"):
        load_task_class("resnet18")
    assert load_task_class("freeride_lab.tasks.graph:SGDMFTask").__name__ == "SGDMFTask"


def test_task_class_loads_from_a_file_path() -> None:
    cls = load_task_class(ref("Counting"))
    assert cls.__name__ == "Counting"


def test_loading_rejects_a_class_that_is_not_a_side_task(tmp_path: Path) -> None:
    source = tmp_path / "plain.py"
    source.write_text("class Plain:\n    pass\n")
    with pytest.raises(ValueError, match="Plain is not a subclass of IterativeSideTask"):
        load_task_class(f"{source}:Plain")


def test_loading_names_a_missing_file() -> None:
    with pytest.raises(ValueError, match=r"'nowhere/tasks\.py' does not exist"):
        load_task_class("nowhere/tasks.py:Task")


def test_loading_names_an_unfindable_module() -> None:
    with pytest.raises(ValueError, match=r"module 'no_such_pkg\.tasks' cannot be found"):
        load_task_class("no_such_pkg.tasks:Task")


def test_reference_without_a_class_lists_the_forms() -> None:
    with pytest.raises(ValueError, match=r"'resnet19' is not a 'where:Class' reference; give"):
        parse_task_ref("resnet19")


def test_task_spec_round_trips_through_json() -> None:
    spec = TaskSpec.from_dict({"task": R18, "task_id": "r18", "limits": {"sm_pct": 50}})
    assert TaskSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_task_spec_names_unknown_keys_and_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"'budget'.*valid: task, task_id"):
        TaskSpec.from_dict({"task": R18, "budget": 1})


def test_overrun_policy_is_matched_without_regard_to_case() -> None:
    spec = TaskSpec.from_dict({"task": R18, "overrun_policy": "kill"})
    assert spec.overrun_policy is OverrunPolicy.KILL
    with pytest.raises(ValueError, match=r"overrun_policy='explode' is unknown; valid: WARN"):
        TaskSpec.from_dict({"task": R18, "overrun_policy": "explode"})


# -- a step ends when its GPU work does ---------------------------------------------------------


class _RecordingCuda:
    def __init__(self) -> None:
        self.synced: list[str] = []

    def synchronize(self, device: str) -> None:
        self.synced.append(device)


@pytest.mark.parametrize(
    ("device", "synced"), [("cuda:0", ["cuda:0"]), ("cuda", ["cuda"]), ("cpu", [])]
)
def test_a_cuda_step_waits_for_its_queued_kernels(
    monkeypatch: pytest.MonkeyPatch, device: str, synced: list[str]
) -> None:
    import sys
    import types

    from freeride_lab.sidetasks.api import IterativeSideTask
    from freeride_lab.sidetasks.host import iterative

    cuda = _RecordingCuda()
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    task = IterativeSideTask()
    task.device = device
    iterative._wait_for_device(task)
    assert cuda.synced == synced


@pytest.mark.parametrize(
    ("device", "override", "lead_s"),
    [
        ("cuda:0", None, 300e-6),
        ("cpu", None, 0.0),
        ("cuda:0", "0", 0.0),
        ("cpu", "150", 150e-6),
        ("cuda:0", "many", 300e-6),
        ("cuda:0", "inf", 300e-6),
    ],
)
def test_only_gpu_runs_spin_for_bubble_starts_unless_told(
    device: str, override: str | None, lead_s: float
) -> None:
    from freeride_lab.sidetasks.host import base

    assert base._spin_lead_s(device, override) == pytest.approx(lead_s)


@pytest.mark.parametrize(("override", "most_s"), [(None, 2e-3), ("4000", 4e-3), ("x", 2e-3)])
def test_the_spin_cap_comes_from_the_environment_when_set(
    monkeypatch: pytest.MonkeyPatch, override: str | None, most_s: float
) -> None:
    from freeride_lab.sidetasks.host import base

    if override is None:
        monkeypatch.delenv(base.SPIN_MOST_ENV, raising=False)
    else:
        monkeypatch.setenv(base.SPIN_MOST_ENV, override)
    assert base._env_us(base.SPIN_MOST_ENV, 2e-3) == pytest.approx(most_s)


# -- step groups ------------------------------------------------------------------------------


@pytest.mark.parametrize("group_ms", [1.0, 0.0])
def test_short_steps_run_in_groups_that_stay_inside_their_bubble(
    run_dir: RunDir, edges: EdgeWriter, hosts: list[TaskProcess], group_ms: float
) -> None:
    """0.1 ms steps in 30 ms bubbles: with the run's step_group_ms = 1 ms the host launches
    several per device wait and writes one record per group; with 0, one per step. Either way
    every call is counted once and no group starts a call after its bubble was seen to end."""
    run_dir.write_json(run_dir.run_json, {"config": {"runtime": {"step_group_ms": group_ms}}})
    proc = start_active(
        run_dir, hosts, ref("Counting"), options={"step_s": 0.0001}, limits={"budget_s": 0.002}
    )
    bubbles = drive_bubbles(edges, 6, length_s=0.03, predicted_s=0.03, gap_s=0.05)
    assert stop(proc) == 0
    events = task_events(run_dir, "t1")
    steps = steps_of(events)
    assert steps
    sizes = [s.progress for s in steps]
    assert [s.calls for s in steps] == sizes  # each record says how many calls it covers
    if group_ms:
        assert max(sizes) > 1  # calls were grouped
        assert sum(sizes) > len(steps)
    else:
        assert set(sizes) == {1.0}
    for step in steps:
        _, end_ns = bubble_of(step, bubbles)
        assert step.start_ns < end_ns  # every group began inside its bubble
        if step.end_ns <= end_ns:
            assert step.overrun_ns == 0


# -- step sizes ------------------------------------------------------------------------------


def test_a_bubble_is_filled_coarse_to_fine_with_the_sizes_a_task_offers(
    run_dir: RunDir, edges: EdgeWriter, hosts: list[TaskProcess]
) -> None:
    """Steps of 1, 2 or 4 units (5 to 12.5 ms) in 50 ms bubbles under a 15 ms budget for the
    largest: each bubble starts with 4-unit steps and ends in smaller ones where a 4-unit step
    no longer fits, every step begins inside its bubble, and the profile is of 4-unit steps."""
    proc = start_active(
        run_dir, hosts, ref("Sized"), options={"unit_s": 0.005}, limits={"budget_s": 0.015}
    )
    path = profile_path(run_dir.path, "t1")
    bubbles = drive_bubbles(edges, 12, length_s=0.05, predicted_s=0.05, gap_s=0.03)
    assert stop(proc) == 0
    steps = steps_of(task_events(run_dir, "t1"))
    by_bubble: dict[tuple[int, int], list[float]] = {}
    for step in steps:
        bubble = bubble_of(step, bubbles)
        assert step.start_ns < bubble[1]  # began inside its bubble
        by_bubble.setdefault(bubble, []).append(step.progress)
    sizes = [size for seq in by_bubble.values() for size in seq]
    assert set(sizes) <= {1.0, 2.0, 4.0}
    assert 4.0 in sizes and {1.0, 2.0} & set(sizes)  # coarse steps, and finer ones in the tails
    for seq in by_bubble.values():
        assert seq == sorted(seq, reverse=True), seq  # coarse to fine within a bubble
        assert seq[0] == 4.0  # a fresh 40 ms bubble holds a 4-unit step
    profile = json.loads(path.read_text())
    assert profile["median_step_s"] >= 0.0125  # 4-unit steps (12.5 ms), not the finer ones
    assert profile["top_step_size"] == 4  # ... which it says, for placement


def test_a_small_step_forced_by_the_batch_end_does_not_hold_the_rest_of_the_bubble_small(
    run_dir: RunDir, edges: EdgeWriter, hosts: list[TaskProcess]
) -> None:
    """A task three units into a batch of four can only take one unit; in a 60 ms bubble the
    steps after it are whole batches again (4 units), not single units for the rest of it."""
    proc = start_active(
        run_dir, hosts, ref("Batched"), options={"unit_s": 0.005, "start": 3},
        limits={"budget_s": 0.015},
    )  # fmt: skip
    bubbles = drive_bubbles(edges, 3, length_s=0.06, predicted_s=0.06, gap_s=0.03)
    assert stop(proc) == 0
    first = [s.progress for s in steps_of(task_events(run_dir, "t1"))
             if bubble_of(s, bubbles) == bubbles[0]]  # fmt: skip
    assert first[:2] == [1.0, 4.0], first


def test_malformed_step_sizes_fail_the_task_saying_why(
    run_dir: RunDir, edges: EdgeWriter, hosts: list[TaskProcess]
) -> None:
    proc = start_active(
        run_dir, hosts, ref("Sized"), options={"sizes": [2, 4]}, limits={"budget_s": 0.012}
    )
    drive_bubbles(edges, 3)
    wait_exit(proc)
    reason = failed_state(run_dir, proc).reason
    assert "Sized.step_sizes=(2, 4) must be a tuple of ascending whole numbers starting at 1" in (
        reason
    )


@pytest.mark.parametrize("gating", ["trickle", "leftovers"])
def test_an_imperative_task_cannot_trickle_nor_take_leftovers_and_fails_saying_why(
    run_dir: RunDir, hosts: list[TaskProcess], gating: str
) -> None:
    proc = start_task_host(run_dir, hosts, ref("FreeCounter"), gating=gating)
    assert wait_exit(proc) == 1
    failed = states_of(task_events(run_dir, "t1"))[-1]
    assert failed.state == "FAILED"
    assert f"gating '{gating}' needs an iterative task (step()); FreeCounter is imperative" in (
        failed.reason
    )


def test_a_malformed_trickle_duty_is_refused_and_the_task_goes_on(
    run_dir: RunDir, hosts: list[TaskProcess]
) -> None:
    proc = start_active(
        run_dir, hosts, ref("Counting"), gating="trickle", limits={"budget_s": 0.005}
    )
    for bad in ("fast", None, True, 1.5, -0.1):
        assert not proc.request({"cmd": "tune", "trickle_duty": bad}), bad
    assert proc.request({"cmd": "tune", "trickle_duty": 0.5})  # still there, still listening
    assert stop(proc) == 0


def profiled(
    run_dir: RunDir,
    edges: EdgeWriter,
    hosts: list[TaskProcess],
    task: str,
    options: dict[str, Any],
) -> dict[str, Any]:
    """The profile a host of ``task`` (with a fixed budget) writes once bubbles have come."""
    proc = start_active(run_dir, hosts, ref(task), options=options, limits={"budget_s": 0.005})
    path = profile_path(run_dir.path, "t1")
    for first in range(0, 60, 6):
        drive_bubbles(edges, 6, first_step=first)
        if path.exists():
            break
    assert stop(proc) == 0
    return dict(json.loads(path.read_text()))


def test_the_profile_leaves_out_the_steps_a_task_declares_as_warm_up(
    run_dir: RunDir, edges: EdgeWriter, hosts: list[TaskProcess]
) -> None:
    """Three 30 ms warm-up steps (a graph capture, say) before 2 ms ones: the five profiled
    steps are the 2 ms ones, so the budget is not set by the capture."""
    profile = profiled(run_dir, edges, hosts, "WarmingUp", {"warmup": 3})
    assert profile["n_steps"] == 5
    assert profile["median_step_s"] < 0.015  # 2 ms steps, not the 30 ms warm-up


def test_the_profile_leaves_out_a_first_step_that_pays_the_processs_one_time_costs(
    run_dir: RunDir, edges: EdgeWriter, hosts: list[TaskProcess]
) -> None:
    """A task that declares no warm-up, whose first step takes 30 ms and the rest 2 ms (on an
    H100 PageRank's first took 124 ms, the next 0.15 ms): the profile's p95, a governed task's
    base budget, is of the 2 ms steps, not the first one's."""
    profile = profiled(run_dir, edges, hosts, "ColdStart", {"cold_s": 0.03})
    assert profile["n_steps"] == 5
    assert profile["p95_step_s"] < 0.015  # with the first step: 24 ms


def test_a_malformed_warmup_steps_fails_the_task_saying_why(
    run_dir: RunDir, edges: EdgeWriter, hosts: list[TaskProcess]
) -> None:
    proc = start_active(
        run_dir, hosts, ref("WarmingUp"), options={"warmup": -1}, limits={"budget_s": 0.005}
    )
    drive_bubbles(edges, 3)
    wait_exit(proc)
    assert "WarmingUp.warmup_steps=-1 must be an integer >= 0" in failed_state(run_dir, proc).reason


# -- bubbles that outlive their prediction ----------------------------------------------------

MS = 1_000_000


def learn_lengths(host: Any, edges: EdgeWriter, lengths_ms: list[float], slot: int = 0) -> None:
    """Past bubbles of ``slot`` as the host reads them: a start edge, then its end edge."""
    t = time.time_ns() - 10**10  # long ago on the run clock; only differences matter
    for step, length in enumerate(lengths_ms):
        edges.bubble_start(step, slot, t, t + MS)
        assert host._wait_for_edge(1.0) is not None
        edges.bubble_end(step, slot, t + int(length * MS))
        assert host._wait_for_edge(1.0) is not None
        t += 200 * MS


def live_bubble_steps(
    host: Any, sink: Any, edges: EdgeWriter, tmp_path: Path, predicted_ms: float
) -> list[float]:
    """A bubble of slot 0 predicted ``predicted_ms`` long that does not end: the starts of
    the steps the host takes in it, in ms after its start."""
    start = time.time_ns()
    edges.bubble_start(100, 0, start, start + int(predicted_ms * MS))
    edge = host._wait_for_edge(1.0)
    assert edge is not None and edge.in_bubble
    host._run_bubble(edge)
    sink.close()
    return [(s.start_ns - start) / MS for s in steps_of(task_events_at(tmp_path / "task.jsonl"))]


@pytest.mark.parametrize("outlived", ["stop", "survivors"])
def test_past_its_predicted_end_a_bubble_is_filled_as_long_as_its_slots_longer_bubbles_say(
    run_dir: RunDir, edges: EdgeWriter, tmp_path: Path, outlived: str
) -> None:
    """The slot's last bubbles lasted 40 ms; this one is predicted 5 ms (a short one among
    the last five, say) and lasts on. Under "stop" no step starts past 5 ms - the 2 ms guard;
    under "survivors" steps go on to 40 ms - the guard, and none starts later."""
    from tasks_for_tests import Counting

    host, sink = in_process_host(
        run_dir, tmp_path, Counting(step_s=0.001, limit=None), outlived=outlived
    )
    learn_lengths(host, edges, [40, 41, 40])
    starts = live_bubble_steps(host, sink, edges, tmp_path, predicted_ms=5)
    assert starts
    if outlived == "stop":
        assert max(starts) < 3.5
    else:
        assert max(starts) > 20  # well past the prediction
        assert max(starts) < 38.5  # never past the survivors' end minus the guard


@pytest.mark.parametrize("told", [True, False])
def test_past_its_predicted_end_a_bubble_is_filled_to_the_end_its_awaited_peer_told(
    run_dir: RunDir, edges: EdgeWriter, tmp_path: Path, told: bool
) -> None:
    """Rank 0 predicted this bubble 5 ms from its slot alone: rank 1 had not begun the forward
    it waits for. Rank 0's board names that forward, with a 1 ms hand-over; rank 1 begins it
    15 ms into the bubble and publishes its end, 40 ms in. The host steps to 5 ms - the 2 ms
    guard, waits for the peer, then steps on towards 41 ms - the guard, and none later; where
    rank 1 never begins it (the bubble ends at 60 ms), no step starts past the prediction."""
    from tasks_for_tests import Counting

    from freeride_lab.core.schedule import ActionKind
    from freeride_lab.io.peer_board import AwaitedPeers

    host, sink = in_process_host(run_dir, tmp_path, Counting(step_s=0.001, limit=None), peers=True)
    stage_ranks = {0: 1, 1: 0}  # rank 0 runs stage 1, fed by rank 1's stage 0
    feeder = AwaitedPeers(run_dir.path, 1, stage_ranks)
    AwaitedPeers(run_dir.path, 0, stage_ranks).awaiting(
        100, 0, 1, ActionKind.FORWARD, 3, hand_over_ns=MS
    )
    start = time.time_ns()
    timers = [threading.Timer(0.06, edges.bubble_end, (100, 0, start + 60 * MS))]
    if told:
        publish = (100, 0, ActionKind.FORWARD, 3, start + 15 * MS, start + 40 * MS)
        timers.append(threading.Timer(0.015, feeder.publish, publish))
    for timer in timers:
        timer.start()
    starts = live_bubble_steps(host, sink, edges, tmp_path, predicted_ms=5)
    for timer in timers:
        timer.join()
    assert starts and min(starts) < 3.5
    if told:
        assert any(t > 20 for t in starts), starts  # well past the prediction
        assert max(starts) < 39.5, starts  # never past the told end minus the guard
        assert not any(3.5 < t < 14 for t in starts), starts  # waiting for the peer
    else:
        assert max(starts) < 3.5, starts


def test_a_survivor_too_close_for_a_step_is_waited_out_and_the_next_one_planned_to(
    run_dir: RunDir, edges: EdgeWriter, tmp_path: Path
) -> None:
    """Bubbles of the slot were 12 ms or 60 ms; this one, predicted 5 ms, outlives both
    kinds' starts. The host steps to 12 ms - the guard, takes no step while only 12 ms is
    left to plan to, then, the 12 ms kind passed, steps towards 60 ms."""
    from tasks_for_tests import Counting

    host, sink = in_process_host(
        run_dir, tmp_path, Counting(step_s=0.001, limit=None), outlived="survivors"
    )
    learn_lengths(host, edges, [12, 60, 12, 61, 12, 60])
    starts = live_bubble_steps(host, sink, edges, tmp_path, predicted_ms=5)
    assert any(t < 9 for t in starts)
    assert not any(10.5 < t < 12 for t in starts), starts  # waiting out the 12 ms kind
    assert any(t > 20 for t in starts), starts  # then planned to the 60 ms kind
    assert max(starts) < 58.5


def test_the_edge_that_ends_a_bubble_while_the_host_waits_in_it_is_still_read_and_learnt(
    run_dir: RunDir, edges: EdgeWriter, tmp_path: Path
) -> None:
    """Bubbles of the slot were 30 ms or 60 ms; under a 10 ms guard the host stops launching
    at 20 ms and waits out the 30 ms kind, and the bubble ends at 25 ms, in that wait: the host
    leaves it, its main loop still reads the end edge (the spin clock and the lengths need
    it), and the new length is learnt once."""
    from tasks_for_tests import Counting

    host, sink = in_process_host(
        run_dir, tmp_path, Counting(step_s=0.001, limit=None), limits={"budget_s": 0.01},
        outlived="survivors",
    )  # fmt: skip
    waits: list[bool] = []  # what each of the host's waits in the bubble returned
    wait_in_bubble = host._wait_in_bubble

    def recorded_wait(bubble: Any, until_ns: int) -> bool:
        waits.append(wait_in_bubble(bubble, until_ns))
        return waits[-1]

    host._wait_in_bubble = recorded_wait
    learned = [30, 60, 30, 61, 30, 60]
    learn_lengths(host, edges, learned)
    start = time.time_ns()
    ended: list[int] = []

    def end_bubble() -> None:
        ended.append(time.time_ns())
        edges.bubble_end(100, 0, ended[0])

    ender = threading.Timer(0.025, end_bubble)
    edges.bubble_start(100, 0, start, start + 5 * MS)
    edge = host._wait_for_edge(1.0)
    assert edge is not None
    ender.start()
    host._run_bubble(edge)
    ender.join()
    assert waits == [True]  # it waited, and the bubble ended in that wait
    end = host._wait_for_edge(1.0)
    assert end is not None and not end.in_bubble and end.step == 100
    assert host._wait_for_edge(0.05) is None  # read once
    sink.close()
    assert sorted(host._survivors._lengths[0]) == sorted(
        [ended[0] - start] + [x * MS for x in learned]
    )


def test_a_bubble_seen_after_it_ended_is_left_alone_whatever_its_slot_says(
    run_dir: RunDir, edges: EdgeWriter, tmp_path: Path
) -> None:
    """Predicted too short for a step, its slot's past long: had the bubble still been open
    the survivors would have planned it, but it has ended by the time the host looks, so the
    task neither starts nor pauses in it."""
    from tasks_for_tests import Counting

    host, sink = in_process_host(run_dir, tmp_path, Counting(), outlived="survivors")
    learn_lengths(host, edges, [40, 41, 40])
    now = time.time_ns()
    edges.bubble_start(100, 0, now, now + MS)
    edge = host._wait_for_edge(1.0)
    assert edge is not None and edge.in_bubble
    edges.bubble_end(100, 0, now + MS)
    host._run_bubble(edge)
    sink.close()
    states = [e.state for e in states_of(task_events_at(tmp_path / "task.jsonl"))]
    assert "RUNNING" not in states, states


def test_a_length_is_learnt_from_the_next_edges_report_when_its_end_edge_was_missed(
    run_dir: RunDir, edges: EdgeWriter, tmp_path: Path
) -> None:
    """The host saw a bubble start, not its end (the next start replaced it on the file); the
    next edge's report of that end gives the length, once, and an end edge seen twice counts
    once."""
    from tasks_for_tests import Counting

    host, sink = in_process_host(run_dir, tmp_path, Counting(), outlived="survivors")
    t = time.time_ns()
    edges.bubble_start(0, 0, t, t + MS)
    assert host._wait_for_edge(1.0) is not None
    edges.bubble_end(0, 0, t + 10 * MS)
    edges.bubble_start(0, 1, t + 20 * MS, t + 21 * MS)  # replaces the end before it is read
    assert host._wait_for_edge(1.0) is not None
    edges.bubble_end(0, 1, t + 25 * MS)
    end = host._wait_for_edge(1.0)
    assert end is not None
    host._note_length(end)  # seen again
    sink.close()
    lengths = host._survivors._lengths
    assert list(lengths[0]) == [10 * MS] and list(lengths[1]) == [5 * MS]


def test_under_stop_nothing_is_learnt_and_an_unknown_choice_is_refused(
    run_dir: RunDir, edges: EdgeWriter, tmp_path: Path
) -> None:
    from tasks_for_tests import Counting

    host, sink = in_process_host(run_dir, tmp_path, Counting())
    learn_lengths(host, edges, [40, 40, 40])
    sink.close()
    assert host._survivors is None and not host._starts
    with pytest.raises(ValueError, match="outlived='later'"):
        in_process_host(run_dir, tmp_path, Counting(), outlived="later")


def test_the_hosts_choice_past_a_predicted_end_comes_from_the_runs_options(
    run_dir: RunDir,
) -> None:
    from freeride_lab.sidetasks.host.entry import _runtime_options
    from freeride_lab.sidetasks.spec import HostSpec

    spec = HostSpec(
        task=TaskSpec.from_dict({"task": ref("Counting"), "task_id": "t1"}),
        run_dir=str(run_dir.path), rank=0, stage=0,
    )  # fmt: skip
    assert _runtime_options(spec).outlived == "stop"  # no run.json: the default
    run_dir.write_json(run_dir.run_json, {"config": {"runtime": {"outlived": "survivors"}}})
    assert _runtime_options(spec).outlived == "survivors"
    run_dir.write_json(run_dir.run_json, {"config": {"runtime": {"outlived": 3}}})
    assert _runtime_options(spec).outlived == "stop"  # unreadable: the defaults, logged


# -- hand-ons to a leftovers task -------------------------------------------------------------


def test_a_main_task_hands_on_what_it_leaves_with_the_ranks_slot_start_prediction_and_end(
    run_dir: RunDir, edges: EdgeWriter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bubble too short for the 2 ms guard goes on whole; a longer one after the host's last
    step; each as the rank wrote it (its own start, not the hand-on's moment) and ending
    where the rank says it ended."""
    from tasks_for_tests import Counting

    from freeride_lab.sidetasks.edges import EdgeReader, Phase, leftovers_path

    path = leftovers_path(run_dir.path, 0)
    EdgeWriter.create(path).release()  # as the leftovers task's worker makes it
    host, sink = in_process_host(
        run_dir, tmp_path, Counting(step_s=0.001, limit=None), leftovers_file=str(path)
    )
    rest = EdgeReader.open(path)
    handed_at = _timing_hand_ons(monkeypatch, path)
    for step, predicted_ms in ((7, 1.0), (8, 8.0)):
        start = time.time_ns()
        edges.bubble_start(step, 3, start, start + int(predicted_ms * MS))
        edge = host._wait_for_edge(1.0)
        assert edge is not None and edge.in_bubble
        host._run_bubble(edge)
        handed = rest.latest()
        assert handed is not None and handed.in_bubble
        assert (handed.step, handed.slot) == (step, 3)
        assert handed.predicted_end_ns == start + int(predicted_ms * MS)
        assert handed.start_ns == start
        end = start + int(predicted_ms * MS) + 2 * MS  # it ended later than predicted
        edges.bubble_end(step, 3, end)
        assert host._wait_for_edge(1.0) is not None
        ended = rest.latest()
        assert ended is not None and ended.phase is Phase.BUSY
        assert (ended.step, ended.slot, ended.observed_end_ns) == (step, 3, end)
    sink.close()
    steps = steps_of(task_events_at(tmp_path / "task.jsonl"))
    assert steps and {s.step for s in steps} == {8}  # none fitted the 1 ms bubble
    assert len(handed_at) == 2 and handed_at[1] >= max(s.end_ns for s in steps)
    host._release_leftovers()
    assert rest.latest() == ended  # released, not closed: the next main task takes it over
    rest.close()


def _timing_hand_ons(monkeypatch: pytest.MonkeyPatch, path: Path) -> list[int]:
    """When each hand-on is written to the leftovers file at ``path`` (the list fills in)."""
    times: list[int] = []
    bubble_start = EdgeWriter.bubble_start

    def timed(writer: EdgeWriter, *args: Any) -> None:
        if writer.path == path:
            times.append(time.time_ns())
        bubble_start(writer, *args)

    monkeypatch.setattr(EdgeWriter, "bubble_start", timed)
    return times


@pytest.mark.parametrize("outlived", ["survivors", "hand-on"])
def test_a_leftovers_task_learns_the_bubbles_own_lengths_past_its_predicted_end(
    run_dir: RunDir, edges: EdgeWriter, tmp_path: Path, outlived: str
) -> None:
    """Under "survivors" and "hand-on" the leftovers task's host learns each bubble handed on
    as the rank timed it, start to end, whatever the main task took of it first; and, past
    the rank's prediction, it steps on towards its slot's longer bubbles."""
    from tasks_for_tests import Counting

    from freeride_lab.sidetasks.edges import leftovers_path

    path = leftovers_path(run_dir.path, 0)
    EdgeWriter.create(path).release()
    main, main_sink = in_process_host(
        run_dir, tmp_path, Counting(step_s=0.001, limit=None), leftovers_file=str(path)
    )
    rest, rest_sink = in_process_host(
        run_dir, tmp_path, Counting(step_s=0.0005, limit=None), limits={"budget_s": 0.001},
        outlived=outlived, edge_file=str(path), sink_name="rest.jsonl",
    )  # fmt: skip
    lengths = []
    for step in range(4):
        start = time.time_ns()
        edges.bubble_start(step, 0, start, start + 6 * MS)
        edge = main._wait_for_edge(1.0)
        assert edge is not None
        main._run_bubble(edge)  # steps about 4 ms, then hands on the rest
        handed = rest._wait_for_edge(1.0)
        assert handed is not None and handed.in_bubble
        end = start + (30 + step) * MS  # ended long after its prediction
        lengths.append(end - start)
        edges.bubble_end(step, 0, end)
        assert main._wait_for_edge(1.0) is not None
        assert rest._wait_for_edge(1.0) is not None
    assert sorted(rest._survivors._lengths[0]) == lengths
    start = time.time_ns()  # a fifth, predicted 6 ms, that lasts
    edges.bubble_start(4, 0, start, start + 6 * MS)
    edge = main._wait_for_edge(1.0)
    assert edge is not None
    main._run_bubble(edge)
    handed = rest._wait_for_edge(1.0)
    assert handed is not None
    rest._run_bubble(handed)
    main_sink.close()
    rest_sink.close()
    starts = [(s.start_ns - start) / MS for s in steps_of(task_events_at(tmp_path / "rest.jsonl"))]
    assert starts and max(starts) > 15  # well past the prediction, towards the 30 ms kind
    assert max(starts) < 30


def _outlived_main_bubble(
    run_dir: RunDir,
    edges: EdgeWriter,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    outlived: str,
    reading: bool,
    lengths_ms: list[float],
    peers: bool = False,
) -> tuple[list[int], list[int], list[int]]:
    """A main task's host with a leftovers file (read by a leftovers task's reader if
    ``reading``) learns ``lengths_ms`` for slot 0, then runs a bubble predicted 5 ms that
    lasts on: its steps' starts and its hand-ons' times, in ns after the bubble's start, and
    the times it waited in the bubble until. With ``peers`` the rank predicts from its peers
    and names the forward the bubble waits for, which its peer never begins."""
    from tasks_for_tests import Counting

    from freeride_lab.core.schedule import ActionKind
    from freeride_lab.io.peer_board import AwaitedPeers
    from freeride_lab.sidetasks.edges import EdgeReader, leftovers_path

    path = leftovers_path(run_dir.path, 0)
    EdgeWriter.create(path).release()
    host, sink = in_process_host(
        run_dir, tmp_path, Counting(step_s=0.001, limit=None), outlived=outlived,
        leftovers_file=str(path), peers=peers,
    )  # fmt: skip
    if peers:
        AwaitedPeers(run_dir.path, 0, {0: 1, 1: 0}).awaiting(
            100, 0, 1, ActionKind.FORWARD, 3, hand_over_ns=MS
        )
    rest = EdgeReader.open(path) if reading else None  # the leftovers task's host
    learn_lengths(host, edges, lengths_ms)
    handed_at = _timing_hand_ons(monkeypatch, path)
    waits: list[int] = []
    wait_in_bubble = host._wait_in_bubble

    def noted_wait(bubble: Any, until_ns: int) -> bool:
        waits.append(until_ns)
        return bool(wait_in_bubble(bubble, until_ns))

    host._wait_in_bubble = noted_wait
    start = time.time_ns()
    edges.bubble_start(100, 0, start, start + 5 * MS)
    edge = host._wait_for_edge(1.0)
    assert edge is not None
    host._run_bubble(edge)
    edges.bubble_end(100, 0, time.time_ns())
    sink.close()
    if rest is not None:
        rest.close()
    starts = [s.start_ns - start for s in steps_of(task_events_at(tmp_path / "task.jsonl"))]
    assert starts
    return starts, [t - start for t in handed_at], waits


@pytest.mark.parametrize("reading", [True, False])
@pytest.mark.parametrize("outlived", ["survivors", "hand-on"])
def test_past_its_prediction_a_main_task_hands_a_bubble_on_where_a_leftovers_task_reads(
    run_dir: RunDir,
    edges: EdgeWriter,
    tmp_path: Path,
    outlived: str,
    reading: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bubbles of the slot were 30 ms or 60 ms; this one, predicted 5 ms, outlives its
    prediction. Alone, the host steps towards 30 ms, waits out the 30 ms kind ([Note:
    outlived bubbles]) and steps on towards 60 ms, under both rules (a leftovers file nobody
    reads, its task gone, changes nothing). With a leftovers task reading its hand-ons, under
    "survivors" it steps towards 30 ms and hands the bubble on instead of waiting; under
    "hand-on" it starts no step past 5 ms - its 2 ms guard and hands the bubble on there."""
    starts, handed_at, waits = _outlived_main_bubble(
        run_dir, edges, tmp_path, monkeypatch, outlived=outlived, reading=reading,
        lengths_ms=[30, 60, 30, 61, 30, 60],
    )  # fmt: skip
    if not reading:
        assert max(starts) > 20 * MS and waits  # past the prediction; waited out 30 ms
        return
    assert not waits
    if outlived == "survivors":
        assert max(starts) > 20 * MS  # past the prediction
        # handed on where its last step ended: after a wait, it would have filled 60 ms
        assert len(handed_at) == 1 and handed_at[0] < 45 * MS
    else:
        assert max(starts) < 3.5 * MS  # none past the prediction less the guard
        assert len(handed_at) == 1 and handed_at[0] < 15 * MS  # at once


def test_a_main_task_hands_a_bubble_on_where_a_leftovers_task_reads_not_waiting_for_a_peer(
    run_dir: RunDir, edges: EdgeWriter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rank names the forward this bubble waits for; its peer has not begun it. With a
    leftovers task reading its hand-ons, the host does not wait in the bubble for the peer
    ([Note: told mid-bubble]): past the prediction it hands the bubble on at once."""
    _, handed_at, waits = _outlived_main_bubble(
        run_dir, edges, tmp_path, monkeypatch, outlived="stop", reading=True, lengths_ms=[],
        peers=True,
    )  # fmt: skip
    assert not waits
    assert len(handed_at) == 1 and handed_at[0] < 15 * MS


def test_a_main_task_without_a_leftovers_task_hands_nothing_on(
    run_dir: RunDir, edges: EdgeWriter, tmp_path: Path
) -> None:
    from tasks_for_tests import Counting

    from freeride_lab.sidetasks.edges import leftovers_path

    path = leftovers_path(run_dir.path, 0)
    host, sink = in_process_host(
        run_dir, tmp_path, Counting(step_s=0.001, limit=None), leftovers_file=str(path)
    )
    start = time.time_ns()
    edges.bubble_start(0, 0, start, start + MS)
    edge = host._wait_for_edge(1.0)
    assert edge is not None
    host._run_bubble(edge)
    sink.close()
    assert not path.exists()


def test_a_damaged_leftovers_file_leaves_the_main_task_stepping(
    run_dir: RunDir, edges: EdgeWriter, tmp_path: Path
) -> None:
    from tasks_for_tests import Counting

    from freeride_lab.sidetasks.edges import leftovers_path

    path = leftovers_path(run_dir.path, 0)
    path.write_bytes(b"not an edge file")
    host, sink = in_process_host(
        run_dir, tmp_path, Counting(step_s=0.001, limit=None), leftovers_file=str(path)
    )
    for step in range(2):
        start = time.time_ns()
        edges.bubble_start(step, 0, start, start + 8 * MS)
        edge = host._wait_for_edge(1.0)
        assert edge is not None
        host._run_bubble(edge)  # hands on nothing, raises nothing
        edges.bubble_end(step, 0, time.time_ns())
        assert host._wait_for_edge(1.0) is not None
    sink.close()
    assert {s.step for s in steps_of(task_events_at(tmp_path / "task.jsonl"))} == {0, 1}
    assert path.read_bytes() == b"not an edge file"


def test_a_leftovers_task_attached_while_bubbles_come_is_found_within_a_look(
    run_dir: RunDir, edges: EdgeWriter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The main task's host looks for the leftovers file at most every so often; bubbles more
    often than that must not put its next look off for ever."""
    from tasks_for_tests import Counting

    from freeride_lab.sidetasks.edges import EdgeReader, leftovers_path
    from freeride_lab.sidetasks.host import iterative

    monkeypatch.setattr(iterative, "_LEFTOVERS_LOOK_S", 0.05)
    path = leftovers_path(run_dir.path, 0)
    host, sink = in_process_host(
        run_dir, tmp_path, Counting(step_s=0.001, limit=None), leftovers_file=str(path)
    )

    def short_bubble(step: int) -> None:
        start = time.time_ns()
        edges.bubble_start(step, 0, start, start + MS)  # too short for the 2 ms guard
        edge = host._wait_for_edge(1.0)
        assert edge is not None
        host._run_bubble(edge)
        edges.bubble_end(step, 0, time.time_ns())
        assert host._wait_for_edge(1.0) is not None
        time.sleep(0.01)  # bubbles every 10 ms: far more often than the host looks

    for step in range(5):
        short_bubble(step)  # no leftovers task yet
    EdgeWriter.create(path).release()  # one is attached: its worker makes the file
    rest = EdgeReader.open(path)
    deadline = time.monotonic() + 2.0  # forty looks' time: ends at the first hand-on
    step = 5
    while time.monotonic() < deadline and rest.latest() is None:
        short_bubble(step)
        step += 1
    sink.close()
    handed = rest.latest()
    rest.close()
    assert handed is not None and handed.step >= 5
