"""The survivors' minimum: how long a bubble that outlived its prediction is taken to last."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from freeride_lab.core.bubble_survival import SurvivorLengths


def test_a_bubble_past_the_short_kind_is_planned_to_the_shortest_long_one() -> None:
    """A slot whose bubbles are 5 ms when a peer is early and ~50 ms otherwise, a step needing
    more than 2: early on, the room is up to 5 (what the minimum says too); once 5 is too
    close, wait it out and plan to the shortest long one."""
    s = SurvivorLengths(k=8, min_survivors=3, max_early=0.0)
    for length in (5, 52, 5, 50, 51, 5):
        s.observe("a", length)
    assert s.room_after("a", 0, guard_ns=2) == (0, 5)
    assert s.room_after("a", 3, guard_ns=2) == (5, 50)
    assert s.room_after("a", 5, guard_ns=2) == (5, 50)  # 5 is not longer than 5: passed
    assert s.room_after("a", 47, guard_ns=2) == (47, 50)
    assert s.room_after("a", 48, guard_ns=2) is None  # 50 too close, then two left: too few


def test_no_room_for_an_unknown_slot_or_from_fewer_survivors_than_asked() -> None:
    s = SurvivorLengths(k=4, min_survivors=2, max_early=0.0)
    assert s.room_after("new", 0, guard_ns=0) is None
    s.observe("a", 10)
    assert s.room_after("a", 0, guard_ns=0) is None  # one length: one past bubble's word
    s.observe("a", 20)
    assert s.room_after("a", 0, guard_ns=0) == (0, 10)
    assert s.room_after("other", 0, guard_ns=0) is None  # slots are kept apart


def test_only_the_last_k_lengths_speak() -> None:
    s = SurvivorLengths(k=3, min_survivors=1, max_early=0.0)
    for length in (100, 100, 100, 10, 10, 10):
        s.observe(0, length)
    assert s.room_after(0, 11, guard_ns=0) is None  # the long ones are older than the last 3


def test_on_a_jittery_slot_a_share_of_early_survivors_buys_room_the_minimum_never_has() -> None:
    """Lengths 10.0 to 11.5 ms by 0.1 ms, a 0.25 ms guard, the bubble at 10.2 ms: the
    survivors' minimum, 10.3, is never a step away; letting one in five end early sets aside
    the 2 shortest of the 13 survivors and plans to 10.5."""
    lengths = [10_000 + 100 * i for i in range(16)]
    strict = SurvivorLengths(min_survivors=3, max_early=0.0)
    loose = SurvivorLengths(min_survivors=3, max_early=0.2)
    for length in lengths:
        strict.observe(0, length)
        loose.observe(0, length)
    assert strict.end_after(0, 10_200) == 10_300
    assert strict.room_after(0, 10_200, guard_ns=250) is None
    assert loose.end_after(0, 10_200) == 10_500
    assert loose.room_after(0, 10_200, guard_ns=250) == (10_200, 10_500)


def test_equal_lengths_pass_together() -> None:
    s = SurvivorLengths(k=8, min_survivors=2, max_early=0.0)
    for length in (10, 10, 10, 30, 31):
        s.observe(0, length)
    assert s.room_after(0, 9, guard_ns=5) == (10, 30)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"k": 0}, "k=0"),
        ({"min_survivors": 0}, "min_survivors=0"),
        ({"k": 2, "min_survivors": 3}, "no slot could ever answer"),
        ({"k": True}, "k=True"),
        ({"max_early": 1.0}, "max_early=1.0"),
        ({"max_early": -0.1}, "max_early=-0.1"),
    ],
)
def test_bad_settings_are_refused_saying_which(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SurvivorLengths(**kwargs)  # type: ignore[arg-type]


def test_a_negative_length_is_refused_naming_its_slot() -> None:
    with pytest.raises(ValueError, match="slot 7"):
        SurvivorLengths().observe(7, -1)


@given(
    lengths=st.lists(st.integers(0, 1000), min_size=1, max_size=40),
    elapsed=st.integers(0, 1000),
    guard=st.integers(0, 300),
    k=st.integers(1, 16),
    need=st.integers(1, 4),
    early=st.sampled_from([0.0, 0.1, 0.2, 0.5]),
)
def test_room_starts_at_the_earliest_moment_a_step_fits_before_the_planned_end(
    lengths: list[int], elapsed: int, guard: int, k: int, need: int, early: float
) -> None:
    """Against a brute-force scan of every moment from ``elapsed`` on: the room starts at the
    first moment t with at least ``need`` kept lengths > t whose ``early`` quantile (the
    shortest once that share is set aside) is more than ``guard`` away, and ends there."""
    need = min(need, k)
    s = SurvivorLengths(k=k, min_survivors=need, max_early=early)
    for length in lengths:
        s.observe(0, length)
    kept = lengths[-k:]
    expected = None
    for t in range(elapsed, max(kept) + 1):
        longer = sorted(x for x in kept if x > t)
        if len(longer) < need:
            break
        end = longer[int(early * len(longer))]
        if end - t > guard:
            expected = (t, end)
            break
    assert s.room_after(0, elapsed, guard) == expected
