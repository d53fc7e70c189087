"""Claims about side tasks in a real run: a 4-stage sleep-timed CPU pipeline (torchrun, gloo)
with side tasks attached, tuned, moved, detached and re-attached while it trains, three that
fail in their own ways, and a naive one; then training is checked against a run without any.

One run serves the whole module (its behaviours do not interfere: each stage's worker runs one
task at a time, and the tasks that fail share stage 0, where they queue). A second run, without
side tasks and with zero-cost stages, gives the reference losses. Waits are for named conditions
with deadlines; a wait fails at once, with a hint, if the run ends first.

Over 500 lines: the claims share module-scoped real runs, which a split would start again.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from runs import (
    Runs,
    assert_trains_every_step,
    runs_with_tasks,
    synthetic_config,
    task,
    toy,
    wait_in_run,
)

from freeride_lab.core.budget import memory_request_gib, step_budget_s
from freeride_lab.lab.session import Session
from freeride_lab.pipeline.launcher import RunState

STARTUP_S = 240.0  # first step of two fresh runs on a loaded two-core box
LIVE_S = 120.0  # the longest a live behaviour may take to show
STEPS = 170  # long enough for every live test below on a busy two-core box
CONFIG = synthetic_config(steps=STEPS, seed=7, stages=4, phase_ms=10.0)
PAGERANK = {"n_nodes": 2000, "n_edges": 10000, "tol": 0.0, "max_iterations": None}
TOLERANCE_MS = 5.0  # run-clock stamps of a rank and of a task process, same host


def attach_tasks(main: Session) -> dict[str, dict[str, Any]]:
    return {
        "pagerank": main.attach("pagerank", stage=1, options=PAGERANK, policy="WARN"),
        "counting": main.attach(toy("Counting"), stage=2, options={"step_s": 0.003}, policy="WARN"),
        # stage 0's FIFO: each starts once the one before it has failed
        "raises": main.attach(toy("RaisingInStep"), stage=0),
        "hog": main.attach(toy("MemoryHog"), stage=0, memory="256MiB"),
        "hangs": main.attach(toy("HangingStep"), stage=0, policy="KILL"),
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    root = tmp_path_factory.mktemp("side-tasks")
    with runs_with_tasks(CONFIG, root, attach_tasks, startup_s=STARTUP_S) as started:
        yield started


def created(run: Session, task_id: str) -> pd.DataFrame:
    """The task's CREATE events (one per task process that came up), in time order."""
    events = run.events
    mine = events[
        (events["kind"] == "side_task_state")
        & (events["task_id"] == task_id)
        & (events["event"] == "CREATE")
    ]
    return mine.sort_values("t_ms")


def restored(reason: str) -> float | None:
    """The progress a CREATED reason says was restored from a checkpoint."""
    found = re.search(r"restored progress ([0-9.e+]+)", reason)
    return float(found.group(1)) if found else None


def new_process(run: Session, task_id: str, before: int) -> pd.Series:
    """Wait for the task's next process to come up; its CREATED event."""
    wait_in_run(
        lambda: len(created(run, task_id)) > before, LIVE_S, f"a new process of {task_id}", run
    )
    return created(run, task_id).iloc[-1]


def wait_steps_after(run: Session, task_id: str, t_ms: float) -> pd.DataFrame:
    """Wait for the task's first step that started after ``t_ms``; its steps since then."""

    def since() -> pd.DataFrame:
        steps = run.side_task_steps
        return steps[(steps["task_id"] == task_id) & (steps["start_ms"] > t_ms)]

    wait_in_run(lambda: len(since()) > 0, LIVE_S, f"a step of {task_id} after {t_ms:.0f} ms", run)
    return since()


# -- while training runs -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "match"),
    [
        ({"task": toy("Counting"), "stage": 3, "memory": "100TB"}, "stage 3 cannot host"),
        ({"task": "no_such_task"}, "unknown side task 'no_such_task'"),
        ({"task": toy("Counting"), "stage": 3, "budget_ms": -1.0}, "budget_ms=-1.0 must be"),
        ({"task": toy("Counting"), "stage": 4}, "stage=4 is out of range"),
    ],
    ids=["memory-above-free", "unknown-task", "negative-budget", "stage-out-of-range"],
)
def test_rejected_requests_leave_the_run_untouched(
    runs: Runs, request_: dict[str, Any], match: str
) -> None:
    run = runs.main
    before = [(t["id"], t["stage"]) for t in run.tasks]
    folders = sorted(p.name for p in (run.run_dir.path / "tasks").iterdir())
    with pytest.raises(ValueError, match=match):
        run.attach(**request_)
    assert [(t["id"], t["stage"]) for t in run.tasks] == before
    assert sorted(p.name for p in (run.run_dir.path / "tasks").iterdir()) == folders


