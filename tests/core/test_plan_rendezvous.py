"""The planner's rendezvous model: gloo passes a message only once both sides have posted it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from freeride_lab.core.plan import Costs, compare_with_run, plan_arrays, simulate, simulate_summary


def _start(actions: pd.DataFrame, stage: int, kind: str, mb: int) -> float:
    row = actions[
        (actions["stage"] == stage) & (actions["action"] == kind) & (actions["microbatch"] == mb)
    ]
    return float(row["start_ms"].iloc[0])


SLOW_SECOND = Costs(forward_ms=(1.0, 10.0, 1.0, 1.0), backward_ms=1.0)


def test_a_warm_up_sender_blocks_until_its_slower_receiver_posts_the_receive() -> None:
    """torch's 1F1B waits for a warm-up forward's send after the next forward: rank 0 cannot
    start 0F3 before rank 1 has finished 1F0 and posted its receive for 1F1 (at 11 ms)."""
    free = simulate("1F1B", 4, 4, costs=SLOW_SECOND)
    met = simulate("1F1B", 4, 4, costs=dataclasses.replace(SLOW_SECOND, rendezvous=True))
    assert _start(free, 0, "F", 3) == pytest.approx(3.0)
    assert _start(met, 0, "F", 3) == pytest.approx(11.0)
    assert [_start(met, 0, "F", j) for j in range(3)] == pytest.approx([0.0, 1.0, 2.0])


def test_a_remote_input_arrives_comm_after_the_later_of_send_and_receive() -> None:
    costs = Costs(forward_ms=1.0, backward_ms=2.0, comm_ms=0.5, dispatch_ms=0.25)
    free = simulate("GPipe", 2, 2, costs=costs)
    met = simulate("GPipe", 2, 2, costs=dataclasses.replace(costs, rendezvous=True))
    # 0F1 ends at 2.5; rank 1 is free at 2.75 (1F0 ran 1.75..2.75), so the receive is posted
    # after the send: 3.0 = max(free + dispatch, send + comm), 3.25 = receive posted + comm
    assert _start(free, 1, "F", 1) == pytest.approx(3.0)
    assert _start(met, 1, "F", 1) == pytest.approx(3.25)


def test_rendezvous_summaries_match_the_simulated_table() -> None:
    costs = Costs(forward_ms=(1.0, 3.0, 1.5), backward_ms=2.0, comm_ms=0.3, rendezvous=True)
    actions = simulate("1F1B", 3, 6, costs=costs)
    summary = simulate_summary("1F1B", 3, 6, costs=costs)
    window = actions["end_ms"].max() - actions["start_ms"].min()
    np.testing.assert_allclose(summary["window_ms"], window)


def test_without_send_waits_the_rendezvous_plan_runs_every_schedule() -> None:
    for name, v in (("GPipe", 1), ("Interleaved1F1B", 2), ("ZBVZeroBubble", 2)):
        costs = Costs(comm_ms=0.2, dispatch_ms=0.1, rendezvous=True)
        got = simulate(name, 2, 4, v, costs=costs)
        assert len(got) > 0 and (got["start_ms"] >= 0).all()


def test_compare_with_run_agrees_with_a_rendezvous_run_of_its_own_costs() -> None:
    costs = Costs(forward_ms=(1.0, 2.0, 1.0), backward_ms=(2.0, 4.0, 2.0), comm_ms=0.3,
                  dispatch_ms=0.1, rendezvous=True)  # fmt: skip
    table = compare_with_run(simulate("1F1B", 3, 6, costs=costs, steps=3), "1F1B", 3, 6)
    np.testing.assert_allclose(table["rel_diff"], 0.0, atol=1e-6)


def test_one_f_one_b_plans_say_when_each_send_is_waited() -> None:
    wait = plan_arrays("1F1B", 4, 6).send_wait
    assert wait is not None
    # rank 0: F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5
    assert wait[0].tolist() == [2, 2, 2, 1, 1, 1, 1, 1, 2, 2, 2, 0]


def test_rendezvous_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="rendezvous=1"):
        Costs(rendezvous=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="statistic='max'"):
        Costs.from_actions(simulate("GPipe", 2, 2), statistic="max")  # type: ignore[arg-type]
