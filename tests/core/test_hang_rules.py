"""The hang rules as pure functions: where a step or a silence starts to count as hung."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from freeride_lab.core.hangs import (
    HEARTBEAT_MISSES,
    hung_step_reason,
    silence_reason,
    step_limit_ns,
)

MS = 1_000_000
S = 1_000_000_000


def test_a_step_may_run_twice_its_budget_plus_the_slack() -> None:
    assert step_limit_ns(budget_ns=50 * MS, slack_ns=S) == 1100 * MS


def test_a_step_at_its_limit_is_not_hung_and_one_past_it_is() -> None:
    assert hung_step_reason(3, ran_ns=1100 * MS, budget_ns=50 * MS, slack_ns=S) is None
    reason = hung_step_reason(3, ran_ns=1100 * MS + 1, budget_ns=50 * MS, slack_ns=S)
    assert reason == "hung: step 3 ran 1.1 s, over 2 x budget + 1 s = 1.1 s (budget 50 ms)"


def test_a_step_being_profiled_has_only_the_slack() -> None:
    reason = hung_step_reason(0, ran_ns=3 * S, budget_ns=0, slack_ns=S)
    assert reason == "hung: step 0 ran 3 s, over 2 x budget + 1 s = 1 s (budget 0 ms)"


@given(
    budget_ns=st.integers(0, 10 * S),
    slack_ns=st.integers(1, 10 * S),
    ran_ns=st.integers(0, 40 * S),
)
def test_a_step_is_hung_exactly_when_it_ran_past_its_limit(
    budget_ns: int, slack_ns: int, ran_ns: int
) -> None:
    hung = hung_step_reason(1, ran_ns=ran_ns, budget_ns=budget_ns, slack_ns=slack_ns)
    assert (hung is not None) == (ran_ns > 2 * budget_ns + slack_ns)


def test_silence_counts_after_three_missed_heartbeats() -> None:
    period_ns = 500 * MS
    assert HEARTBEAT_MISSES == 3
    assert silence_reason("w", silent_ns=3 * period_ns, period_ns=period_ns) is None
    reason = silence_reason("worker for rank 1", silent_ns=1700 * MS, period_ns=period_ns)
    assert (
        reason == "hung: worker for rank 1 sent no heartbeat for 1.7 s (3 missed, one every 0.5 s)"
    )


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: step_limit_ns(-1, S), "budget_ns=-1 must be >= 0"),
        (lambda: step_limit_ns(0, 0), "slack_ns=0 must be > 0"),
        (lambda: silence_reason("w", silent_ns=1, period_ns=0), "period_ns=0 must be > 0"),
    ],
)
def test_impossible_inputs_are_refused_with_the_value(
    call: Callable[[], object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        call()
