"""An action's float: how much later it could end before some rank's last action ends late."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from freeride_lab.core.plan import Costs, simulate
from freeride_lab.core.plan.critical import action_floats, send_waits_of

DISPATCH_NS, COMM_NS = 50_000, 200_000


def _pushed_ends(actions: pd.DataFrame, pushed: int, delay_ns: int) -> np.ndarray:
    """Every action's end once action ``pushed`` ends ``delay_ns`` later and each action after
    it starts no earlier than it did nor before what it waits for allows (re-timed forwards)."""
    a = actions.reset_index(drop=True)
    end = a["end_ns"].to_numpy(np.int64).copy()
    start = a["start_ns"].to_numpy(np.int64)
    keys = zip(a["stage"], a["action"], a["microbatch"], strict=True)
    key = {(s, k, j): i for i, (s, k, j) in enumerate(keys)}
    previous: dict[int, int] = {}
    for i in np.argsort(start, kind="stable"):
        r, s, k, j = (
            int(a.at[i, "rank"]),
            int(a.at[i, "stage"]),
            a.at[i, "action"],
            int(a.at[i, "microbatch"]),
        )
        ready = int(start[i])
        if r in previous:
            ready = max(ready, int(end[previous[r]]) + DISPATCH_NS)
        deps = {"F": [(s - 1, "F", j)], "W": [(s, "I", j)]}.get(
            k, [(s, "F", j), (s + 1, "B", j), (s + 1, "I", j)]
        )
        for d in deps:
            if d in key:
                p = key[d]
                lag = COMM_NS if int(a.at[p, "rank"]) != r else 0
                ready = max(ready, int(end[p]) + lag)
        end[i] = (
            ready + int(a.at[i, "end_ns"] - a.at[i, "start_ns"]) + (delay_ns if i == pushed else 0)
        )
        previous[r] = i
    return end


def _last_of_rank(actions: pd.DataFrame) -> dict[int, int]:
    a = actions.reset_index(drop=True)
    return {int(r): int(g["end_ns"].idxmax()) for r, g in a.groupby("rank")}


@pytest.mark.parametrize(
    ("schedule", "microbatches", "chunks"),
    [("1F1B", 8, None), ("GPipe", 4, None), ("Interleaved1F1B", 8, 2)],
)
def test_an_action_pushed_by_its_float_ends_no_step_late_and_pushed_further_it_does(
    schedule: str, microbatches: int, chunks: int | None
) -> None:
    stages = 4 * (chunks or 1)
    costs = Costs(
        forward_ms=tuple(1.0 + 0.5 * (s % 3) for s in range(stages)),
        backward_ms=tuple(2.0 + 0.7 * (s % 2) for s in range(stages)),
        dispatch_ms=DISPATCH_NS / 1e6,
        comm_ms=COMM_NS / 1e6,
    )
    actions = simulate(schedule, 4, microbatches, chunks, costs=costs).reset_index(drop=True)
    barrier = int(actions["end_ns"].max())
    floats = action_floats(
        actions,
        deadlines_ns=dict.fromkeys(range(4), barrier),
        dispatch_ns=DISPATCH_NS,
        comm_ns=COMM_NS,
    )
    assert (floats >= -1).all()  # the simulated schedule itself meets every deadline
    assert (floats <= 1).any()  # and something is on the critical path
    last = _last_of_rank(actions)
    for i in range(0, len(actions), 3):
        room = int(floats[i])
        within = _pushed_ends(actions, i, room)
        assert max(within[j] for j in last.values()) <= barrier + 1
        beyond = _pushed_ends(actions, i, room + 1_000_000)
        assert max(beyond[j] for j in last.values()) > barrier  # 1 ms more is paid


def test_a_faster_rank_has_room_that_the_slower_one_does_not() -> None:
    costs = Costs(forward_ms=(2.0, 1.0, 2.0, 2.0), backward_ms=(4.0, 2.0, 4.0, 4.0))
    actions = simulate("1F1B", 4, 8, costs=costs).reset_index(drop=True)
    barrier = int(actions["end_ns"].max())
    floats = action_floats(actions, deadlines_ns=dict.fromkeys(range(4), barrier))
    by_rank = pd.Series(floats).groupby(actions["rank"]).median()
    assert by_rank[1] > 0.5e6  # the fast stage waits on its neighbours: room to spare
    assert by_rank[2] == pytest.approx(0.0, abs=1.0)


def test_a_rank_without_a_deadline_constrains_nothing() -> None:
    rows = [(0, 0, "F", 0, 0, 10), (1, 1, "F", 0, 12, 20), (1, 1, "B", 0, 20, 30),
            (0, 0, "B", 0, 31, 40)]  # fmt: skip
    actions = pd.DataFrame(
        rows, columns=["rank", "stage", "action", "microbatch", "start_ns", "end_ns"]
    )
    floats = action_floats(actions, deadlines_ns={0: 45})
    assert floats.tolist() == [8.0, 6.0, 6.0, 5.0]  # every path ends at rank 0's last action
    assert np.isinf(action_floats(actions, deadlines_ns={})).all()


def test_bad_input_is_refused_with_a_reason() -> None:
    actions = pd.DataFrame(
        [(0, 0, "F", 0, 10, 5)],
        columns=["rank", "stage", "action", "microbatch", "start_ns", "end_ns"],
    )
    with pytest.raises(ValueError, match="ends before it starts"):
        action_floats(actions, deadlines_ns={0: 20})
    with pytest.raises(ValueError, match="must be >= 0"):
        action_floats(actions.assign(end_ns=20), deadlines_ns={0: 20}, comm_ns=-1)


def _frame(rows: list[tuple[int, int, str, int, int, int]]) -> pd.DataFrame:
    return pd.DataFrame(
        rows, columns=["rank", "stage", "action", "microbatch", "start_ns", "end_ns"]
    )


def test_a_send_that_waits_for_its_receiver_ties_the_receiver_to_the_senders_next_action() -> None:
    """Rank 0's F0 is sent with its next action's receive (1F1B's steady state), and gloo
    completes the send only once rank 1 has posted its receive, when its F5 ends: F5 delayed
    delays rank 0's F1, which has no room."""
    from freeride_lab.core.plan.arrays import SEND_AFTER_NEXT, SEND_WITH_NEXT

    actions = _frame([(0, 0, "F", 0, 0, 10), (0, 0, "F", 1, 20, 25), (1, 1, "F", 5, 0, 19),
                      (1, 1, "F", 0, 20, 30)])  # fmt: skip
    deadlines = {0: 25, 1: 60}
    free = action_floats(actions, deadlines_ns=deadlines)
    tied = action_floats(actions, deadlines_ns=deadlines, send_wait={(0, "F", 0): SEND_WITH_NEXT})
    assert (free[2], tied[2]) == (31.0, 1.0)
    later = action_floats(actions, deadlines_ns=deadlines, send_wait={(0, "F", 0): SEND_AFTER_NEXT})
    assert later[2] == 31.0  # waited after F1: no action of rank 0 comes after it to hold


def test_the_planners_rendezvous_schedule_meets_every_tie_the_floats_add() -> None:
    """Under the planner's rendezvous model (sends completed by the receiver's post) the
    schedule it simulates satisfies every edge the floats add for 1F1B's send waits: no
    action is late against them, and the waits leave less room than the data alone."""
    from freeride_lab.core.plan import plan_arrays

    costs = Costs(forward_ms=(1.0, 3.0, 1.0, 1.0), backward_ms=(2.0, 6.0, 2.0, 2.0),
                  comm_ms=COMM_NS / 1e6, rendezvous=True)  # fmt: skip
    actions = simulate("1F1B", 4, 8, costs=costs).reset_index(drop=True)
    waits = send_waits_of(plan_arrays("1F1B", 4, 8))
    assert waits
    barrier = int(actions["end_ns"].max())
    deadlines = dict.fromkeys(range(4), barrier)
    tied = action_floats(actions, deadlines_ns=deadlines, comm_ns=COMM_NS, send_wait=waits)
    free = action_floats(actions, deadlines_ns=deadlines, comm_ns=COMM_NS)
    assert (tied >= -1).all()
    assert (tied <= free + 1).all() and (tied < free - 1e5).any()


def test_as_run_counts_an_unexplained_wait_against_the_latest_dependency_not_as_room() -> None:
    """Rank 1's F0 started 6 ns after rank 0's F0 ended, with no lag to explain it: read as
    room, rank 0's F0 may end 6 ns later for free; read as run, that wait was the message's."""
    actions = _frame([(0, 0, "F", 0, 0, 10), (1, 1, "F", 0, 16, 26)])
    deadlines = {0: 40, 1: 26}
    assert action_floats(actions, deadlines_ns=deadlines).tolist() == [6.0, 0.0]
    assert action_floats(actions, deadlines_ns=deadlines, as_run=True).tolist() == [0.0, 0.0]


def test_as_run_changes_nothing_where_the_schedule_has_no_unexplained_wait() -> None:
    costs = Costs(forward_ms=(1.0, 2.0, 1.0, 1.5), backward_ms=(2.0, 3.0, 2.0, 2.5),
                  dispatch_ms=DISPATCH_NS / 1e6, comm_ms=COMM_NS / 1e6)  # fmt: skip
    actions = simulate("1F1B", 4, 8, costs=costs).reset_index(drop=True)
    deadlines = dict.fromkeys(range(4), int(actions["end_ns"].max()))
    kwargs = {"deadlines_ns": deadlines, "dispatch_ns": DISPATCH_NS, "comm_ns": COMM_NS}
    np.testing.assert_allclose(
        action_floats(actions, as_run=True, **kwargs), action_floats(actions, **kwargs), atol=2
    )
