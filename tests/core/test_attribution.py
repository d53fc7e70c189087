"""Claims about bubble attribution (schedule idle, peer wait, host overhead) on pure data.

Timelines come from the planner (``core.plan.simulate``), which runs a schedule exactly as
[Note: planner semantics] says, so "perfectly fed" and "a late input" are exact here.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from freeride_lab.core.attribution import (
    PART_COLUMNS,
    attribute_bubbles,
    attribution_by_rank,
    attribution_by_step,
)
from freeride_lab.core.bubbles import BUBBLE_COLUMNS, extract_bubbles
from freeride_lab.core.plan import Costs, simulate
from freeride_lab.core.theory import theory_bubble_fraction

OPTIMIZER_MS = 4.0
SHAPES = [
    ("GPipe", 3, 4, None),
    ("1F1B", 4, 6, None),
    ("Interleaved1F1B", 2, 4, 2),
    ("LoopedBFS", 2, 4, 2),
    ("ZBVZeroBubble", 2, 4, None),
    ("DualPipeV", 2, 4, None),
]


def optimizer_steps(actions: pd.DataFrame, optimizer_ms: float = OPTIMIZER_MS) -> pd.DataFrame:
    """A steps table whose optimizer starts at each rank's last action end."""
    s = actions.groupby(["step", "rank"])["end_ms"].max().rename("optimizer_start_ms")
    s = s.reset_index()
    s["optimizer_end_ms"] = s["optimizer_start_ms"] + optimizer_ms
    return s


