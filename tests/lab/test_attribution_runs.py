"""Claims about bubble attribution on real runs: a slow stage and late sends land where they
should (schedule idle, peer wait, host overhead).

One module fixture starts two sleep-timed synthetic torchrun jobs at once (gloo, two ranks
each; their torch imports overlap). Each rank installs its fault itself: the run's
``edges_factory`` is ``tests.lab.attribution_hooks:install``, which the rank calls before it
builds its stages. Each test reads a finished run back through ``Session.open``.

Expected values come from the configured fault and the planner: ``simulate`` with the run's
own measured costs gives each rank's schedule idle per step (window gaps, plus the wait for
the slowest rank's optimizer end at the boundary). Step claims look at the steps between the
warm-up step and the last one (which has no next step to wait for), through their median or
their bound, so one descheduled process on a busy two-core box does not decide a claim.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from runs import finish_torchrun, start_torchrun

from freeride_lab.core.attribution import PART_COLUMNS, attribution_by_step
from freeride_lab.core.config import RunConfig, RuntimeOptions
from freeride_lab.core.plan import Costs, simulate_summary
from freeride_lab.lab.session import Session

REPO = Path(__file__).resolve().parents[2]
JOB_TIMEOUT_S = 240
STEPS = 7
SKIP = 1  # the warm-up step
M = 4
T_MS = 10.0  # F per micro-batch; I and W take half of it each, so B takes T_MS too
SLOW_EXTRA_MS = 20.0  # stage 1's forward: 3x the others
SEND_DELAY_MS = 20.0  # after 0F1 (stage 0's F of micro-batch 1), before its send
TOL_MS = 1.0  # per step
HOOKS = "tests.lab.attribution_hooks:install"

FAULT_RUNS: dict[str, tuple[str, dict[str, object]]] = {
    "slow-stage": ("1F1B", {"slow_forward": {"stage": 1, "extra_ms": SLOW_EXTRA_MS}}),
    "late-sends": (
        "GPipe",
        {"send_delay": {"stage": 0, "delay_ms": SEND_DELAY_MS, "microbatch": 1}},
    ),
}


def launch(path: Path, schedule: str, fault: dict[str, object]) -> subprocess.Popen[bytes]:
    cfg = RunConfig(
        schedule=schedule,
        stages=2,
        microbatches=M,
        steps=STEPS,
        workload="synthetic",
        t_forward_ms=T_MS,
        t_backward_input_ms=T_MS / 2,
        t_backward_weight_ms=T_MS / 2,
        d_model=16,
        seq_len=8,
        microbatch_size=2,
        runtime=RuntimeOptions(edges_factory=HOOKS),
        notes=fault,
    )
    return start_torchrun(path, cfg)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Session]:
    root = tmp_path_factory.mktemp("attribution")
    started = {name: launch(root / name, *spec) for name, spec in FAULT_RUNS.items()}
    for name, proc in started.items():
        finish_torchrun(proc, root / name, JOB_TIMEOUT_S)
    return {name: Session.open(root / name) for name in FAULT_RUNS}


def session_of(runs: dict[str, Session], name: str) -> Path:
    return runs[name].run_dir.path


def sleeps(run_dir: Path, *, rank: int) -> np.ndarray:
    """The injected sleeps of ``rank`` as they ran, ms, in order (one per step here)."""
    lines = (run_dir / "logs" / f"sleeps-rank{rank}.txt").read_text().split()
    return np.array([int(x) / 1e6 for x in lines])


def kept(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["step"] >= SKIP]


def inner_steps(session: Session) -> pd.DataFrame:
    """Each rank's bubble ms and parts per step, for the steps after the warm-up step and
    before the last one."""
    by_step = kept(attribution_by_step(session.attribution))
    return by_step[by_step["step"] < STEPS - 1]


def per_step(session: Session) -> pd.DataFrame:
    """Median over the inner steps of each rank's bubble ms and parts per step."""
    return inner_steps(session).groupby("rank").median()


def tolerance_ms(session: Session, rank: int) -> float:
    """1 ms per step, or the run's own step-to-step noise when the box makes it larger (the
    interquartile range of the rank's bubble ms per step): a median step cannot be matched
    closer than its run repeats itself."""
    bubble = inner_steps(session).groupby("rank")["bubble_ms"].quantile([0.25, 0.75])
    return max(TOL_MS, float(bubble[rank][0.75] - bubble[rank][0.25]))


