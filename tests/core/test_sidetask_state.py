"""The side-task state machine: every (state, event) pair against an explicit table."""

from __future__ import annotations

import itertools

import pytest

from freeride_lab.core.sidetask_state import (
    TRANSITIONS,
    Rejected,
    SideTaskEvent,
    SideTaskMachine,
    SideTaskState,
    Transition,
    accepted_events,
    is_terminal,
    transition,
)

S = SideTaskState
E = SideTaskEvent

# The whole table, written out independently of the module: a change to TRANSITIONS must
# change this too. Pairs not listed must be rejected.
EXPECTED: dict[tuple[SideTaskState, SideTaskEvent], tuple[SideTaskState, tuple[str, ...]]] = {
    (S.SUBMITTED, E.CREATE): (S.CREATED, ("setup",)),
    (S.SUBMITTED, E.STOP): (S.STOPPED, ()),
    (S.SUBMITTED, E.FAIL): (S.FAILED, ()),
    (S.CREATED, E.INIT): (S.PAUSED, ("to_device",)),
    (S.CREATED, E.STOP): (S.STOPPED, ("teardown",)),
    (S.CREATED, E.FAIL): (S.FAILED, ("teardown",)),
    (S.PAUSED, E.START): (S.RUNNING, ("on_start",)),
    (S.PAUSED, E.PREEMPT): (S.CREATED, ("to_host",)),
    (S.PAUSED, E.STOP): (S.STOPPED, ("teardown",)),
    (S.PAUSED, E.FAIL): (S.FAILED, ("teardown",)),
    (S.RUNNING, E.PAUSE): (S.PAUSED, ("on_pause",)),
    (S.RUNNING, E.PREEMPT): (S.CREATED, ("on_pause", "to_host")),
    (S.RUNNING, E.FINISH): (S.FINISHED, ("teardown",)),
    (S.RUNNING, E.STOP): (S.STOPPED, ("on_pause", "teardown")),
    (S.RUNNING, E.FAIL): (S.FAILED, ("teardown",)),
}

ALL_PAIRS = list(itertools.product(SideTaskState, SideTaskEvent))


@pytest.mark.parametrize(("state", "event"), ALL_PAIRS, ids=lambda v: str(v))
def test_every_state_event_pair_matches_the_expected_table(
    state: SideTaskState, event: SideTaskEvent
) -> None:
    outcome = transition(state, event)
    if (state, event) in EXPECTED:
        new_state, hooks = EXPECTED[(state, event)]
        assert outcome == Transition(new_state=new_state, hooks=hooks)
    else:
        assert isinstance(outcome, Rejected)
        assert str(event) in outcome.reason and str(state) in outcome.reason


def test_module_table_has_exactly_the_expected_entries() -> None:
    assert dict(TRANSITIONS) == EXPECTED


def test_table_covers_all_56_pairs_with_15_accepted() -> None:
    accepted = [p for p in ALL_PAIRS if isinstance(transition(*p), Transition)]
    assert len(ALL_PAIRS) == 56
    assert len(accepted) == 15


@pytest.mark.parametrize("state", [S.FINISHED, S.STOPPED, S.FAILED])
def test_terminal_states_accept_no_event_not_even_stop(state: SideTaskState) -> None:
    assert is_terminal(state)
    assert accepted_events(state) == ()
    outcome = transition(state, E.STOP)
    assert isinstance(outcome, Rejected)
    assert "already terminal" in outcome.reason


@pytest.mark.parametrize("state", [S.SUBMITTED, S.CREATED, S.PAUSED, S.RUNNING])
def test_every_non_terminal_state_can_stop_and_fail(state: SideTaskState) -> None:
    assert not is_terminal(state)
    assert transition(state, E.STOP) == Transition(S.STOPPED, EXPECTED[(state, E.STOP)][1])
    assert transition(state, E.FAIL) == Transition(S.FAILED, EXPECTED[(state, E.FAIL)][1])


def test_preempt_is_supported_from_paused_and_running_and_moves_state_off_the_device() -> None:
    for state in (S.PAUSED, S.RUNNING):
        outcome = transition(state, E.PREEMPT)
        assert isinstance(outcome, Transition)
        assert outcome.new_state is S.CREATED
        assert outcome.hooks[-1] == "to_host"