def test_side_tasks_report_progress_and_a_profile(runs: Runs) -> None:
    run = runs.main

    def profiled() -> bool:
        return all(
            task(run, runs.ids[k])["progress"] > 5 and task(run, runs.ids[k])["profile"]
            for k in ("pagerank", "counting")
        )

    wait_in_run(profiled, LIVE_S, "progress and a profile of pagerank and counting", run)
    for key in ("pagerank", "counting"):
        t = task(run, runs.ids[key])
        profile = t["profile"]
        assert t["unit"] == "iterations"
        assert t["budget_ms"] == pytest.approx(step_budget_s(profile["median_step_s"]) * 1e3)
        assert t["memory_bytes"] == memory_request_gib(profile["peak_memory_bytes"]) * 2**30


def test_tune_changes_limits_and_the_task_dict_echoes_them(runs: Runs) -> None:
    run, tid = runs.main, runs.ids["counting"]
    tuned = run.tune(tid, budget_ms=20)
    assert (tuned["budget_ms"], tuned["sm_pct"]) == (20.0, None)
    processes = len(created(run, tid))
    tuned = run.tune(tid, sm_pct=50)  # read only at process start: a transparent restart
    assert (tuned["budget_ms"], tuned["sm_pct"]) == (20.0, 50.0)
    restart = new_process(run, tid, processes)
    assert '"sm_pct": 50.0' in restart["reason"]
    wait_steps_after(run, tid, restart["t_ms"])


def test_a_restart_for_new_limits_profiles_the_task_again(runs: Runs) -> None:
    run, tid = runs.main, runs.ids["counting"]
    processes = len(created(run, tid))
    run.tune(tid, sm_pct=40)
    new_process(run, tid, processes)  # the old profile was measured under other limits
    wait_in_run(lambda: task(run, tid)["profile"], LIVE_S, "a new profile", run)
    profile = task(run, tid)["profile"]
    assert (profile["sm_pct"], profile["n_steps"], profile["budget_in_force_s"]) == (40.0, 5, 0.02)


def test_move_changes_stage_and_keeps_progress(runs: Runs) -> None:
    run, tid = runs.main, runs.ids["counting"]
    wait_in_run(lambda: task(run, tid)["progress"] > 0, LIVE_S, "counting's progress", run)
    processes = len(created(run, tid))
    moved = run.move(tid, 3)
    assert (moved["id"], moved["stage"]) == (tid, 3)
    there = new_process(run, tid, processes)
    assert restored(there["reason"]) == moved["progress"]
    after = wait_steps_after(run, tid, there["t_ms"])
    assert set(after["stage"]) == {3}
    assert task(run, tid)["progress"] > moved["progress"]


def test_detach_and_reattach_continue_from_the_checkpoint(runs: Runs) -> None:
    run, tid = runs.main, runs.ids["pagerank"]
    wait_in_run(lambda: task(run, tid)["progress"] >= 3, LIVE_S, "pagerank's progress", run)
    detached = run.detach(tid)
    assert (detached["state"], detached["detached"]) == ("STOPPED", True)
    processes = len(created(run, tid))
    again = run.attach(tid)
    assert (again["id"], again["stage"], again["state"]) == (tid, 1, "SUBMITTED")
    back = new_process(run, tid, processes)
    assert restored(back["reason"]) == detached["progress"]
    wait_steps_after(run, tid, back["t_ms"])
    assert task(run, tid)["progress"] > detached["progress"]


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("raises", r"^step raised RuntimeError: boom in step$"),
        ("hog", r"^out of memory: MemoryError"),
        ("hangs", r"^hung: step \d+ ran [\d.]+ s, over 2 x budget \+ 1 s = 1 s"),
    ],
)
def test_failing_task_ends_failed_with_its_reason(runs: Runs, key: str, reason: str) -> None:
    run, tid = runs.main, runs.ids[key]
    wait_in_run(lambda: task(run, tid)["state"] == "FAILED", LIVE_S, f"{key} to fail", run)
    assert re.search(reason, task(run, tid)["error"]), task(run, tid)["error"]