def simulated_idle_ms(session: Session) -> pd.Series:
    """Each rank's schedule idle per step: the plan run with the run's measured median costs
    (every step's), idle from its first action to the next step's start (after every rank's
    optimizer)."""
    cfg = session.config
    costs = Costs.from_actions(session.actions, stages=cfg.stages, comm_ms=0.0, dispatch_ms=0.0)
    sim = simulate_summary(cfg.schedule, cfg.stages, cfg.microbatches, costs=costs)
    optimizer = session.steps.groupby("rank")["optimizer_ms"].median()
    done = sim.set_index("rank")["last_end_ms"] + optimizer
    busy = sim.set_index("rank")["busy_ms"]
    return done.max() - busy - optimizer


def test_every_bubble_of_a_real_run_splits_into_parts_that_sum_to_it(
    runs: dict[str, Session],
) -> None:
    for name, session in runs.items():
        parts = session.attribution
        assert len(parts) > 0 and not parts[list(PART_COLUMNS)].isna().any().any(), name
        assert (parts[list(PART_COLUMNS)] >= 0).all().all(), name
        total = parts[list(PART_COLUMNS)].sum(axis=1)
        assert (total - parts["duration_ms"]).abs().max() < 1e-6, name


def test_a_slow_stage_is_schedule_idle_on_every_rank(runs: dict[str, Session]) -> None:
    session = runs["slow-stage"]
    steps = inner_steps(session)
    expected = simulated_idle_ms(session)
    # stage 1's 3x forward leaves rank 0 idle for most of each step: the schedule's doing
    assert expected[0] > M * SLOW_EXTRA_MS
    # rank 0 waits inside the step only: never more than the schedule implies, and as much in
    # a step where none of its actions ran longer than its median (which shortens the wait
    # that follows)
    got = steps[steps["rank"] == 0]["schedule_ms"]
    assert (got <= expected[0] + TOL_MS).all(), got.tolist()
    assert got.max() == pytest.approx(expected[0], abs=TOL_MS)
    # rank 1 waits at the boundary, whose parts fall into two steps' bubbles
    assert per_step(session).loc[1, "schedule_ms"] == pytest.approx(
        expected[1], abs=tolerance_ms(session, 1)
    )


def test_a_late_send_is_the_senders_host_overhead(runs: dict[str, Session]) -> None:
    parts = kept(runs["late-sends"].attribution)
    rank0 = parts[parts["rank"] == 0].set_index(["step", "before"])
    # GPipe: rank 0 runs its forwards back to back and needs nothing for them; the sleep
    # after 0F1 is in the gap before 0F2, the gap before 0F1 has none
    late = rank0.xs("0F2", level="before")
    plain = rank0.xs("0F1", level="before")
    assert (late["schedule_ms"] == 0).all() and (late["peer_ms"] == 0).all()
    assert (late["host_ms"] >= SEND_DELAY_MS).all()
    # by how much each step's sleep ran (a busy box oversleeps), the gap grew, as host time
    slept_ms = sleeps(session_of(runs, "late-sends"), rank=0)[SKIP:]
    extra = (late["host_ms"] - plain["host_ms"]).to_numpy()
    assert len(slept_ms) == len(extra) and (slept_ms >= SEND_DELAY_MS).all()
    assert float(np.median(extra - slept_ms)) == pytest.approx(0.0, abs=TOL_MS)


def test_a_late_send_is_peer_wait_on_the_receiver_and_not_schedule_idle(
    runs: dict[str, Session],
) -> None:
    session = runs["late-sends"]
    parts = kept(session.attribution)
    waited = parts[(parts["rank"] == 1) & (parts["before"] == "1F1")]
    assert len(waited) == STEPS - SKIP
    # the schedule has rank 1 run 1F1 right after 1F0 (as the median costs fall, within a
    # sliver); the late input is peer wait
    assert (waited["schedule_ms"] < TOL_MS).all()
    assert (waited["host_ms"] < TOL_MS).all()
    assert (waited["peer_ms"] >= waited["duration_ms"] - TOL_MS).all()
    got = per_step(session)
    assert got.loc[1, "peer_ms"] >= SEND_DELAY_MS - TOL_MS
    assert got.loc[1, "schedule_ms"] == pytest.approx(
        simulated_idle_ms(session)[1], abs=tolerance_ms(session, 1)
    )


def test_session_summary_shows_the_split_beside_the_theory_fraction(
    runs: dict[str, Session],
) -> None:
    summary = runs["late-sends"].summary().set_index("rank")
    split = summary[["schedule_ms_per_step", "peer_ms_per_step", "host_ms_per_step"]]
    assert (split.sum(axis=1) - summary["bubble_ms_per_step"]).abs().max() < 1e-6
    assert summary["theory_frac"].notna().all()
    mean = kept(attribution_by_step(runs["late-sends"].attribution)).groupby("rank").mean()
    assert summary["peer_ms_per_step"].to_numpy() == pytest.approx(mean["peer_ms"].to_numpy())
