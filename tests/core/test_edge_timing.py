"""The next-bubble clock: compute gaps learned per slot, predictions that err early."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from freeride_lab.core.edge_timing import NextBubbleClock


def feed_step(clock: NextBubbleClock, t0: int, idle: list[int], busy: list[int]) -> int:
    """One training step of bubbles (idle ns) and compute after each (busy ns); its end."""
    t, previous = t0, (clock._ended or (-1, None))
    for slot, (i, b) in enumerate(zip(idle, busy, strict=True)):
        clock.bubble_started(start_ns=t, previous_slot=previous[0], previous_end_ns=previous[1])
        t += i
        clock.bubble_ended(slot=slot, end_ns=t)
        previous = (slot, t)
        t += b
    return t


def test_nothing_is_predicted_inside_a_bubble_or_before_a_gap_was_seen() -> None:
    clock = NextBubbleClock()
    assert clock.next_start_ns() is None
    clock.bubble_started(start_ns=0, previous_slot=-1, previous_end_ns=None)
    assert clock.next_start_ns() is None
    clock.bubble_ended(slot=0, end_ns=10)
    assert clock.next_start_ns() is None  # no compute gap after slot 0 seen yet


def test_each_slot_predicts_its_own_compute_gap() -> None:
    clock = NextBubbleClock()
    idle, busy = [100, 200, 300], [1_000, 5_000, 20_000]
    t = feed_step(clock, 0, idle, busy)
    t = feed_step(clock, t, idle, busy)
    # third step: after each bubble ends, the prediction is that slot's compute gap away
    previous = clock._ended
    for slot in range(3):
        clock.bubble_started(start_ns=t, previous_slot=previous[0], previous_end_ns=previous[1])
        t += idle[slot]
        clock.bubble_ended(slot=slot, end_ns=t)
        assert clock.next_start_ns() == t + busy[slot]
        previous = (slot, t)
        t += busy[slot]


@given(
    gaps=st.lists(st.integers(min_value=1_000, max_value=10_000_000), min_size=2, max_size=12),
)
def test_the_prediction_is_the_shortest_recent_gap_so_it_errs_early(gaps: list[int]) -> None:
    clock = NextBubbleClock(history=4)
    end = 0
    for i, gap in enumerate(gaps):
        clock.bubble_ended(slot=0, end_ns=end)
        seen = gaps[max(0, i - 4) : i]
        assert clock.next_start_ns() == (end + min(seen) if seen else None)
        start = end + gap
        clock.bubble_started(start_ns=start, previous_slot=0, previous_end_ns=end)
        end = start + 500


def test_history_must_hold_a_gap() -> None:
    with pytest.raises(ValueError, match="history=0"):
        NextBubbleClock(history=0)


def test_a_start_is_told_the_prediction_held_for_it_and_none_after_a_missed_end() -> None:
    clock = NextBubbleClock()
    clock.bubble_ended(slot=0, end_ns=0)
    assert clock.bubble_started(start_ns=1_000, previous_slot=0, previous_end_ns=0) is None
    clock.bubble_ended(slot=0, end_ns=5_000)
    assert clock.bubble_started(start_ns=6_200, previous_slot=0, previous_end_ns=5_000) == 6_000
    clock.bubble_ended(slot=0, end_ns=10_000)
    # the reader missed that end and the one after it: this start follows another bubble
    assert clock.bubble_started(start_ns=30_000, previous_slot=0, previous_end_ns=20_000) is None


@given(
    late=st.lists(st.integers(min_value=0, max_value=3_000_000), min_size=1, max_size=40),
    lead=st.integers(min_value=0, max_value=500_000),
    most=st.integers(min_value=1, max_value=10_000_000),
)
def test_the_spin_window_covers_nine_starts_in_ten_unless_capped(
    late: list[int], lead: int, most: int
) -> None:
    """Compute gaps of 1 ms plus ``late``: the window begins ``lead`` before the prediction,
    lasts at most ``most``, and, where the cap leaves it room, reaches past at least 90% of
    the recent starts (each against the prediction made for it)."""
    clock = NextBubbleClock(history=4, lateness_history=16)
    gaps = [1_000_000 + d for d in late]
    end, lateness = 0, []
    for i, gap in enumerate(gaps):
        clock.bubble_ended(slot=0, end_ns=end)
        clock.bubble_started(start_ns=end + gap, previous_slot=0, previous_end_ns=end)
        if i:
            lateness.append(gap - min(gaps[max(0, i - 4) : i]))
        end += 10 * gap
    clock.bubble_ended(slot=0, end_ns=end)
    predicted = clock.next_start_ns()
    assert predicted == end + min(gaps[-4:])
    window = clock.spin_window(lead, most)
    assert window is not None and window[0] == predicted - lead
    assert 0 <= window[1] - window[0] <= most
    recent = lateness[-16:]
    if recent and window[1] - window[0] < most:
        caught = sum(predicted + x <= window[1] for x in recent)
        assert caught >= 0.9 * len(recent)