def run_of(
    schedule: str,
    stages: int,
    microbatches: int,
    chunks: int | None,
    *,
    steps: int = 3,
    **overheads: float,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(actions, steps) of a simulated run: uneven per-stage costs, optimizer between steps."""
    n = stages * (chunks or (2 if schedule in ("ZBVZeroBubble", "DualPipeV") else 1))
    costs = Costs(
        forward_ms=tuple(1.0 + 0.5 * (s % 3) for s in range(n)),
        backward_input_ms=1.5,
        backward_weight_ms=0.75,
        optimizer_ms=OPTIMIZER_MS,
        **overheads,
    )
    acts = simulate(schedule, stages, microbatches, chunks, costs=costs, steps=steps)
    return acts, optimizer_steps(acts)


def attributed(acts: pd.DataFrame, table: pd.DataFrame | None, shape: tuple) -> pd.DataFrame:
    schedule, stages, microbatches, chunks = shape
    return attribute_bubbles(
        acts,
        steps=table,
        schedule=schedule,
        stages=stages,
        microbatches=microbatches,
        chunks=chunks,
    )


@pytest.mark.parametrize("shape", SHAPES, ids=[s[0] for s in SHAPES])
def test_a_perfectly_fed_run_is_all_schedule_idle(shape: tuple) -> None:
    acts, table = run_of(*shape)
    parts = attributed(acts, table, shape)
    assert len(parts) > 0
    assert parts["peer_ms"].abs().max() < 1e-9
    assert parts["host_ms"].abs().max() < 1e-9
    np.testing.assert_allclose(parts["schedule_ms"], parts["duration_ms"], atol=1e-9)


@pytest.mark.parametrize("shape", SHAPES[:3], ids=[s[0] for s in SHAPES[:3]])
def test_a_perfectly_fed_run_without_a_steps_table_is_all_schedule_idle(shape: tuple) -> None:
    acts, _ = run_of(*shape)
    parts = attributed(acts, None, shape)
    assert parts["peer_ms"].abs().max() < 1e-9
    assert parts["host_ms"].abs().max() < 1e-9


def test_the_rows_and_columns_are_the_bubbles_table_plus_three_parts() -> None:
    shape = ("1F1B", 3, 4, None)
    acts, table = run_of(*shape, dispatch_ms=0.2)
    bubbles = extract_bubbles(acts, steps=table, schedule="1F1B", min_ms=0.1)
    parts = attribute_bubbles(acts, bubbles, steps=table, schedule="1F1B", stages=3, microbatches=4)
    assert list(parts.columns) == [*BUBBLE_COLUMNS, *PART_COLUMNS]
    pd.testing.assert_frame_equal(parts[list(BUBBLE_COLUMNS)], bubbles)


def test_dispatch_between_fed_actions_is_host_overhead() -> None:
    # 1F1B's last stage runs F then B of its own micro-batch: nothing from a peer is missing
    shape = ("1F1B", 2, 4, None)
    acts, table = run_of(*shape, dispatch_ms=0.25)
    parts = attributed(acts, table, shape)
    fed = parts[(parts["rank"] == 1) & parts["before"].str.match(r"^1B\d$")]
    assert len(fed) == 3 * 4
    np.testing.assert_allclose(fed["host_ms"], 0.25, atol=1e-9)
    assert fed["schedule_ms"].abs().max() < 1e-9
    assert fed["peer_ms"].abs().max() < 1e-9


def test_a_late_input_is_peer_wait_and_the_senders_sleep_is_its_host_overhead() -> None:
    # GPipe, 2 stages: rank 0 sleeps 5 ms after 0F0 before it sends (0F1 starts late too)
    rows = [
        (0, "F", 0, 0.0, 1.0),
        (0, "F", 1, 6.0, 7.0),
        (1, "F", 0, 6.0, 7.0),  # input produced at 1.0, sent at 6.0
        (1, "F", 1, 7.0, 8.0),  # input produced at 7.0: fed
        (1, "B", 0, 8.0, 10.0),
        (1, "B", 1, 10.0, 12.0),
        (0, "B", 0, 10.0, 12.0),
        (0, "B", 1, 12.0, 14.0),
    ]
    acts = pd.DataFrame(rows, columns=["rank", "action", "microbatch", "start_ms", "end_ms"])
    acts = acts.assign(step=0, stage=acts["rank"])
    parts = attribute_bubbles(acts, schedule="GPipe", stages=2, microbatches=2)
    by = parts.set_index(["rank", "before"])
    # rank 0's sleep: nothing was missing, so host overhead
    assert by.loc[(0, "0F1"), ["schedule_ms", "peer_ms", "host_ms"]].tolist() == [0.0, 0.0, 5.0]
    # rank 1 waits 1 ms for 0F0 as the schedule says, then 5 ms for the late send
    assert by.loc[(1, "1F0"), ["schedule_ms", "peer_ms", "host_ms"]].tolist() == [1.0, 5.0, 0.0]
    # rank 0 waits for 1B0: the schedule says 3 ms (1F1, 1B0 after 0F1), it waited 3
    assert by.loc[(0, "0B0"), ["schedule_ms", "peer_ms", "host_ms"]].tolist() == [3.0, 0.0, 0.0]


def test_a_rank_still_finishing_its_step_makes_the_others_wait_at_the_boundary() -> None:
    shape = ("1F1B", 2, 2, None)
    acts, table = run_of(*shape, steps=3)
    slow = table.copy()  # rank 0's optimizer of step 1 runs 3 ms longer than its median
    slow.loc[(slow["step"] == 1) & (slow["rank"] == 0), "optimizer_end_ms"] += 3.0
    later = acts["step"] == 2  # so step 2 starts 3 ms later
    acts = acts.assign(start_ms=acts["start_ms"] + 3.0 * later, end_ms=acts["end_ms"] + 3.0 * later)
    slow.loc[slow["step"] == 2, ["optimizer_start_ms", "optimizer_end_ms"]] += 3.0
    by_rank = attribution_by_step(attributed(acts, slow, shape)).groupby("rank").sum()
    # rank 1 waited 3 ms on rank 0 beyond the schedule; rank 0 itself lost nothing
    assert by_rank.loc[1, "peer_ms"] == pytest.approx(3.0)
    assert by_rank.loc[1, "host_ms"] == pytest.approx(0.0)
    assert by_rank.loc[0, "peer_ms"] == pytest.approx(0.0)
    assert by_rank.loc[0, "host_ms"] == pytest.approx(0.0)


def test_a_late_peer_at_the_boundary_leaves_each_steps_schedule_idle_where_it_was() -> None:
    shape = ("1F1B", 2, 2, None)
    acts, table = run_of(*shape, steps=4)
    fed = attribution_by_step(attributed(acts, table, shape)).set_index(["step", "rank"])
    # rank 0 spends 2 ms more between steps 1 and 2 (its own host work): step 2 starts late
    later = acts["step"] >= 2
    acts = acts.assign(start_ms=acts["start_ms"] + 2.0 * later, end_ms=acts["end_ms"] + 2.0 * later)
    table = optimizer_steps(acts)
    got = attribution_by_step(attributed(acts, table, shape)).set_index(["step", "rank"])
    np.testing.assert_allclose(got["schedule_ms"], fed["schedule_ms"], atol=1e-9)
    # the 2 ms lie between step 1's window end and step 2's start: step 1's boundary bubbles
    assert got["peer_ms"].drop((1, 1)).abs().max() < 1e-9
    assert got.loc[(1, 1), "peer_ms"] == pytest.approx(2.0)  # rank 1 waited on rank 0
    assert got["host_ms"].drop((1, 0)).abs().max() < 1e-9
    assert got.loc[(1, 0), "host_ms"] == pytest.approx(2.0)  # rank 0's own time


def test_the_schedule_part_of_a_slow_stage_follows_the_simulation() -> None:
    # stage 1's forward costs 3x: rank 0 idles waiting for it, and that is the schedule's doing
    costs = Costs(forward_ms=(1.0, 3.0), backward_ms=2.0, optimizer_ms=OPTIMIZER_MS)
    acts = simulate("1F1B", 2, 4, costs=costs, steps=2)
    parts = attributed(acts, optimizer_steps(acts), ("1F1B", 2, 4, None))
    s = attribution_by_step(parts)
    assert s["peer_ms"].abs().max() < 1e-9 and s["host_ms"].abs().max() < 1e-9
    assert s[(s["step"] == 0) & (s["rank"] == 0)]["schedule_ms"].item() > 4 * 2.0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shape=st.sampled_from(SHAPES),
    delays=st.lists(st.floats(0.0, 3.0), min_size=64, max_size=64),
    dispatch=st.floats(0.0, 0.5),
    comm=st.floats(0.0, 0.5),
    with_steps=st.booleans(),
)
def test_parts_are_non_negative_and_sum_to_every_bubble(
    shape: tuple, delays: list[float], dispatch: float, comm: float, with_steps: bool
) -> None:
    acts, table = run_of(*shape, dispatch_ms=dispatch, comm_ms=comm)
    # jitter: push each rank's actions later by a growing random amount (order kept, no
    # overlap); the steps stay apart since the optimizer gap is wider than any jitter here
    acts = acts.sort_values(["rank", "start_ms"]).reset_index(drop=True)
    pos = acts.groupby("rank").cumcount().to_numpy()
    extra = np.array(delays)[pos % 64] * (pos % 3 == 0)
    shift = pd.Series(extra).groupby(acts["rank"]).cumsum().to_numpy() * 0.05
    acts["start_ms"] += shift
    acts["end_ms"] += shift
    table = optimizer_steps(acts) if with_steps else None
    parts = attributed(acts, table, shape)
    values = parts[list(PART_COLUMNS)].to_numpy()
    assert not np.isnan(values).any()
    assert (values >= -1e-9).all()
    np.testing.assert_allclose(values.sum(axis=1), parts["duration_ms"], atol=1e-9)


def test_per_rank_sums_carry_the_measured_and_theory_fractions() -> None:
    shape = ("1F1B", 2, 4, None)
    acts, table = run_of(*shape, steps=4, dispatch_ms=0.1)
    per_rank = attribution_by_rank(
        acts, steps=table, schedule="1F1B", stages=2, microbatches=4, skip_steps=1
    )
    by_step = attribution_by_step(attributed(acts, table, shape))
    kept = by_step[by_step["step"] >= 1].groupby("rank")[["bubble_ms", *PART_COLUMNS]].sum()
    assert per_rank["steps"].tolist() == [3, 3]
    np.testing.assert_allclose(per_rank[["bubble_ms", *PART_COLUMNS]], kept.to_numpy())
    parts = per_rank["schedule_ms"] + per_rank["peer_ms"] + per_rank["host_ms"]
    np.testing.assert_allclose(parts, per_rank["bubble_ms"])
    assert per_rank["theory_frac"].tolist() == [theory_bubble_fraction("1F1B", 2, 4)] * 2
    assert (per_rank["measured_frac"] >= per_rank["schedule_frac"]).all()


def test_a_stage_that_has_not_run_yet_leaves_the_parts_unknown() -> None:
    acts, _ = run_of("1F1B", 2, 4, None, steps=1)
    partial = acts[~((acts["rank"] == 0) & (acts["action"] == "B"))]
    parts = attribute_bubbles(partial, schedule="1F1B", stages=2, microbatches=4)
    assert len(parts) > 0 and parts["schedule_ms"].isna().all()


def test_empty_actions_give_the_empty_tables() -> None:
    empty = simulate("1F1B", 2, 2).iloc[:0]
    parts = attribute_bubbles(empty, schedule="1F1B", stages=2, microbatches=2)
    assert parts.empty and list(parts.columns)[-3:] == list(PART_COLUMNS)
    assert attribution_by_step(parts).empty
    assert attribution_by_rank(empty, schedule="1F1B", stages=2, microbatches=2).empty


def test_a_negative_skip_steps_is_refused_with_the_fix() -> None:
    acts, _ = run_of("1F1B", 2, 2, None)
    with pytest.raises(ValueError, match="skip_steps=-1 must be >= 0"):
        attribution_by_rank(acts, schedule="1F1B", stages=2, microbatches=2, skip_steps=-1)


def test_an_actions_table_without_times_is_refused_naming_the_columns() -> None:
    acts, _ = run_of("1F1B", 2, 2, None)
    with pytest.raises(ValueError, match=r"actions lacks column\(s\) \['end_ms'\]"):
        attribute_bubbles(acts.drop(columns="end_ms"), schedule="1F1B", stages=2, microbatches=2)


def test_the_theory_fraction_stands_beside_the_split_for_dualpipev_too() -> None:
    acts, table = run_of("DualPipeV", 2, 4, None)
    per_rank = attribution_by_rank(
        acts, steps=table, schedule="DualPipeV", stages=2, microbatches=4
    )
    want = theory_bubble_fraction("DualPipeV", 2, 4)
    assert per_rank["theory_frac"].tolist() == pytest.approx([want, want])
