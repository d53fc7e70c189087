"""How much later each action of a step could have ended before the step ended later: its float.

A side task's step that runs past its bubble's end delays the action after the bubble by the
overrun. Whether training pays for that depends on the action: if everything that waits for it
(the next action on its rank, the neighbour's action that needs its output) and everything that
waits for those has room before the step's end, the delay is absorbed; if the action is on the
step's critical path, the step ends that much later. The *float* of an action is the room: how
much later it could have ended, everything after it moved as its dependencies allow, before
some rank's last action would end past its deadline (the latest it may end without the next
step starting later).

``action_floats`` computes it for one step of a measured (or simulated) actions table with the
critical-path method's backward pass: each action's latest end is the earliest latest start of
what waits for it, less the lag between them, and no later than its rank's deadline where it is
the rank's last action. The dependencies are the planner's ([Note: planner semantics] in
``core.plan.simulate``): a rank runs its actions in order, ``dispatch_ns`` apart at the least;
F(s, j) waits for F(s-1, j); B or I of (s, j) for F(s, j) and for the B or I of (s+1, j); W(s, j)
for I(s, j); a dependency produced on another rank arrives ``comm_ns`` after it ends. With
``send_wait`` (``PlanArrays.send_wait``'s codes by action) a send also ties its rank to the
receiver's, as gloo's rendezvous does ([Note: rendezvous] in ``core.plan.simulate``): the send
completes ``comm_ns`` after the receiver is free for the action that needs it (its previous
action ended), and the sender waits for that before its next action (``SEND_WITH_NEXT``) or
the one after (``SEND_AFTER_NEXT``). Durations are the measured ones. Left out: held sends
([Note: held sends] in ``core.schedule``, DualPipeV's overlapped actions), which tie actions
closer than these edges do, so a float there is an upper bound.

[Note: as run]
A measured table says when each action started, not why. Where an action starts later than
every dependency's end plus its lag allows (a message that took longer than the least trip,
host work no record times), the floats above count that wait as room: a chain of actions
each 2 ms late reads as tens of milliseconds of float that are not there. ``as_run`` reads the
wait as the latest dependency's doing: that edge's lag becomes the measured gap, so along the
chains the schedule actually ran on no unexplained wait is left to count. It errs towards too
little room (the true cause may have been elsewhere); the floats it gives are a lower bound of
the model's, and on a table without unexplained waits (a simulated one) they are the same.

    >>> import pandas as pd
    >>> rows = [  # rank, stage, action, microbatch, start_ns, end_ns: rank 1 twice as fast
    ...     (0, 0, "F", 0, 0, 10), (0, 0, "F", 1, 10, 20), (0, 0, "B", 0, 30, 40),
    ...     (0, 0, "B", 1, 40, 50), (1, 1, "F", 0, 10, 15), (1, 1, "F", 1, 20, 25),
    ...     (1, 1, "B", 0, 25, 30), (1, 1, "B", 1, 30, 35)]
    >>> actions = pd.DataFrame(rows, columns=["rank", "stage", "action", "microbatch",
    ...                                       "start_ns", "end_ns"])
    >>> action_floats(actions, deadlines_ns={0: 50, 1: 50}).tolist()
    [0.0, 0.0, 0.0, 0.0, 5.0, 0.0, 0.0, 5.0]
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from freeride_lab.core.plan.arrays import SEND_AFTER_NEXT, SEND_WITH_NEXT, PlanArrays
from freeride_lab.core.plan.costs import _LETTERS

__all__ = ["action_floats", "send_waits_of"]

_BACKWARD = ("B", "I")


def action_floats(
    actions: pd.DataFrame,
    *,
    deadlines_ns: Mapping[int, int],
    dispatch_ns: int = 0,
    comm_ns: int = 0,
    send_wait: Mapping[tuple[int, str, int], int] | None = None,
    as_run: bool = False,
) -> np.ndarray:
    """Each action's float in ns (float64; inf where nothing after it has a deadline), in the
    order of ``actions``' rows (see the module's text).

    Args:
        actions: one step's actions of every rank: columns rank, stage, action ("F", "B",
            "I", "W"), microbatch, start_ns, end_ns.
        deadlines_ns: per rank, the latest its last action of the step may end (the moment the
            next step starts, less the rank's own work after its last action). A rank without
            one constrains nothing.
        dispatch_ns: the least time between two actions on one rank.
        comm_ns: the time a result takes to reach another rank.
        send_wait: per action (stage, kind, micro-batch), when its rank waits for its send
            (``core.plan.arrays``' ``SEND_WITH_NEXT``, ``SEND_AFTER_NEXT``; other codes and
            absent actions: not before the step's end).
        as_run: take the table as the schedule ran: each action's latest dependency (the one
            whose end plus lag comes last) held it until its measured start, so that edge's
            lag is the measured gap where that is longer ([Note: as run]).

    Raises:
        ValueError: an action ends before it starts, or a negative lag.
    """
    if dispatch_ns < 0 or comm_ns < 0:
        raise ValueError(f"dispatch_ns={dispatch_ns} and comm_ns={comm_ns} must be >= 0")
    n = len(actions)
    rank = actions["rank"].to_numpy(np.int64)
    stage = actions["stage"].to_numpy(np.int64)
    kind = actions["action"].astype(str).to_numpy()
    mb = actions["microbatch"].to_numpy(np.int64)
    start = actions["start_ns"].to_numpy(np.int64)
    end = actions["end_ns"].to_numpy(np.int64)
    if n and (end < start).any():
        i = int(np.flatnonzero(end < start)[0])
        raise ValueError(
            f"action {stage[i]}{kind[i]}{mb[i]} on rank {rank[i]} ends before it starts"
        )
    duration = end - start
    keys = zip(stage.tolist(), kind.tolist(), mb.tolist(), strict=True)
    where = {(int(s), str(k), int(j)): i for i, (s, k, j) in enumerate(keys)}
    successors: list[list[tuple[int, int]]] = [[] for _ in range(n)]  # (action, lag)

    def depends(after: int, before_key: tuple[int, str, int]) -> None:
        before = where.get(before_key)
        if before is not None:
            lag = comm_ns if rank[before] != rank[after] else 0
            successors[before].append((after, lag))

    last: dict[int, int] = {}
    previous = np.full(n, -1)  # the action before each on its rank
    following = np.full(n, -1)  # the action after each on its rank
    for i in sorted(range(n), key=lambda i: (rank[i], start[i])):
        r = int(rank[i])
        if r in last:
            successors[last[r]].append((i, dispatch_ns))
            previous[i], following[last[r]] = last[r], i
        last[r] = i
        s, k, j = int(stage[i]), str(kind[i]), int(mb[i])
        if k == "F":
            depends(i, (s - 1, "F", j))
        elif k in _BACKWARD:
            depends(i, (s, "F", j))
            depends(i, (s + 1, "B", j))
            depends(i, (s + 1, "I", j))
        elif k == "W":
            depends(i, (s, "I", j))
    for i, code in _send_waits(where, send_wait or {}):
        s, k, j = int(stage[i]), str(kind[i]), int(mb[i])
        consumer = where.get((s + 1, "F", j)) if k == "F" else None
        if k in _BACKWARD:
            consumer = where.get((s - 1, "B", j), where.get((s - 1, "I", j)))
        waiter = following[i] if code in (SEND_WITH_NEXT, SEND_AFTER_NEXT) else -1
        if code == SEND_AFTER_NEXT and waiter >= 0:
            waiter = following[waiter]
        if consumer is None or waiter < 0 or rank[consumer] == rank[i]:
            continue
        posted = previous[consumer]  # the receiver posts its receive once free for it
        if posted >= 0:
            successors[posted].append((int(waiter), comm_ns))
    if as_run:
        _hold_until_start(successors, start, end)
    latest = np.full(n, np.inf)
    for r, i in last.items():
        if r in deadlines_ns:
            latest[i] = float(deadlines_ns[r])
    # a successor starts after its predecessor ends, so by descending end (then start) each
    # action comes after everything that waits for it
    for i in sorted(range(n), key=lambda i: (-end[i], -start[i])):
        for after, lag in successors[i]:
            latest[i] = min(latest[i], latest[after] - duration[after] - lag)
    floats: np.ndarray = latest - end
    return floats


def send_waits_of(plan: PlanArrays) -> dict[tuple[int, str, int], int]:
    """``plan``'s ``send_wait`` by action (stage, kind, micro-batch), as ``action_floats``
    takes it; empty where the plan waits for every send at the step's end.

        >>> from freeride_lab.core.plan import plan_arrays
        >>> waits = send_waits_of(plan_arrays("1F1B", 2, 2))
        >>> waits[(0, "F", 0)], waits[(1, "F", 0)], waits[(1, "B", 1)]  # after next, with, at end
        (2, 1, 0)
    """
    if plan.send_wait is None:
        return {}
    return {
        (int(plan.stage[r, p]), str(_LETTERS[plan.kind[r, p]]), int(plan.microbatch[r, p])): int(
            plan.send_wait[r, p]
        )
        for r in range(plan.ranks)
        for p in range(int(plan.length[r]))
    }


def _send_waits(
    where: Mapping[tuple[int, str, int], int], send_wait: Mapping[tuple[int, str, int], int]
) -> list[tuple[int, int]]:
    """(action, code) for each action of the table that ``send_wait`` names."""
    return [(where[key], int(code)) for key, code in send_wait.items() if key in where]


def _hold_until_start(
    successors: list[list[tuple[int, int]]], start: np.ndarray, end: np.ndarray
) -> None:
    """[Note: as run] In place: each action's latest dependency's edge gets the measured gap
    to the action's start as its lag, where that is longer than the lag it has."""
    latest_in: dict[int, tuple[int, int, int]] = {}  # after -> (bound, before, slot in list)
    for before, edges in enumerate(successors):
        for slot, (after, lag) in enumerate(edges):
            bound = int(end[before]) + lag
            if after not in latest_in or bound > latest_in[after][0]:
                latest_in[after] = (bound, before, slot)
    for after, (_, before, slot) in latest_in.items():
        gap = int(start[after]) - int(end[before])
        lag = successors[before][slot][1]
        if gap > lag:
            successors[before][slot] = (after, gap)
