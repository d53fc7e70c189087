"""Claims about ``SideTaskManager`` and its views, without processes: a fake worker takes the
commands, plain frames stand in for the run's tables, event dicts for its event files.

Over 500 lines: every command of one class (SideTaskManager) against one fake worker.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from freeride_lab.core.config import RunConfig, RuntimeOptions
from freeride_lab.core.events import ControlAck
from freeride_lab.core.governor import OverheadGovernor
from freeride_lab.io.rundir import RunDir
from freeride_lab.lab.governor import GOVERNOR_LOG_COLUMNS, GovernorLoop, governor_log_frame
from freeride_lab.lab.harvest import run_cost_saving, run_ledger
from freeride_lab.lab.manager import SideTaskManager
from freeride_lab.lab.session import EDGES_FACTORY
from freeride_lab.lab.stages import stage_info
from freeride_lab.sidetasks.spec import TaskSpec, profile_path

GIB = 2**30
TOYS = Path(__file__).resolve().parents[1] / "sidetasks" / "tasks_for_tests.py"
COUNTING = f"{TOYS}:Counting"


class FakeWorker:
    """Answers like a worker and remembers what it was sent."""

    def __init__(self, rank: int, log: list[tuple[int, str, Any]], clock: list[int]) -> None:
        self.rank = rank
        self.log = log
        self.clock = clock
        self.refuse = ""

    def _ack(self, command: str, payload: dict[str, Any]) -> ControlAck:
        self.clock[0] += 1000
        if self.refuse:
            return ControlAck(command=command, t_ns=self.clock[0], ok=False, message=self.refuse)
        return ControlAck(command=command, t_ns=self.clock[0], ok=True, payload=payload)

    def attach(self, spec: TaskSpec) -> ControlAck:
        self.log.append((self.rank, "attach", spec))
        return self._ack("attach", {"task_id": spec.task_id, "position": 0, "pid": 1})

    def tune(self, task_id: str, **limits: Any) -> ControlAck:
        self.log.append((self.rank, "tune", (task_id, limits)))
        restart = bool({"memory_bytes", "sm_pct", "priority"} & set(limits))
        return self._ack("tune", {"task_id": task_id, "restarted": restart})

    def detach(self, task_id: str) -> ControlAck:
        self.log.append((self.rank, "detach", task_id))
        return self._ack("detach", {"task_id": task_id, "state": "STOPPED"})

    def checkpoint(self, task_id: str) -> ControlAck:
        self.log.append((self.rank, "checkpoint", task_id))
        return self._ack("checkpoint", {"task_id": task_id})


class Run:
    """What a Session gives its manager: tables, events and liveness, set by each test."""

    def __init__(self, tmp_path: Path, **config: Any) -> None:
        self.run_dir = RunDir(tmp_path / "run")
        self.run_dir.create()
        fields: dict[str, Any] = {"schedule": "1F1B", "stages": 4, "microbatches": 4}
        fields |= {"workload": "synthetic", "runtime": RuntimeOptions(edges_factory=EDGES_FACTORY)}
        self.config = RunConfig(**{**fields, **config})
        self.events: list[dict[str, Any]] = []
        self.memory = pd.DataFrame(
            columns=["step", "rank", "peak_reserved_bytes", "capacity_bytes"], dtype="int64"
        )
        self.bubbles = pd.DataFrame(
            {"step": [], "rank": [], "slot": [], "label": [], "duration_ms": []}
        )
        self.live = True
        self.sent: list[tuple[int, str, Any]] = []
        self.clock = [1_000_000]
        self.workers = {r: FakeWorker(r, self.sent, self.clock) for r in range(4)}
        self.manager = SideTaskManager(
            self.run_dir,
            self.config,
            events=lambda start: self.events[start:],
            memory=lambda: self.memory,
            bubbles=lambda: self.bubbles,
            live=lambda: self.live,
            client=lambda rank: self.workers[rank],
        )

    def set_free_gib(self, *free: float) -> None:
        cap = 64 * GIB
        self.memory = pd.DataFrame(
            {
                "step": [0] * len(free),
                "rank": list(range(len(free))),
                "peak_reserved_bytes": [int(cap - f * GIB) for f in free],
                "capacity_bytes": [cap] * len(free),
            }
        )

    def set_bubbles_ms(self, per_rank: Mapping[int, list[float]]) -> None:
        rows = [
            {"step": 1, "rank": r, "slot": i, "label": None, "duration_ms": ms}
            for r, lengths in per_rank.items()
            for i, ms in enumerate(lengths)
        ]
        self.bubbles = pd.DataFrame(rows)

    def state(self, task_id: str, state: str, event: str, reason: str = "") -> None:
        self.clock[0] += 1000
        self.events.append(
            {
                "kind": "side_task_state",
                "task_id": task_id,
                "state": state,
                "event": event,
                "accepted": True,
                "reason": reason,
                "t_ns": self.clock[0],
            }
        )

    def step(self, task_id: str, *, progress: float = 1.0, overrun_ns: int = 0) -> None:
        self.events.append(
            {
                "kind": "side_task_step",
                "task_id": task_id,
                "progress": progress,
                "unit": "iterations",
                "overrun_ns": overrun_ns,
            }
        )


@pytest.fixture
def run(tmp_path: Path) -> Run:
    return Run(tmp_path)


def task_dirs(run: Run) -> list[str]:
    root = run.run_dir.path / "tasks"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


# -- rejections ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "match"),
    [
        ({"task": "nosuchtask"}, "unknown side task 'nosuchtask'"),
        ({"task": f"{TOYS}:NoSuchClass"}, "has no class 'NoSuchClass'"),
        ({"task": "/nowhere/tasks.py:Task"}, "does not exist"),
        ({"task": COUNTING, "budget_ms": -5}, "budget_ms=-5 must be"),
        ({"task": COUNTING, "stage": 4}, "stage=4 is out of range"),
        ({"task": COUNTING, "stage": True}, "stage=True is out of range"),
        ({"task": COUNTING, "memory": "100GiB"}, "memory: free"),
        ({"task": COUNTING, "memory": "lots"}, "'lots' is not a number"),
        ({"task": COUNTING, "sm_pct": 150}, "sm_pct=150"),
        ({"task": COUNTING, "priority": 3}, "priority=3"),
        ({"task": COUNTING, "gating": "sometimes"}, "gating='sometimes' is unknown"),
        ({"task": COUNTING, "policy": "explode"}, "overrun_policy='explode' is unknown"),
        ({"task": COUNTING, "options": {"f": object()}}, "options must be JSON"),
    ],
)
def test_rejected_attach_sends_nothing_and_records_nothing(
    run: Run, request_: dict[str, Any], match: str
) -> None:
    run.set_free_gib(3, 9, 16, 24)
    with pytest.raises(ValueError, match=match):
        run.manager.attach(**request_)
    assert run.sent == []
    assert task_dirs(run) == []


def test_no_stage_with_enough_memory_is_a_rejection_naming_each_stage(run: Run) -> None:
    run.set_free_gib(3, 9, 16, 24)
    with pytest.raises(ValueError, match=r"no stage can host 'Counting'.*stage 3: memory"):
        run.manager.attach(COUNTING, memory="30GiB")
    assert run.sent == []


def test_a_budget_longer_than_every_bubble_of_the_stage_is_refused(run: Run) -> None:
    run.set_bubbles_ms({0: [5.0, 40.0], 1: [5.0, 10.0]})
    with pytest.raises(ValueError, match="stage 1 cannot host 'Counting': bubble_fit"):
        run.manager.attach(COUNTING, stage=1, budget_ms=20)
    assert run.sent == []


def test_harvest_placement_picks_the_stage_whose_bubbles_its_steps_fill_most(run: Run) -> None:
    # 20 ms steps: stage 0's two 25 ms bubbles hold one each (40 ms per training step), stage
    # 2's 100 ms bubble four (80 ms); FreeRide's rule takes the first stage with the shortest
    # queue that fits at all (stages 1 and 3 fit none).
    run.set_free_gib(8, 8, 8, 8)
    run.set_bubbles_ms({0: [25.0, 25.0], 1: [5.0], 2: [100.0], 3: [5.0]})
    harvest = run.manager.attach(COUNTING, budget_ms=20, placement="harvest")
    freeride = run.manager.attach(COUNTING, budget_ms=20)
    assert (freeride["stage"], harvest["stage"]) == (0, 2)
    assert "by the bubble time its steps would fill" in harvest["placement"]
    with pytest.raises(
        ValueError, match="placement='nearest' is unknown; valid: freeride, harvest"
    ):
        run.manager.attach(COUNTING, budget_ms=20, placement="nearest")


def test_naive_co_location_is_not_held_to_the_bubble_fit_rule(run: Run) -> None:
    # gating="none" steps through training compute, so a stage without bubbles can host it.
    run.set_bubbles_ms({0: [], 1: [5.0, 10.0]})
    task = run.manager.attach(COUNTING, stage=0, budget_ms=20, gating="none")
    assert task["stage"] == 0
    assert 'gating="none": bubble-fit rule not applied' in task["placement"]
    with pytest.raises(ValueError, match="stage 0 cannot host 'Counting': bubble_fit"):
        run.manager.attach(COUNTING, stage=0, budget_ms=20)


def test_attach_to_a_vanilla_run_is_a_runtime_error(tmp_path: Path) -> None:
    run = Run(tmp_path, side_tasks=False)
    with pytest.raises(RuntimeError, match="side_tasks=False"):
        run.manager.attach(COUNTING, stage=0)


def test_attach_to_a_run_without_workers_is_a_runtime_error(tmp_path: Path) -> None:
    run = Run(tmp_path, runtime=RuntimeOptions())
    with pytest.raises(RuntimeError, match="has no side-task workers"):
        run.manager.attach(COUNTING, stage=0)


def test_attach_to_an_ended_run_is_a_runtime_error(run: Run) -> None:
    run.live = False
    with pytest.raises(RuntimeError, match="not training"):
        run.manager.attach(COUNTING, stage=0)


# -- attach and placement ----------------------------------------------------------------------


def test_attach_sends_the_spec_and_returns_the_task_dict(run: Run) -> None:
    task = run.manager.attach(
        COUNTING, stage=2, memory="1GiB", sm_pct=30, budget_ms=25, options={"step_s": 0.001}
    )
    (rank, command, spec), *_ = run.sent
    assert (rank, command) == (2, "attach")
    assert (spec.task_id, spec.options, spec.limits.budget_s) == (
        task["id"],
        {"step_s": 0.001},
        0.025,
    )
    expected = {"name": "Counting", "stage": 2, "state": "SUBMITTED", "progress": 0.0}
    expected |= {"unit": "iterations", "overruns": 0, "memory_bytes": GIB, "sm_pct": 30.0}
    expected |= {"priority": 1, "budget_ms": 25.0, "error": ""}
    assert {k: task[k] for k in expected} == expected
    assert task_dirs(run) == [task["id"]]


def test_placement_follows_free_memory_and_queue_length(run: Run) -> None:
    run.set_free_gib(3, 9, 16, 24)
    first = run.manager.attach(COUNTING, memory="8GiB")
    second = run.manager.attach(COUNTING, memory="8GiB")
    third = run.manager.attach(COUNTING, memory="8GiB")
    assert [first["stage"], second["stage"], third["stage"]] == [1, 2, 3]


def test_a_leftovers_task_goes_beside_a_main_task_and_queues_apart_from_them(run: Run) -> None:
    """Main tasks on stages 1 and 2: a leftovers task placed freely goes beside one of them,
    and neither kind lengthens the other's queue."""
    run.set_free_gib(24, 24, 24, 24)
    for stage in (1, 2):
        run.manager.attach(COUNTING, stage=stage)
    first = run.manager.attach(COUNTING, gating="leftovers")
    second = run.manager.attach(COUNTING, gating="leftovers")
    assert {first["stage"], second["stage"]} == {1, 2}  # each to the shorter leftovers queue
    assert run.manager.attach(COUNTING)["stage"] in (0, 3)  # main queues: 1 and 2 hold one