def test_naive_task_runs_through_training_compute(runs: Runs) -> None:
    run = runs.main
    failed = [runs.ids[k] for k in ("raises", "hog", "hangs")]
    wait_in_run(
        lambda: all(task(run, t)["state"] == "FAILED" for t in failed),
        LIVE_S,
        "stage 0's failing tasks to end",
        run,
    )
    tid = run.attach(toy("Counting"), stage=0, options={"step_s": 0.003}, gating="none")["id"]
    runs.ids["naive"] = tid
    wait_in_run(lambda: task(run, tid)["steps"] >= 100, LIVE_S, "100 naive steps", run)
    run.detach(tid)
    steps = run.side_task_steps
    steps = steps[steps["task_id"] == tid]
    actions = run.actions
    actions = actions[actions["rank"] == 0]
    assert (busy_ms(actions, steps) > 0).sum() > 0
    assert task(run, tid)["overruns"] > 0


def in_compute_share(run: Session, task_id: str, after_step: int) -> tuple[float, int]:
    """Of ``task_id``'s steps in training steps after ``after_step`` whose actions its rank has
    written: the share that ran wholly inside its rank's compute, and how many steps there were.

    A rank writes a training step's actions once the step is over, while a side task's steps
    stream in as they end: a step counted before its training step's actions are known would
    look as if it ran outside all compute."""
    actions = run.actions
    written = actions.groupby("rank")["step"].max()
    steps = run.side_task_steps
    steps = steps[(steps["task_id"] == task_id) & (steps["step"] > after_step)]
    steps = steps[steps["step"] <= steps["rank"].map(written).fillna(-1).to_numpy()]
    busy = busy_ms(actions, steps)
    whole = busy >= (steps["end_ms"] - steps["start_ms"]).to_numpy() - 0.1
    return float(whole.mean()), len(steps)


def test_trickle_task_steps_through_compute_as_far_as_its_duty_allows(runs: Runs) -> None:
    run = runs.main
    tid = run.attach(  # priority 0: it takes stage 2 whether or not "counting" is still there
        toy("Counting"),
        stage=2,
        options={"step_s": 0.002},
        budget_ms=3,
        gating="trickle",
        priority=0,
    )["id"]
    runs.ids["trickle"] = tid
    assert run.governor is not None  # a trickle task's duty is the governor's to set ...
    run.disable_governor()  # ... here the test's
    wait_in_run(lambda: task(run, tid)["steps"] >= 10, LIVE_S, "the first trickle steps", run)
    assert task(run, tid)["trickle_duty"] == 0.0  # starts in bubbles only

    def phase(duty: float) -> float:
        assert run.tune(tid, trickle_duty=duty)["trickle_duty"] == duty
        after = run.steps_done + 1  # steps that may have started before the tune are left out
        wait_in_run(
            lambda: in_compute_share(run, tid, after)[1] >= 60, LIVE_S, f"60 steps at {duty}", run
        )
        return in_compute_share(run, tid, after)[0]

    through, held = phase(0.5), phase(0.0)
    run.detach(tid)
    assert through >= 0.15, through  # between bubbles, while stage 2 computes
    assert held <= 0.05, held  # duty 0: bubbles only, as under gating "bubbles"
    with pytest.raises(ValueError, match="only a task attached with gating 'trickle'"):
        run.tune(runs.ids["counting"], trickle_duty=0.5)

    run.govern_trickle_tasks = False  # a caller that sets the duties itself (the benchmark)
    try:
        quiet = run.attach(toy("Counting"), stage=2, budget_ms=3, gating="trickle")["id"]
        assert run.governor is None
        run.detach(quiet)
    finally:
        run.govern_trickle_tasks = True


