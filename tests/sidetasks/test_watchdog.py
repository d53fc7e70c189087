"""The worker's judgement of one beacon reading (no processes): steps, waits, the first step."""

from __future__ import annotations

from freeride_lab.sidetasks.heartbeat import BeaconPhase, BeaconReading
from freeride_lab.sidetasks.watchdog import task_hang_reason

MS = 1_000_000
S = 1_000_000_000


def step(ran_s: float, *, first: bool = False) -> str | None:
    reading = BeaconReading(BeaconPhase.STEP, mark_ns=0, step=4, budget_ns=10 * MS, first=first)
    return task_hang_reason(reading, now_ns=int(ran_s * S), slack_ns=S, first_step_slack_ns=10 * S)


def test_a_later_step_is_hung_past_twice_its_budget_plus_the_slack() -> None:
    assert step(1.0) is None
    assert step(1.03) == "hung: step 4 ran 1.03 s, over 2 x budget + 1 s = 1.02 s (budget 10 ms)"


def test_the_first_step_of_a_process_gets_the_first_step_slack() -> None:
    assert step(5.0, first=True) is None
    assert step(10.1, first=True) == (
        "hung: step 4 ran 10.1 s, over 2 x budget + 10 s = 10 s (budget 10 ms)"
    )


def test_a_wait_counts_from_the_last_sigcont_of_the_worker() -> None:
    reading = BeaconReading(BeaconPhase.WAITING, mark_ns=0, period_ns=500 * MS)
    assert task_hang_reason(reading, now_ns=2 * S, slack_ns=S, continued_ns=S) is None
    assert task_hang_reason(reading, now_ns=2 * S, slack_ns=S) == (
        "hung: the task process sent no heartbeat for 2 s (3 missed, one every 0.5 s)"
    )


def test_host_code_and_hooks_are_not_judged() -> None:
    reading = BeaconReading(BeaconPhase.BUSY, mark_ns=0)
    assert task_hang_reason(reading, now_ns=3600 * S, slack_ns=S) is None