def test_a_leftovers_task_with_no_main_task_anywhere_is_refused_saying_what_to_do(
    run: Run,
) -> None:
    with pytest.raises(ValueError, match="no stage has one: attach a main task first"):
        run.manager.attach(COUNTING, gating="leftovers")
    assert run.sent == []
    waiting = run.manager.attach(COUNTING, gating="leftovers", stage=2)
    assert "stage 2 has no main side task yet: it waits for one" in waiting["placement"]


def test_placement_without_measurements_says_what_it_skipped(run: Run) -> None:
    task = run.manager.attach(COUNTING)
    assert "free memory not measured yet" in task["placement"]
    assert "bubbles not measured yet" in task["placement"]
    assert "not known until the task is profiled" in task["placement"]


def test_builtin_names_resolve_without_regard_to_case_and_carry_their_unit(run: Run) -> None:
    task = run.manager.attach("ResNet18", stage=1)
    assert (task["name"], task["task"], task["unit"]) == (
        "resnet18",
        "freeride_lab.tasks.vision:ResNet18Task",  # the worker gets the resolved reference
        "samples",
    )


# -- what events say -------------------------------------------------------------------------


def test_state_progress_and_overruns_come_from_the_events(run: Run) -> None:
    tid = run.manager.attach(COUNTING, stage=0)["id"]
    for state, event in (("CREATED", "CREATE"), ("PAUSED", "INIT"), ("RUNNING", "START")):
        run.state(tid, state, event)
    run.step(tid)
    run.step(tid, overrun_ns=2_000_000)
    run.state(tid, "RUNNING", "OVERRUN", "a note, not a state change")
    task = run.manager.task(tid)
    assert (task["state"], task["progress"], task["steps"], task["overruns"]) == (
        "RUNNING",
        2.0,
        2,
        1,
    )


