"""Claims about the complete bubble table, on real short runs of every schedule.

One module fixture starts one sleep-timed synthetic torchrun job per schedule class the
installed torch has (gloo ranks on this machine, all at once: their torch imports overlap), with
live bubble edges on. Each test reads a finished run back through ``Session.open``, as a user
would, and checks the table against ``tests/bubble_table.py``'s invariants.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from bubble_table import assert_complete_and_exact, busy_intervals, merged_ms, step_spans
from edge_receivers import QUIET_EDGES
from runs import finish_torchrun, start_torchrun, synthetic_config
from torch.distributed.pipelining import schedules as torch_schedules

from freeride_lab.core.config import RuntimeOptions
from freeride_lab.core.schedule import SCHEDULES
from freeride_lab.lab.session import Session
from freeride_lab.lab.tables import run_start_ns

pytestmark = pytest.mark.slow  # a whole run per schedule

REPO = Path(__file__).resolve().parents[2]
TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
JOB_TIMEOUT_S = 240
STEPS = 3
T_MS = 5.0  # synthetic F, I and W cost per micro-batch per rank
STAGES = {"1F1B": 3}  # the others run on 2 ranks


def available(name: str) -> bool:
    spec = SCHEDULES[name]
    # torch < 2.13 on gloo cannot run adjacent stages of one rank (rank.py [Note: adjacent
    # stages on one rank]); V schedules always have such a rank
    return hasattr(torch_schedules, spec.torch_class) and (spec.style != "v" or TORCH >= (2, 13))


NAMES = [n for n in SCHEDULES if available(n)]


@dataclass
class Run:
    session: Session
    events: list[dict[str, Any]]


def launch(path: Path, name: str) -> subprocess.Popen[bytes]:
    stages = STAGES.get(name, 2)
    cfg = synthetic_config(
        steps=STEPS,
        stages=stages,
        phase_ms=T_MS,
        schedule=name,
        # every gap announced, so that each carried slot 0 is seen live
        runtime=RuntimeOptions(edges_factory=QUIET_EDGES, announce_min_ms=0),
    )
    return start_torchrun(path, cfg)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    root = tmp_path_factory.mktemp("bubble-table")
    started = {name: launch(root / name, name) for name in NAMES}
    for name, proc in started.items():
        finish_torchrun(proc, root / name, JOB_TIMEOUT_S)
    out = {}
    for name in NAMES:
        lines = []
        for path in sorted((root / name / "events").glob("rank-*.jsonl")):
            lines += [json.loads(x) for x in path.read_text().splitlines() if x]
        out[name] = Run(Session.open(root / name), lines)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_actions_optimizer_and_bubbles_fill_every_step_of_every_rank(
    runs: dict[str, Run], name: str
) -> None:
    s = runs[name].session
    actions, steps, bubbles = s.actions, s.steps, s.bubbles
    assert sorted(actions["step"].unique()) == list(range(STEPS))
    # wall time to 0.1 ms is the requirement; the accounting is exact, so 1 µs is asked
    assert_complete_and_exact(actions, steps, bubbles, tol_ms=1e-3)


@pytest.mark.parametrize("name", NAMES)
def test_every_rank_has_boundary_bubbles_between_steps(runs: dict[str, Run], name: str) -> None:
    """A rank has a boundary bubble where it idles after its step's window: between steps,
    or before an optimizer that starts after the window. A rank still busy when the next step
    begins may have none: steps may overlap across ranks in zero-bubble and V schedules
    (core.bubble_spans [Note: overlapping steps])."""
    s = runs[name].session
    b, actions, steps = s.bubbles, s.actions, s.steps
    boundary = b[(b["kind"] == "boundary") & (b["step"] < STEPS - 1)]
    have = set(zip(boundary["step"], boundary["rank"], strict=True))
    window_end = actions.groupby("step")["end_ms"].max()
    busy = busy_intervals(actions, steps)
    want = set()
    for (step, rank), (_, end) in step_spans(actions, steps).items():
        if step >= STEPS - 1 or end <= window_end[step]:
            continue
        after = [(max(a, window_end[step]), min(z, end)) for a, z in busy[(step, rank)]]
        idle = end - window_end[step] - merged_ms([(a, z) for a, z in after if z > a])
        if idle > 1e-9:
            want.add((step, rank))
    assert want, "no rank idled between steps"
    assert have == want


def covered_ms(lo: float, hi: float, gaps: pd.DataFrame) -> float:
    """How much of [lo, hi] the (non-overlapping) ``gaps`` cover."""
    starts, ends = gaps["start_ms"].clip(lower=lo), gaps["end_ms"].clip(upper=hi)
    return float((ends - starts).clip(lower=0.0).sum())


@pytest.mark.parametrize("name", ["1F1B", "ZBVZeroBubble"])
def test_a_live_carried_slot_is_covered_once_by_the_boundary_and_leading_bubbles(
    runs: dict[str, Run], name: str
) -> None:
    if name not in NAMES:
        pytest.skip(f"torch {torch.__version__} cannot run {name} on gloo")
    run = runs[name]
    t0 = run_start_ns(run.events)  # the tables' ms are from here
    assert t0 is not None
    bubbles = run.session.bubbles
    edges = [e for e in run.events if e["kind"] == "bubble_edge" and e["slot"] == 0]
    carried = 0
    for e in (e for e in edges if e["step"] >= 1 and e["edge"] == "start"):
        end = next(x for x in edges if x["edge"] == "end" and x["rank"] == e["rank"]
                   and x["step"] == e["step"])  # fmt: skip
        lo, hi = (e["t_ns"] - t0) / 1e6, (end["t_ns"] - t0) / 1e6
        mine = bubbles[
            (bubbles["rank"] == e["rank"]) & bubbles["step"].isin([e["step"] - 1, e["step"]])
        ]
        # the table's rows do not overlap (checked above), so full coverage = counted once
        assert covered_ms(lo, hi, mine) == pytest.approx(hi - lo, abs=1e-3), (e, hi - lo)
        carried += 1
    assert carried == (STEPS - 1) * STAGES.get(name, 2)


def test_rank_started_reports_the_clock_offset_and_its_uncertainty(runs: dict[str, Run]) -> None:
    started = [e for e in runs[NAMES[0]].events if e["kind"] == "rank_started"]
    assert len(started) >= 2
    for e in started:  # one host: one clock, offset 0 exactly
        assert e["clock_offset_ns"] == 0 and e["clock_uncertainty_ns"] == 0
    assert all(e["clock_rtt_ns"] > 0 for e in started if e["rank"] > 0)