def test_governor_tunes_live_tasks_and_logs_its_decisions(runs: Runs) -> None:
    run = runs.main
    steps = run.steps
    period_s = float(steps.groupby("step")["start_ms"].min().diff().median()) / 1e3
    # A baseline well below the real pace: every step looks 100% slower, so it must act.
    loop = run.enable_governor(
        target_frac=0.01, baseline_step_s=period_s / 2, window=2, settle_steps=0
    )

    def decisions() -> pd.DataFrame:  # past the tasks' start on their base budgets
        log = run.governor_log
        return log[log["reason"].str.contains("overhead")]

    try:
        wait_in_run(lambda: len(decisions()) > 0, LIVE_S, "a governor decision", run)
    finally:
        run.disable_governor()
    assert not loop.running
    decision = decisions().iloc[0]
    assert decision["task_id"] in (runs.ids["pagerank"], runs.ids["counting"])
    assert decision["budget_scale"] > 1.0
    starts = run.governor_log.query("budget_scale == 1.0")
    assert (starts["reason"] == "governed: starts from its base budget").all()


# -- after training ----------------------------------------------------------------------------


def test_training_completes_every_step_on_every_rank(runs: Runs) -> None:
    assert_trains_every_step(runs.main, steps=STEPS, ranks=4, timeout_s=STARTUP_S + STEPS * 2.0)


def test_losses_equal_a_run_without_side_tasks(runs: Runs) -> None:
    assert runs.main.wait(timeout_s=STARTUP_S + STEPS * 2.0) == RunState.FINISHED
    assert runs.vanilla.wait(timeout_s=STARTUP_S) == RunState.FINISHED
    with_tasks = runs.main.steps.query("rank == 3")["loss"].tolist()
    without = runs.vanilla.steps.query("rank == 3")["loss"].tolist()
    assert len(with_tasks) == STEPS
    assert with_tasks == without


