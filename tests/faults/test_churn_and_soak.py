"""Churn and soak: attach/tune/detach cycles during one CPU run, and a long run with
a side task, watching the launching process for leaks.

- churn: N cycles of attach (re-attach by id) → a step of progress → tune → detach on one
  2-stage sleep-timed run. Every re-attach restores at least the progress it was detached at;
  open file descriptors and threads of this (the launching) process stay within a small bound
  after warm-up; no /dev/shm entry is left after the run stops. N=200 (about 2.5 min).
- soak: a run plus one side task for 2 minutes (20 under ``slow``), sampling RSS, open file
  descriptors and threads of this process every few seconds while reading the session the
  way a dashboard does; RSS, fds and threads grow at most 5% after warm-up (the session keeps
  its events in packed columns, tens of bytes each: ``lab.tables`` [Note: bounded memory]).
  The samples are logged (``-o log_cli=true --log-cli-level=INFO`` shows them).

Waits are for named conditions with deadlines; the only sleeps are the sampling period.
"""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
from runs import TOYS, synthetic_config, task, wait_in_run

from freeride_lab.lab.session import Session
from freeride_lab.pipeline.launcher import RunState

pytestmark = pytest.mark.slow  # minutes of attach/tune/detach churn and a soak on a live run

COUNTING = f"{TOYS}:Counting"
STARTUP_S = 240.0
LIVE_S = 120.0
CONFIG = synthetic_config(steps=1_000_000, seed=3)  # stopped by the test
log = logging.getLogger(__name__)
FD_SLACK, THREAD_SLACK = 6, 3  # sockets/threads that come and go with a command in flight


def created(run: Session, task_id: str) -> pd.DataFrame:
    """The CREATE events of the task's processes, oldest first, from its own event file (the
    whole-run ``run.events`` table decodes every event of the run: too slow to poll)."""
    path = run.run_dir.events_dir / f"task-{task_id}.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    events = [json.loads(line) for line in lines if line.endswith("}")]
    rows = [e for e in events if e.get("kind") == "side_task_state" and e.get("event") == "CREATE"]
    return pd.DataFrame(rows, columns=["t_ns", "reason"]).sort_values("t_ns")


def restored(reason: str) -> float:
    found = re.search(r"restored progress ([0-9.e+]+)", reason)
    return float(found.group(1)) if found else 0.0


def shm_entries() -> set[str]:
    shm = Path("/dev/shm")
    return {p.name for p in shm.iterdir()} if shm.is_dir() else set()


def usage() -> dict[str, float]:
    me = psutil.Process()
    return {"rss": me.memory_info().rss, "fds": me.num_fds(), "threads": me.num_threads()}


def churn(run: Session, cycles: int) -> None:
    first = run.attach(COUNTING, stage=0, options={"step_s": 0.002}, policy="WARN")
    tid = first["id"]
    detached_at = 0.0
    warm: dict[str, float] | None = None
    for cycle in range(cycles):
        if cycle:
            processes = len(created(run, tid))
            assert run.attach(tid)["id"] == tid
            wait_in_run(
                lambda p=processes: len(created(run, tid)) > p, LIVE_S, "the new process", run
            )
            back = restored(created(run, tid).iloc[-1]["reason"])
            assert back >= detached_at, f"cycle {cycle}: restored {back} < {detached_at}"
        start = task(run, tid)["progress"]
        wait_in_run(lambda s=start: task(run, tid)["progress"] > s, LIVE_S, "progress", run)
        run.tune(tid, budget_ms=5.0 + cycle % 2)  # no restart: cycles stay cheap
        detached = run.detach(tid)
        assert detached["state"] == "STOPPED"
        detached_at = detached["progress"]
        if cycle == min(5, cycles - 1):
            warm = usage()
    assert warm is not None
    now = usage()
    log.info("churn: %d cycles, warm-up %s, end %s", cycles, warm, now)
    assert now["fds"] <= warm["fds"] + FD_SLACK, (warm, now)
    assert now["threads"] <= warm["threads"] + THREAD_SLACK, (warm, now)


@pytest.mark.parametrize(
    "cycles",
    [pytest.param(200, marks=pytest.mark.timeout(900))],  # ~2.5 min on a shared 2-core box
    ids=["ci"],
)
def test_attach_tune_detach_churn_loses_no_progress_and_leaks_nothing(
    tmp_path: Path, cycles: int
) -> None:
    shm_before = shm_entries()
    run = Session.launch(CONFIG, run_dir=tmp_path / "churn", grace_s=3)
    try:
        wait_in_run(lambda: run.steps_done >= 1, STARTUP_S, "the first training step", run)
        churn(run, cycles)
        steps = run.steps
        assert run.failure is None
        # every rank did every step so far
        per_rank = steps.groupby("rank")["step"].nunique()
        assert per_rank.min() >= per_rank.max() - 1
    finally:
        run.stop()
    assert run.state == RunState.STOPPED
    left = shm_entries() - shm_before
    assert not left, f"shared-memory entries left behind: {sorted(left)}"


def soak(run: Session, duration_s: float, period_s: float) -> list[dict[str, float]]:
    tid = run.attach(COUNTING, stage=0, options={"step_s": 0.002}, policy="WARN")["id"]
    samples = []
    end = time.monotonic() + duration_s
    while time.monotonic() < end:
        assert not run.state.done, f"the run ended early: {run.state}"
        # read the session the way a dashboard does
        assert task(run, tid)["state"] not in ("FAILED", "STOPPED")
        _ = run.steps_done, len(run.side_task_steps)
        samples.append({**usage(), "events": float(len(run._tables))})  # events the session holds
        time.sleep(period_s)
    return samples


@pytest.mark.parametrize(
    ("duration_s", "period_s"),
    [
        pytest.param(120.0, 4.0, marks=pytest.mark.timeout(900)),
        pytest.param(1200.0, 10.0, marks=[pytest.mark.soak, pytest.mark.timeout(2400)]),
    ],
    ids=["2min", "20min"],
)
def test_soak_keeps_memory_fds_and_threads_flat(
    tmp_path: Path, duration_s: float, period_s: float
) -> None:
    run = Session.launch(CONFIG, run_dir=tmp_path / "soak", grace_s=3)
    try:
        wait_in_run(lambda: run.steps_done >= 1, STARTUP_S, "the first training step", run)
        samples = soak(run, duration_s, period_s)
    finally:
        run.stop()
    warm_up = len(samples) // 4  # the first quarter: imports, caches, the task's first steps
    after = samples[warm_up:]
    assert len(after) >= 6
    base, last = after[0], after[-1]
    log.info("soak: warm-up %s, end %s, %d samples", base, last, len(samples))
    for key in ("fds", "threads"):
        assert last[key] <= max(base[key] * 1.05, base[key] + 1), (
            f"{key} grew from {base[key]} to {last[key]} ({[s[key] for s in samples]})"
        )
    kept = last["events"] - base["events"]
    assert last["rss"] <= base["rss"] * 1.05, (
        f"RSS grew from {base['rss']:.0f} to {last['rss']:.0f} with {kept:.0f} more events "
        f"({(last['rss'] - base['rss']) / max(kept, 1):.0f} B each): "
        f"{[round(s['rss'] / 2**20) for s in samples]} MiB"
    )
