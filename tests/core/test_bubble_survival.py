"""The survivors' minimum: how long a bubble that outlived its prediction is taken to last."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from freeride_lab.core.bubble_survival import SurvivorLengths


def test_a_bubble_past_the_short_kind_is_taken_to_last_as_long_as_the_shortest_long_one() -> None:
    """A slot whose bubbles are 5 ms when a peer is early and ~50 ms otherwise: before 5 ms the
    answer is 5 ms (what the minimum says too); past it, the shortest of the long ones."""
    s = SurvivorLengths(k=8, min_survivors=3)
    for length in (5, 52, 5, 50, 51, 5):
        s.observe("a", length)
    assert s.length_after("a", 0) == 5
    assert s.length_after("a", 5) == 50  # 5 is not longer than 5: that kind has passed
    assert s.length_after("a", 49) == 50
    assert s.length_after("a", 50) is None  # two left: too few to say


def test_no_answer_for_an_unknown_slot_or_from_fewer_survivors_than_asked() -> None:
    s = SurvivorLengths(k=4, min_survivors=2)
    assert s.length_after("new", 0) is None
    s.observe("a", 10)
    assert s.length_after("a", 0) is None  # one length: one past bubble's word
    s.observe("a", 20)
    assert s.length_after("a", 0) == 10
    assert s.length_after("other", 0) is None  # slots are kept apart


def test_only_the_last_k_lengths_speak() -> None:
    s = SurvivorLengths(k=3, min_survivors=1)
    for length in (100, 100, 100, 10, 10, 10):
        s.observe(0, length)
    assert s.length_after(0, 11) is None  # the long ones are older than the last three


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"k": 0}, "k=0"),
        ({"min_survivors": 0}, "min_survivors=0"),
        ({"k": 2, "min_survivors": 3}, "no slot could ever answer"),
        ({"k": True}, "k=True"),
    ],
)
def test_bad_settings_are_refused_saying_which(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SurvivorLengths(**kwargs)  # type: ignore[arg-type]


def test_a_negative_length_is_refused_naming_its_slot() -> None:
    with pytest.raises(ValueError, match="slot 7"):
        SurvivorLengths().observe(7, -1)


@given(
    lengths=st.lists(st.integers(0, 10**9), min_size=1, max_size=40),
    elapsed=st.integers(0, 10**9),
    k=st.integers(1, 16),
    need=st.integers(1, 4),
)
def test_the_answer_is_a_kept_length_longer_than_the_elapsed_time_with_enough_beside_it(
    lengths: list[int], elapsed: int, k: int, need: int
) -> None:
    """Whatever the history: an answer is one of the last k lengths, longer than the elapsed
    time and no longer than any other such length, given by at least ``need`` of them."""
    need = min(need, k)
    s = SurvivorLengths(k=k, min_survivors=need)
    for length in lengths:
        s.observe(0, length)
    kept = lengths[-k:]
    longer = sorted(x for x in kept if x > elapsed)
    answer = s.length_after(0, elapsed)
    if len(longer) >= need:
        assert answer == longer[0]
    else:
        assert answer is None
