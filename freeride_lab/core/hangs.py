"""When a side task or its worker counts as hung: the rules, judged from outside the process.

A hung process cannot be trusted to report its own hang: a step that holds the GIL in C code
starves every thread of its process, and a SIGSTOPped process runs nothing at all. So the
process only leaves marks that need no help from it later (``sidetasks.heartbeat``), and another
process compares them with its own clock (``sidetasks.watchdog`` in the worker for its tasks,
``lab.manager`` in the session for the workers). These are the rules it applies:

- **a step** is hung once it has run longer than ``2 x budget + slack`` (budget = the step guard
  in force when it started, 0 while the task is still being profiled; slack = the task's
  ``hang_after_s``, 1 s by default);
- **a process that promised a heartbeat** every ``period`` is hung once it has been silent for
  ``HEARTBEAT_MISSES`` periods.

    >>> step_limit_ns(budget_ns=50_000_000, slack_ns=1_000_000_000)
    1100000000
    >>> hung_step_reason(12, ran_ns=3_400_000_000, budget_ns=50_000_000, slack_ns=10**9)
    'hung: step 12 ran 3.4 s, over 2 x budget + 1 s = 1.1 s (budget 50 ms)'
    >>> silence_reason("worker for rank 1", silent_ns=1_700_000_000, period_ns=500_000_000)
    'hung: worker for rank 1 sent no heartbeat for 1.7 s (3 missed, one every 0.5 s)'
"""

from __future__ import annotations

__all__ = [
    "HEARTBEAT_MISSES",
    "STEP_BUDGET_FACTOR",
    "hung_step_reason",
    "silence_reason",
    "step_limit_ns",
]

HEARTBEAT_MISSES = 3  # a process silent for this many heartbeat periods is hung
STEP_BUDGET_FACTOR = 2  # a step may run this many budgets (plus the slack) before it is hung


def step_limit_ns(budget_ns: int, slack_ns: int) -> int:
    """How long a step may run before it counts as hung: ``2 x budget + slack`` (ns).

    Raises:
        ValueError: a negative budget or a slack that is not positive.
    """
    if budget_ns < 0:
        raise ValueError(f"budget_ns={budget_ns} must be >= 0 (0 = no budget known yet)")
    if slack_ns <= 0:
        raise ValueError(f"slack_ns={slack_ns} must be > 0 (the task's hang_after_s)")
    return STEP_BUDGET_FACTOR * budget_ns + slack_ns


def hung_step_reason(step: int, *, ran_ns: int, budget_ns: int, slack_ns: int) -> str | None:
    """The FAILED reason for a step that has run ``ran_ns`` so far, or None if it is not hung."""
    limit_ns = step_limit_ns(budget_ns, slack_ns)
    if ran_ns <= limit_ns:
        return None
    return (
        f"hung: step {step} ran {_seconds(ran_ns)} s, over {STEP_BUDGET_FACTOR} x budget + "
        f"{_seconds(slack_ns)} s = {_seconds(limit_ns)} s (budget {budget_ns / 1e6:g} ms)"
    )


def silence_reason(who: str, *, silent_ns: int, period_ns: int) -> str | None:
    """The FAILED reason for ``who``, silent ``silent_ns`` while promising a heartbeat every
    ``period_ns``, or None if it is not hung yet.

    Raises:
        ValueError: a period that is not positive.
    """
    if period_ns <= 0:
        raise ValueError(f"period_ns={period_ns} must be > 0")
    if silent_ns <= HEARTBEAT_MISSES * period_ns:
        return None
    return (
        f"hung: {who} sent no heartbeat for {_seconds(silent_ns)} s "
        f"({HEARTBEAT_MISSES} missed, one every {_seconds(period_ns)} s)"
    )


def _seconds(ns: int) -> str:
    """``ns`` in seconds with at most three significant digits (1.1, 0.5, 12.3)."""
    return f"{ns / 1e9:.3g}"