def test_a_failed_task_shows_its_reason_as_error(run: Run) -> None:
    tid = run.manager.attach(COUNTING, stage=0)["id"]
    run.state(tid, "FAILED", "FAIL", "step raised RuntimeError: boom")
    task = run.manager.task(tid)
    assert (task["state"], task["error"]) == ("FAILED", "step raised RuntimeError: boom")


def test_a_state_event_read_late_does_not_override_a_newer_one(run: Run) -> None:
    tid = run.manager.attach(COUNTING, stage=0)["id"]
    run.state(tid, "PAUSED", "INIT")
    newer = run.events.pop()
    run.state(tid, "CREATED", "CREATE")
    older = run.events.pop()
    older["t_ns"], newer["t_ns"] = 10**15, 2 * 10**15
    run.events += [newer, older]
    assert run.manager.task(tid)["state"] == "PAUSED"


def test_the_profile_sets_budget_and_memory_until_limits_change(run: Run) -> None:
    tid = run.manager.attach(COUNTING, stage=0)["id"]
    assert run.manager.task(tid)["budget_ms"] is None
    path = profile_path(run.run_dir.path, tid)
    profile = {"budget_s": 0.036, "memory_request_bytes": 2 * GIB, "t_ns": run.clock[0] + 1}
    path.write_text(json.dumps(profile))
    task = run.manager.task(tid)
    assert (task["budget_ms"], task["memory_bytes"]) == (36.0, 2 * GIB)
    run.manager.tune(tid, sm_pct=50)  # a restart: the profile is stale until measured again
    assert run.manager.task(tid)["budget_ms"] is None