def busy_before(starts: np.ndarray, ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Compute time of sorted, disjoint actions [starts, ends) before each time in ``t``."""
    done = np.concatenate([[0.0], np.cumsum(ends - starts)])  # busy time before action i
    i = np.searchsorted(starts, t, side="right") - 1
    j = np.maximum(i, 0)
    partial = np.minimum(np.clip(t - starts[j], 0.0, None), (ends - starts)[j])
    return np.where(i >= 0, done[j] + partial, 0.0)


def busy_ms(actions: pd.DataFrame, spans: pd.DataFrame) -> np.ndarray:
    """For each span (rank, start_ms, end_ms): its overlap with its rank's compute actions."""
    out = np.zeros(len(spans))
    for rank, mine in actions.groupby("rank"):
        mine = mine.sort_values("start_ms")
        starts, ends = mine["start_ms"].to_numpy(), mine["end_ms"].to_numpy()
        rows = (spans["rank"] == rank).to_numpy()
        span_ends = busy_before(starts, ends, spans.loc[rows, "end_ms"].to_numpy())
        out[rows] = span_ends - busy_before(starts, ends, spans.loc[rows, "start_ms"].to_numpy())
    return out


def idle_intervals(run: Session) -> pd.DataFrame:
    """Each rank's measured idle intervals per step (rank, step, start_ms, end_ms): the bubbles
    table (gaps inside the step's global window) plus the rank's own lead-in and tail: from the
    end of its previous step's optimizer (its window start for the first step) to its first
    action, and from its last action to its window end."""
    bubbles = run.bubbles[["rank", "step", "start_ms", "end_ms"]]
    actions = run.actions.groupby(["rank", "step"]).agg(
        first=("start_ms", "min"), last=("end_ms", "max")
    )
    steps = run.steps.sort_values(["rank", "step"])
    optimizer_end = (steps["end_ms"] + steps["optimizer_ms"]).groupby(steps["rank"]).shift(1)
    steps = steps.assign(start_ms=optimizer_end.fillna(steps["start_ms"]))
    windows = steps.set_index(["rank", "step"])[["start_ms", "end_ms"]].join(actions)
    lead = windows.reset_index()[["rank", "step", "start_ms", "first"]]
    tail = windows.reset_index()[["rank", "step", "last", "end_ms"]]
    lead.columns = tail.columns = ["rank", "step", "start_ms", "end_ms"]
    return pd.concat([bubbles, lead, tail], ignore_index=True)


def gated_steps(runs: Runs) -> pd.DataFrame:
    """The side-task steps of the tasks that step in bubbles only (not the naive or the
    trickle task)."""
    steps = runs.main.side_task_steps
    through = {runs.ids.get("naive", ""), runs.ids.get("trickle", "")}
    return steps[~steps["task_id"].isin(through)]


def test_managed_side_task_steps_lie_inside_measured_bubbles(runs: Runs) -> None:
    run = runs.main
    assert run.wait(timeout_s=STARTUP_S + STEPS * 2.0) == RunState.FINISHED
    steps = gated_steps(runs).reset_index(drop=True)
    assert len(steps) > 100
    steps["row"] = steps.index
    pairs = steps.merge(idle_intervals(run), on=["rank", "step"], suffixes=("", "_idle"))
    pairs["inside"] = (pairs["start_ms_idle"] - TOLERANCE_MS <= pairs["start_ms"]) & (
        pairs["end_ms"] <= pairs["end_ms_idle"] + pairs["overrun_ms"] + TOLERANCE_MS
    )
    inside = pairs.groupby("row")["inside"].any().reindex(steps.index, fill_value=False)
    steps["busy_ms"] = busy_ms(run.actions, steps)
    outside = steps[~inside | (steps["busy_ms"] > steps["overrun_ms"] + TOLERANCE_MS)]
    columns = ["task_id", "rank", "step", "start_ms", "end_ms", "overrun_ms", "busy_ms"]
    assert outside[columns].to_dict("records") == []


def merged_bubbles(bubbles: pd.DataFrame) -> dict[int, list[tuple[float, float]]]:
    """Each rank's idle time from the bubbles table, rows that touch merged into one span."""
    out: dict[int, list[tuple[float, float]]] = {}
    for rank, mine in bubbles.sort_values("start_ms").groupby("rank"):
        spans: list[tuple[float, float]] = []
        for a, b in zip(mine["start_ms"], mine["end_ms"], strict=True):
            if spans and a <= spans[-1][1] + 1e-6:
                spans[-1] = (spans[-1][0], max(spans[-1][1], b))
            else:
                spans.append((a, b))
        out[int(rank)] = spans
    return out


def test_managed_side_task_steps_lie_inside_the_bubble_table_by_time(runs: Runs) -> None:
    # the table alone, joined by time: no stitching of lead-ins and tails as above
    run = runs.main
    assert run.wait(timeout_s=STARTUP_S + STEPS * 2.0) == RunState.FINISHED
    steps = gated_steps(runs)
    idle = merged_bubbles(run.bubbles)
    outside = [
        (row.task_id, row.rank, row.step, row.start_ms, row.end_ms)
        for row in steps.itertuples(index=False)
        if not any(
            a - TOLERANCE_MS <= row.start_ms and row.end_ms <= b + row.overrun_ms + TOLERANCE_MS
            for a, b in idle.get(int(row.rank), [])
        )
    ]
    assert len(steps) > 100 and outside == []


def test_the_ledger_counts_each_task_work(runs: Runs) -> None:
    run = runs.main
    assert run.wait(timeout_s=STARTUP_S + STEPS * 2.0) == RunState.FINISHED
    ledger = run.ledger().set_index("task_id")
    for key in ("pagerank", "counting"):
        t = task(run, runs.ids[key])
        assert ledger.loc[t["id"], "progress"] == pytest.approx(t["progress"])
        assert ledger.loc[t["id"], "throughput_per_s"] > 0


# -- on a GPU (run on an H200; skipped elsewhere) --------------------------------------------
# One CUDA rank under a private MPS daemon. With a single stage the pipeline has no bubbles, so
# these tasks run with gating="none"; the claims are about limits, which do not depend on it.

GPU_TASKS = Path(__file__).resolve().parent / "gpu_tasks.py"
GPU_CONFIG = CONFIG.replace(
    stages=1,
    steps=100_000,
    device="cuda",
    mps=True,
    t_forward_ms=20.0,
    t_backward_input_ms=20.0,
    t_backward_weight_ms=20.0,
)


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    from freeride_lab.gpu.mps import MpsDaemon

    available = MpsDaemon.available()
    if not available:
        pytest.skip(f"MPS unavailable: {available.reason}")
    run = Session.launch(GPU_CONFIG, run_dir=tmp_path_factory.mktemp("gpu") / "run", grace_s=5)
    try:
        wait_in_run(lambda: run.steps_done >= 2, STARTUP_S, "two CUDA training steps", run)
        yield run
    finally:
        run.stop()


def task_process(run: Session, task_id: str) -> Any:
    """The live process of a task (``psutil.Process``), from its worker."""
    import psutil

    from freeride_lab.sidetasks.client import WorkerClient

    def pid() -> int | None:
        status = WorkerClient.from_run_dir(run.run_dir.path, 0).status().payload
        found = [t["pid"] for t in status["tasks"] if t["task_id"] == task_id]
        return found[0] if found else None

    wait_in_run(pid, LIVE_S, f"the process of {task_id}", run)
    return psutil.Process(pid())


@pytest.mark.gpu
def test_side_task_over_its_mps_memory_cap_fails_alone_and_training_goes_on(
    gpu_run: Session,
) -> None:
    run = gpu_run
    hog = run.attach(f"{GPU_TASKS}:CudaHog", stage=0, memory="1GiB", budget_ms=5, gating="none")[
        "id"
    ]
    wait_in_run(lambda: task(run, hog)["state"] == "FAILED", LIVE_S, "the hog to fail", run)
    assert task(run, hog)["error"].startswith("out of memory:"), task(run, hog)["error"]
    steps = run.steps_done
    wait_in_run(lambda: run.steps_done >= steps + 3, LIVE_S, "three more training steps", run)
    assert run.failure is None


@pytest.mark.gpu
def test_mps_limits_reach_the_task_process_and_not_the_trainer(gpu_run: Session) -> None:
    run = gpu_run
    spin = run.attach(
        f"{GPU_TASKS}:CudaSpin", stage=0, memory="2GiB", sm_pct=25, budget_ms=5, gating="none"
    )["id"]
    try:
        env = task_process(run, spin).environ()
        assert env["CUDA_MPS_CLIENT_PRIORITY"] == "1"
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M"
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == run.run_dir.read_run()["mps"]["pipe_dir"]
        ranks = [p for p in run._run_processes() if "freeride_lab.pipeline.rank" in p.cmdline()]
        assert ranks
        for rank in ranks:
            rank_env = rank.environ()
            assert "CUDA_MPS_PIPE_DIRECTORY" in rank_env  # the trainer is an MPS client too
            assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in rank_env
            assert rank_env.get("CUDA_MPS_CLIENT_PRIORITY", "0") == "0"
    finally:
        run.detach(spin)


@pytest.mark.gpu
def test_a_smaller_sm_share_is_profiled_again_and_lengthens_the_step(gpu_run: Session) -> None:
    run = gpu_run
    spin = run.attach(f"{GPU_TASKS}:CudaSpin", stage=0, budget_ms=5, gating="none")["id"]
    try:
        wait_in_run(lambda: task(run, spin)["profile"], LIVE_S, "a profile at full share", run)
        full = task(run, spin)["profile"]["median_step_s"]
        run.tune(spin, sm_pct=20)
        wait_in_run(lambda: task(run, spin)["profile"], LIVE_S, "a profile at 20% of SMs", run)
        capped = task(run, spin)["profile"]
        assert capped["sm_pct"] == 20.0
        assert capped["median_step_s"] > 1.5 * full, (full, capped["median_step_s"])
    finally:
        run.detach(spin)


@pytest.mark.gpu
def test_a_step_lasts_until_its_gpu_work_is_done(gpu_run: Session) -> None:
    # step() returns as soon as its kernel is queued; the step must still be timed (and
    # budgeted) to the kernel's end, or queued work would spill past the bubble into training.
    run = gpu_run
    sleeper = run.attach(f"{GPU_TASKS}:CudaAsyncSleep", stage=0, gating="none")["id"]
    try:
        wait_in_run(lambda: task(run, sleeper)["profile"], LIVE_S, "a profile", run)
        assert task(run, sleeper)["profile"]["median_step_s"] >= 0.045
    finally:
        run.detach(sleeper)


@pytest.mark.gpu
def test_cuda_run_starts_its_mps_daemon_and_stops_it_after_every_process(
    gpu_run: Session,
) -> None:
    from freeride_lab.gpu.mps import MpsDaemon

    run = gpu_run
    entry = run.run_dir.read_run()["mps"]
    assert entry["active"] is True and run.mps_active
    daemon = MpsDaemon(entry["pipe_dir"], entry["log_dir"])
    assert daemon.is_running()
    run.stop()
    assert run._run_processes() == []
    assert not daemon.is_running()