def test_rejection_reason_lists_the_events_the_state_accepts() -> None:
    outcome = transition(S.PAUSED, E.PAUSE)
    assert outcome == Rejected(
        "PAUSE does not apply to PAUSED; PAUSED accepts: START, PREEMPT, STOP, FAIL"
    )


def test_transition_accepts_enum_values_as_plain_strings() -> None:
    assert transition("PAUSED", "START") == Transition(S.RUNNING, ("on_start",))  # type: ignore[arg-type]


def test_transition_raises_with_valid_names_for_an_unknown_event() -> None:
    with pytest.raises(ValueError, match=r"'RESUME'.*valid: CREATE, INIT"):
        transition(S.PAUSED, "RESUME")  # type: ignore[arg-type]


def test_every_hook_name_is_a_method_of_the_side_task_api() -> None:
    from freeride_lab.sidetasks.api import SideTaskBase

    hooks = {h for _, hs in EXPECTED.values() for h in hs}
    assert hooks == {"setup", "to_device", "on_start", "on_pause", "to_host", "teardown"}
    for hook in hooks:
        assert callable(getattr(SideTaskBase, hook)), hook


def test_machine_walks_the_full_lifecycle_and_records_history() -> None:
    m = SideTaskMachine()
    for t_ns, event in enumerate([E.CREATE, E.INIT, E.START, E.PAUSE, E.START, E.FINISH]):
        assert isinstance(m.apply(event, t_ns=t_ns), Transition)
    assert m.state is S.FINISHED and m.terminal
    assert [(h.from_state, h.to_state) for h in m.history] == [
        (S.SUBMITTED, S.CREATED),
        (S.CREATED, S.PAUSED),
        (S.PAUSED, S.RUNNING),
        (S.RUNNING, S.PAUSED),
        (S.PAUSED, S.RUNNING),
        (S.RUNNING, S.FINISHED),
    ]
    assert [h.t_ns for h in m.history] == list(range(6))


def test_machine_rejected_event_leaves_state_unchanged_and_is_recorded() -> None:
    m = SideTaskMachine(state=S.PAUSED)
    outcome = m.apply(E.PAUSE, t_ns=5)
    assert isinstance(outcome, Rejected)
    assert m.state is S.PAUSED
    (entry,) = m.history
    assert (entry.event, entry.from_state, entry.to_state, entry.accepted) == (
        E.PAUSE,
        S.PAUSED,
        S.PAUSED,
        False,
    )
    assert entry.reason == outcome.reason
    assert m.rejected == [entry]


def test_stale_pause_is_dropped_and_does_not_pause_the_next_run() -> None:
    """The reference kept an inapplicable pause pending; here it is consumed at once."""
    m = SideTaskMachine(state=S.PAUSED)
    m.apply(E.PAUSE, t_ns=1)  # arrives while already paused: rejected, dropped
    m.apply(E.START, t_ns=2)
    assert m.state is S.RUNNING  # nothing pending turns this run into a pause


def test_enum_members_print_as_their_values() -> None:
    assert str(S.PAUSED) == "PAUSED" and f"{E.PREEMPT}" == "PREEMPT"
    assert S.RUNNING == "RUNNING"


def test_a_machine_that_runs_for_days_keeps_only_its_latest_events() -> None:
    """Two events per bubble for as long as training runs: the history keeps the newest
    ``HISTORY_LIMIT``, oldest first, and the state is still the last one applied."""
    from freeride_lab.core.sidetask_state import HISTORY_LIMIT

    m = SideTaskMachine()
    m.apply(E.CREATE, t_ns=0)
    m.apply(E.INIT, t_ns=1)
    t = 2
    for _ in range(3 * HISTORY_LIMIT):
        m.apply(E.START, t_ns=t)
        m.apply(E.PAUSE, t_ns=t + 1)
        t += 2
    assert m.state is S.PAUSED
    assert len(m.history) == HISTORY_LIMIT
    assert [h.t_ns for h in m.history] == list(range(t - HISTORY_LIMIT, t))