@pytest.mark.parametrize("top_step_size", [None, 4])
def test_a_task_profiled_in_slices_is_placed_by_its_smallest_step(
    run: Run, top_step_size: int | None
) -> None:
    """Its profile says the 59 ms steps were four slices: stage 1's bubbles (at most 59 ms)
    hold no whole step under its 65 ms budget but hold slices, so it may move there; a
    profile of whole steps keeps the stage refused."""
    tid = run.manager.attach(COUNTING, stage=0)["id"]
    run.set_bubbles_ms({0: [140.0], 1: [45.0, 59.0, 35.0], 2: [5.0], 3: [5.0]})
    profile = {"budget_s": 0.065, "median_step_s": 0.0587, "memory_request_bytes": 0,
               "t_ns": run.clock[0] + 1, "top_step_size": top_step_size}  # fmt: skip
    profile_path(run.run_dir.path, tid).write_text(json.dumps(profile))
    if top_step_size is None:
        with pytest.raises(ValueError, match="stage 1 cannot host 'Counting': bubble_fit"):
            run.manager.move(tid, 1)
    else:
        assert run.manager.move(tid, 1)["stage"] == 1


# -- tune, move, detach, re-attach -----------------------------------------------------------


def test_tune_sends_only_the_changed_limits_and_echoes_them(run: Run) -> None:
    tid = run.manager.attach(COUNTING, stage=0)["id"]
    task = run.manager.tune(tid, budget_ms=30, sm_pct=40)
    assert run.sent[-1] == (0, "tune", (tid, {"sm_pct": 40, "budget_s": 0.03}))
    assert (task["budget_ms"], task["sm_pct"]) == (30.0, 40.0)


def test_tune_of_memory_above_the_stage_free_memory_is_refused(run: Run) -> None:
    run.set_free_gib(3, 9, 16, 24)
    tid = run.manager.attach(COUNTING, stage=1)["id"]
    with pytest.raises(ValueError, match="stage 1 cannot host 'Counting': memory"):
        run.manager.tune(tid, memory="10GiB")
    assert run.sent[-1][1] == "attach"
    assert run.manager.task(tid)["memory_bytes"] is None


def test_move_detaches_then_attaches_the_same_id_on_the_new_stage(run: Run) -> None:
    tid = run.manager.attach(COUNTING, stage=0)["id"]
    task = run.manager.move(tid, 3)
    assert [(r, c) for r, c, _ in run.sent] == [(0, "attach"), (0, "detach"), (3, "attach")]
    assert run.sent[-1][2].task_id == tid
    assert (task["id"], task["stage"], task["state"]) == (tid, 3, "SUBMITTED")


