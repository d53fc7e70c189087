"""The stage's queue: priority order, attach order within a priority, and when to preempt."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from freeride_lab.core.sidetask_state import SideTaskState, is_terminal
from freeride_lab.core.task_queue import Move, Queued, next_move

S = SideTaskState


def test_the_first_attached_of_the_best_priority_is_activated() -> None:
    tasks = [Queued("a", 1), Queued("b", 0), Queued("c", 0)]
    assert next_move(tasks, active=None) == Move(activate="b")
    assert next_move([Queued("a", 1), Queued("d", 1)], active=None) == Move(activate="a")


def test_tasks_that_are_not_ready_or_not_waiting_are_passed_over() -> None:
    tasks = [Queued("a", 0, ready=False), Queued("b", 0, S.FAILED), Queued("c", 1, S.CREATED)]
    assert next_move(tasks, active=None) == Move(activate="c")
    assert next_move([Queued("a", 0, S.PAUSED)], active=None) == Move()


@pytest.mark.parametrize("state", [S.PAUSED, S.RUNNING])
def test_a_waiting_task_of_higher_priority_preempts_an_iterative_one_on_the_device(
    state: SideTaskState,
) -> None:
    tasks = [Queued("low", 1, state, "iterative"), Queued("high", 0)]
    assert next_move(tasks, active="low") == Move(preempt="low")


@pytest.mark.parametrize(
    ("active", "waiting"),
    [
        (Queued("a", 1, S.RUNNING, "iterative"), Queued("b", 1)),  # equal priority: keep
        (Queued("a", 0, S.RUNNING, "iterative"), Queued("b", 1)),  # lower priority waits
        (Queued("a", 1, S.RUNNING, "imperative"), Queued("b", 0)),  # cannot move off the device
        (Queued("a", 1, S.CREATED, "iterative"), Queued("b", 0)),  # still being activated
        (Queued("a", 1, S.RUNNING, "iterative"), Queued("b", 0, ready=False)),  # restarting
    ],
)
def test_the_active_task_keeps_the_bubbles_otherwise(active: Queued, waiting: Queued) -> None:
    assert next_move([active, waiting], active=active.task_id) == Move()


def test_an_ended_active_task_makes_way_and_a_preempted_one_waits_in_its_place() -> None:
    ended = Queued("a", 0, S.FINISHED, "iterative")
    preempted = Queued("b", 1, S.CREATED, "iterative")
    later = Queued("c", 1)
    assert next_move([ended, preempted, later], active="a") == Move(activate="b")


_STATES = [S.SUBMITTED, S.CREATED, S.PAUSED, S.RUNNING, S.FINISHED, S.FAILED]
_queued = st.builds(
    Queued,
    task_id=st.text(alphabet="abcdef", min_size=1, max_size=3),
    priority=st.sampled_from([0, 1]),
    state=st.sampled_from(_STATES),
    mode=st.sampled_from(["", "iterative", "imperative"]),
    ready=st.booleans(),
)


@given(tasks=st.lists(_queued, max_size=6, unique_by=lambda t: t.task_id), pick=st.integers(0, 6))
def test_a_move_only_preempts_the_active_task_or_activates_a_ready_waiting_one(
    tasks: list[Queued], pick: int
) -> None:
    active = tasks[pick].task_id if pick < len(tasks) else None
    move = next_move(tasks, active)
    assert move.activate is None or move.preempt is None
    by_id = {t.task_id: t for t in tasks}
    if move.preempt is not None:
        assert move.preempt == active and by_id[active].mode == "iterative"
        assert any(t.priority < by_id[active].priority for t in tasks if t.task_id != active)
    if move.activate is not None:
        chosen = by_id[move.activate]
        assert chosen.ready and chosen.state in (S.SUBMITTED, S.CREATED)
        assert active is None or is_terminal(by_id[active].state)
        waiting = [t for t in tasks if t.ready and t.state in (S.SUBMITTED, S.CREATED)]
        assert chosen.priority == min(t.priority for t in waiting)