def test_a_refused_move_puts_the_task_back(run: Run) -> None:
    tid = run.manager.attach(COUNTING, stage=0)["id"]
    run.workers[3].refuse = "worker is stopping"
    with pytest.raises(RuntimeError, match="it resumed on stage 0"):
        run.manager.move(tid, 3)
    assert run.sent[-1][:2] == (0, "attach")
    assert run.manager.task(tid)["stage"] == 0


def test_detach_then_attach_by_id_resumes_the_same_task(run: Run) -> None:
    tid = run.manager.attach(COUNTING, stage=1, options={"step_s": 0.002})["id"]
    run.step(tid, progress=5)
    detached = run.manager.detach(tid)
    assert (detached["state"], detached["detached"]) == ("STOPPED", True)
    again = run.manager.attach(tid)
    _, command, spec = run.sent[-1]
    assert (command, spec.task_id, spec.options) == ("attach", tid, {"step_s": 0.002})
    assert (again["id"], again["stage"], again["progress"], again["detached"]) == (
        tid,
        1,
        5.0,
        False,
    )


def test_a_checkpoint_goes_to_the_tasks_worker_and_a_refusal_says_why(run: Run) -> None:
    tid = run.manager.attach(COUNTING, stage=2)["id"]
    task = run.manager.checkpoint(tid)
    assert run.sent[-1] == (2, "checkpoint", tid)
    assert (task["id"], task["detached"]) == (tid, False)
    run.workers[2].refuse = f"{tid} has no process running (not started yet, or ended)"
    with pytest.raises(RuntimeError, match=f"could not checkpoint {tid}: {tid} has no process"):
        run.manager.checkpoint(tid)
    run.workers[2].refuse = ""
    run.manager.detach(tid)
    sent = len(run.sent)
    with pytest.raises(ValueError, match=r"cannot checkpoint task .*attach it again"):
        run.manager.checkpoint(tid)
    assert len(run.sent) == sent  # nothing sent for a detached task


def test_tune_of_a_detached_task_is_refused_with_the_fix(run: Run) -> None:
    tid = run.manager.attach(COUNTING, stage=0)["id"]
    run.manager.detach(tid)
    with pytest.raises(ValueError, match=rf"attach it again with session.attach\('{tid}'\)"):
        run.manager.tune(tid, budget_ms=10)


def test_unknown_task_ids_are_named_with_the_known_ones(run: Run) -> None:
    tid = run.manager.attach(COUNTING, stage=0)["id"]
    with pytest.raises(ValueError, match=f"no side task 'zz' in this run; attached: {tid}"):
        run.manager.detach("zz")


def test_a_misspelt_argument_is_refused_not_dropped(run: Run) -> None:
    with pytest.raises(
        TypeError, match=r"attach\(\) got unexpected keyword argument\(s\) 'budget'"
    ):
        run.manager.attach(COUNTING, stage=0, budget=5)  # type: ignore[call-arg]
    assert task_dirs(run) == []
    tid = run.manager.attach(COUNTING, stage=0)["id"]
    with pytest.raises(TypeError, match=r"tune\(\) .* 'sm'; valid: memory, sm_pct"):
        run.manager.tune(tid, sm=50)  # type: ignore[call-arg]


def test_a_second_manager_sees_the_same_tasks(run: Run) -> None:
    tid = run.manager.attach(COUNTING, stage=2, budget_ms=15)["id"]
    run.state(tid, "PAUSED", "INIT")
    other = SideTaskManager(
        run.run_dir,
        run.config,
        events=lambda start: run.events[start:],
        memory=lambda: run.memory,
        bubbles=lambda: run.bubbles,
        live=lambda: True,
        client=lambda rank: run.workers[rank],
    )
    assert [(t["id"], t["stage"], t["state"], t["budget_ms"]) for t in other.tasks()] == [
        (tid, 2, "PAUSED", 15.0)
    ]


# -- views -----------------------------------------------------------------------------------


def test_stage_info_lists_free_memory_bubbles_and_live_tasks(run: Run) -> None:
    run.set_free_gib(3, 9, 16, 24)
    run.set_bubbles_ms({0: [4.0, 30.0], 3: [12.0]})
    tid = run.manager.attach(COUNTING, stage=3)["id"]
    info = stage_info(run.manager, run.memory, run.bubbles)
    assert [(i["stage"], i["free_bytes"] // GIB, i["bubbles_ms"], i["tasks"]) for i in info] == [
        (0, 3, [4.0, 30.0], []),
        (1, 9, [], []),
        (2, 16, [], []),
        (3, 24, [12.0], [tid]),
    ]


def _steps(periods_s: list[float], ranks: int = 2) -> pd.DataFrame:
    rows, t = [], 0.0
    for step, period in enumerate(periods_s):
        for rank in range(ranks):
            rows.append({"step": step, "rank": rank, "start_ms": t, "end_ms": t + period * 800})
        t += period * 1e3
    return pd.DataFrame(rows)


def _side_steps(steps: list[int], name: str = "pagerank", progress: float = 2.0) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "task_id": "t1",
            "name": name,
            "stage": 1,
            "rank": 1,
            "step": steps,
            "start_ms": [1.0] * len(steps),
            "end_ms": [2.0] * len(steps),
            "duration_ms": [1.0] * len(steps),
            "progress": [progress] * len(steps),
            "unit": "iterations",
            "overrun_ms": [0.0] * len(steps),
        }
    )


def test_cost_saving_learns_the_vanilla_pace_from_steps_without_side_tasks() -> None:
    steps = _steps([1.0, 1.0, 1.1, 1.1, 1.0, 1.0])  # steps 2, 3 carry work and are slower
    saving = run_cost_saving(steps, _side_steps([2, 3]))
    assert saving.overhead_frac == pytest.approx(0.2 / 4.0)
    assert saving.saving_published_frac == pytest.approx((4.0 / 126.3) / (22.0 * 4.0))


def test_cost_saving_without_a_quiet_step_asks_for_the_vanilla_pace() -> None:
    steps = _steps([1.0, 1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="pass vanilla_step_s="):
        run_cost_saving(steps, _side_steps([0, 1, 2, 3]))
    saving = run_cost_saving(steps, _side_steps([0, 1, 2, 3]), vanilla_step_s=0.5)
    assert saving.overhead_frac == pytest.approx(1.0)


def test_cost_saving_uses_freeride_reference_keys_for_builtin_names() -> None:
    steps = _steps([1.0] * 5)
    saving = run_cost_saving(steps, _side_steps([1], name="sgd_mf"), vanilla_step_s=1.0)
    assert saving.reference_gpus == pytest.approx((2.0 / 1.5) / 3.0)


def test_ledger_takes_throughput_over_training_wall_time() -> None:
    steps = _steps([1.0, 1.0])  # first start 0 ms, last end 1800 ms
    table = run_ledger(_side_steps([0, 1]), steps)
    assert table["throughput_per_s"].tolist() == pytest.approx([4.0 / 1.8])


# -- governor --------------------------------------------------------------------------------


def _events_of(steps: pd.DataFrame, side: pd.DataFrame) -> list[dict[str, Any]]:
    """The ``step`` and ``side_task_step`` events the rows of ``steps`` and ``side`` stand for,
    step by step."""
    events: list[dict[str, Any]] = []
    for step, rows in steps.groupby("step"):
        events += [{"kind": "step", "rank": int(r["rank"]), "step": int(step),
                    "start_ns": round(r["start_ms"] * 1e6), "end_ns": round(r["end_ms"] * 1e6)}
                   for _, r in rows.iterrows()]  # fmt: skip
        events += [{"kind": "side_task_step", "step": int(step), "task_id": str(t)}
                   for t in side.loc[side["step"] == step, "task_id"]]  # fmt: skip
    return events


def _governor_loop(
    run: Run, steps: pd.DataFrame, side: pd.DataFrame, **options: Any
) -> GovernorLoop:
    """A live loop over the events of fixed ``steps`` and ``side`` tables of a 4-rank run,
    whose governor targets 1% overhead, decides on windows of 2 steps and leaves the SM share
    alone; ``options`` add to the loop's (``log_path`` is the run's governor.jsonl unless
    given)."""
    options.setdefault("log_path", run.run_dir.path / "governor.jsonl")
    events = _events_of(steps, side)
    return GovernorLoop(
        run.manager,
        events=lambda start: events[start:],
        live=lambda: True,
        governor=OverheadGovernor(
            target_frac=0.01, window=2, settle_steps=0, sm_min_pct=100, sm_max_pct=100
        ),
        ranks=4,
        **options,
    )


def test_governor_scales_the_budget_when_training_slows_and_logs_it(run: Run) -> None:
    tid = run.manager.attach(COUNTING, stage=1, budget_ms=20)["id"]
    run.state(tid, "PAUSED", "INIT")
    periods = [1.0] * 6 + [1.2] * 6  # quiet steps set the baseline; then 20% slower with work
    steps = _steps(periods, ranks=4)
    side = _side_steps(list(range(6, 12)))
    side["task_id"] = tid
    log_path = run.run_dir.path / "governor.jsonl"
    loop = _governor_loop(run, steps, side, log_path=log_path)
    records = loop.tick()
    assert records, "no decision for 20% overhead"
    first, last = records[0], records[-1]
    assert (first["task_id"], first["budget_scale"], first["budget_ms"], first["applied"]) == (
        tid,
        1.25,
        25.0,
        True,
    )
    assert run.sent[-1] == (1, "tune", (tid, {"budget_s": last["budget_ms"] / 1e3}))
    assert run.manager.task(tid)["budget_ms"] == pytest.approx(20.0 * last["budget_scale"])
    frame = governor_log_frame(log_path)
    assert tuple(frame.columns) == GOVERNOR_LOG_COLUMNS
    assert frame["task_id"].tolist() == [tid] * len(records)
    assert math.isclose(frame["budget_ms"].iloc[0], 25.0)


def test_a_governor_loop_reads_only_new_events_and_keeps_only_unobserved_steps(run: Run) -> None:
    """A run that goes on for hours: each tick folds the events that arrived since the last
    (it never asks for the run from the start again) and forgets each step once observed, so
    neither a tick's cost nor the loop's memory grows with the run. Malformed events are left
    out."""
    tid = run.manager.attach(COUNTING, stage=1, budget_ms=20)["id"]
    run.state(tid, "PAUSED", "INIT")
    events = _events_of(_steps([1.0] * 400, ranks=4), _side_steps(list(range(400))).assign(
        task_id=tid))  # fmt: skip
    events.insert(17, {"kind": "step", "rank": 0, "step": "seven"})
    events.insert(40, {"kind": "side_task_step"})
    arrived: list[dict[str, Any]] = []
    asked: list[int] = []

    def since(start: int) -> list[dict[str, Any]]:
        asked.append(start)
        return arrived[start:]

    loop = _governor_loop(run, _steps([1.0], ranks=4), _side_steps([0]), baseline_step_s=0.8)
    loop._events = since
    kept = []
    for chunk in range(0, len(events), 100):
        arrived += events[chunk : chunk + 100]
        loop.tick()
        kept.append(len(loop._windows) + len(loop._active))
    assert asked == list(range(0, len(events), 100))  # each tick from where the last ended
    assert loop._last_step == 398  # every step but the newest observed
    assert max(kept) <= 4  # the newest step and one in progress, never the run's


def test_the_governor_backs_off_when_one_of_the_runs_gpus_nears_its_power_cap(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Training keeps its pace, but GPU 1 draws 680 W of its 700 W cap: the governor widens
    the task's budget anyway, and says why."""
    from freeride_lab.gpu import nvml

    def sample(index: int, power_w: float) -> nvml.GpuSample:
        return nvml.GpuSample(index=index, t_ns=0, utilization_pct=90.0, memory_used_bytes=0.0,
                              memory_total_bytes=1.0, power_w=power_w, sm_clock_mhz=1980.0,
                              cuda_ordinal=index)  # fmt: skip

    monkeypatch.setattr(nvml, "read_samples", lambda: [sample(0, 420.0), sample(1, 680.0)])
    monkeypatch.setattr(nvml, "power_limit_w", lambda index=0: 700.0)
    tid = run.manager.attach(COUNTING, stage=1, budget_ms=20)["id"]
    run.state(tid, "PAUSED", "INIT")
    steps = _steps([1.0] * 8, ranks=4)
    side = _side_steps(list(range(8))).assign(task_id=tid)
    loop = _governor_loop(run, steps, side, baseline_step_s=0.8, gpu_ordinals=(0, 1))
    records = loop.tick()
    assert records, "no decision at the power cap"
    assert records[0]["budget_scale"] == 1.25
    assert "power 680 W > 665 W (95% of the 700 W cap)" in records[0]["reason"]


def test_a_governed_task_without_a_budget_of_its_own_starts_from_its_tight_guard(
    run: Run,
) -> None:
    """Profiled at a median of 58.7 ms and a p95 of 60 ms, a task keeps FreeRide's 72 ms
    guard (rounded up to 10 ms, x 1.2) until the governor takes it on; governed, it starts
    from 60 x 1.1 + 0.5 = 66.5 ms, the guard the bench's governed blocks measure."""
    tid = run.manager.attach(COUNTING, stage=1)["id"]
    run.state(tid, "PAUSED", "INIT")
    profile = {"budget_s": 0.072, "median_step_s": 0.0587, "p95_step_s": 0.060,
               "memory_request_bytes": 0, "t_ns": run.clock[0] + 1}  # fmt: skip
    profile_path(run.run_dir.path, tid).write_text(json.dumps(profile))
    assert run.manager.task(tid)["budget_ms"] == pytest.approx(72.0)
    assert run.manager.base_budget_s(tid) == pytest.approx(0.0665)
    steps = _steps([1.0] * 4, ranks=4)
    (start,) = _governor_loop(run, steps, _side_steps([]), baseline_step_s=0.8).tick()
    assert (start["task_id"], start["budget_ms"], start["applied"]) == (tid, 66.5, True)
    assert run.manager.task(tid)["budget_ms"] == pytest.approx(66.5)
    assert _governor_loop(run, steps, _side_steps([]), baseline_step_s=0.8).tick() == []


def test_a_driven_governor_loop_keeps_to_its_tasks_budget_base_and_first_step(run: Run) -> None:
    """What the benchmark's governed blocks rely on: only the named task is governed, its
    budget scales the base given, and steps before ``skip_to`` are not observed."""
    mine = run.manager.attach(COUNTING, stage=1, budget_ms=20)["id"]
    other = run.manager.attach(COUNTING, stage=2, budget_ms=20)["id"]
    for tid in (mine, other):
        run.state(tid, "PAUSED", "INIT")
    steps = _steps([1.2] * 6 + [1.0] * 6 + [1.2] * 6, ranks=4)  # 20% slow, quiet, slow again
    side = pd.concat([_side_steps(list(range(18))).assign(task_id=t) for t in (mine, other)])
    loop = _governor_loop(
        run,
        steps,
        side,
        baseline_step_s=0.8,  # the quiet steps' window (``_steps``: 80% of the period)
        task_ids=(mine,),
        base_budget_s=lambda _: 0.008,
    )
    loop.skip_to(6)  # the slow steps 0-5 ran under other conditions
    start, *records = loop.tick()
    assert (start["task_id"], start["budget_ms"], start["reason"]) == (
        mine,
        8.0,
        "governed: starts from its base budget",
    )  # its 20 ms before, put on the base at once
    assert records, "no decision for 20% overhead"
    assert {r["task_id"] for r in records} == {mine}
    assert min(r["step"] for r in records) >= 12  # quiet 6-11 decide nothing: overhead 0
    assert records[0]["budget_ms"] == pytest.approx(8.0 * records[0]["budget_scale"])
    assert run.manager.task(other)["budget_ms"] == pytest.approx(20.0)


def test_the_governor_raises_a_trickle_tasks_duty_while_training_keeps_its_pace(run: Run) -> None:
    tid = run.manager.attach(COUNTING, stage=1, budget_ms=20, gating="trickle")["id"]
    bubbles_only = run.manager.attach(COUNTING, stage=2, budget_ms=20)["id"]
    for t in (tid, bubbles_only):
        run.state(t, "PAUSED", "INIT")
    steps = _steps([1.0] * 12, ranks=4)  # no slower than the baseline: room to spare
    side = pd.concat([_side_steps(list(range(12))).assign(task_id=t) for t in (tid, bubbles_only)])
    records = _governor_loop(run, steps, side, baseline_step_s=0.8).tick()
    duties = [r["trickle_duty"] for r in records if r["task_id"] == tid]
    assert duties[:2] == [0.05, 0.1]  # additive, from duty 0 (bubbles only) up
    assert run.manager.task(tid)["trickle_duty"] == duties[-1]
    assert ("tune", (tid, {"trickle_duty": 0.05})) in [s[1:] for s in run.sent]
    assert all(math.isnan(r["trickle_duty"]) for r in records if r["task_id"] == bubbles_only)
    assert run.manager.task(bubbles_only)["trickle_duty"] == 0.0


def test_a_loop_that_does_not_trickle_holds_a_trickle_task_in_bubbles(run: Run) -> None:
    tid = run.manager.attach(COUNTING, stage=1, budget_ms=20, gating="trickle")["id"]
    run.state(tid, "PAUSED", "INIT")
    run.manager.tune(tid, trickle_duty=0.3)
    steps = _steps([1.0] * 12, ranks=4)
    side = _side_steps(list(range(12))).assign(task_id=tid)
    records = _governor_loop(run, steps, side, baseline_step_s=0.8, trickle=False).tick()
    assert run.manager.task(tid)["trickle_duty"] == 0.0
    assert all(math.isnan(r["trickle_duty"]) for r in records)


def test_trickle_duty_is_refused_for_a_task_that_steps_in_bubbles_only(run: Run) -> None:
    tid = run.manager.attach(COUNTING, stage=1, budget_ms=20)["id"]
    run.state(tid, "PAUSED", "INIT")
    with pytest.raises(ValueError, match="only a task attached with gating 'trickle'"):
        run.manager.tune(tid, trickle_duty=0.2)
    with pytest.raises(ValueError, match=r"trickle_duty=1.5 must be in \[0, 1\]"):
        run.manager.tune(tid, trickle_duty=1.5)
