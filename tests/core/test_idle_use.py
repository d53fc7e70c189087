"""Where the idle time went: the five parts of every bubble sum to it, each in its place."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from freeride_lab.core.idle_use import PARTS, IdleUse, idle_use


def test_each_part_lands_where_a_reader_would_put_it() -> None:
    # bubble 0-10: wake-up 1 ms, steps 1-4 and 4.5-8, 2 ms left at the end; bubble 20-22 unused
    use = idle_use([(0.0, 10.0), (20.0, 22.0)], [(1.0, 4.0), (4.5, 8.0)])
    assert (use.lead_ms, use.covered_ms, use.between_ms, use.tail_ms, use.unused_ms) == (
        1.0, 6.5, 0.5, 2.0, 2.0,
    )  # fmt: skip
    assert (use.bubbles, use.unused_bubbles) == (2, 1)


def test_steps_outside_bubbles_and_past_their_edges_count_only_inside() -> None:
    # a step overrunning the bubble's end, one between bubbles, one starting before a bubble
    use = idle_use([(0.0, 5.0), (10.0, 15.0)], [(3.0, 7.0), (7.5, 8.0), (9.0, 11.0)])
    assert use.covered_ms == pytest.approx(2.0 + 1.0)
    assert use.tail_ms == pytest.approx(0.0 + 4.0)
    assert use.lead_ms == pytest.approx(3.0 + 0.0)
    assert use.unused_ms == 0.0


def test_overlapping_steps_of_two_tasks_are_not_counted_twice() -> None:
    use = idle_use([(0.0, 10.0)], [(0.0, 6.0), (2.0, 8.0)])
    assert use.covered_ms == 8.0 and use.tail_ms == 2.0


def test_shares_are_fractions_of_the_bubble_time_and_pooling_adds_them() -> None:
    a = idle_use([(0.0, 10.0)], [(2.0, 7.0)])
    pooled = a + idle_use([(0.0, 10.0)], [])
    assert pooled.total_ms == 20.0 and pooled.share("covered") == 0.25
    assert pooled.unused_bubbles == 1 and pooled.bubbles == 2
    assert math.isnan(IdleUse().share("tail"))
    with pytest.raises(ValueError, match="unknown part 'idle'"):
        pooled.share("idle")


def test_unused_bubbles_split_into_too_short_silent_and_left_by_the_host() -> None:
    # the task's shortest step is 3 ms; bubbles: used, 2 ms (too short), 10 ms announced
    # and left, 10 ms never announced
    gaps = [(0.0, 10.0), (20.0, 22.0), (30.0, 40.0), (50.0, 60.0)]
    use = idle_use(gaps, [(1.0, 4.0)], fit_ms=3.0, announced=[(0.0, 9.0), (29.5, 39.0)])
    assert use.unused_ms == 22.0
    assert use.unused_fit_ms == 20.0  # the 2 ms bubble is too short for any step
    assert use.unused_silent_ms == 10.0  # 50-60: no announcement overlaps it
    # an announcement that ends as the bubble starts does not count as telling of it
    late = idle_use([(50.0, 60.0)], [], fit_ms=3.0, announced=[(40.0, 50.0)])
    assert late.unused_silent_ms == 10.0
    # without the task's shortest step, no split (results recorded before it: 0)
    assert idle_use(gaps, [(1.0, 4.0)]).unused_fit_ms == 0.0
    pooled = use + use
    assert (pooled.unused_fit_ms, pooled.unused_silent_ms) == (40.0, 20.0)
    assert use.unused_short_ms == 0.0  # no announcement carried its prediction


def test_announced_unused_bubbles_split_by_whether_their_prediction_fitted_a_step() -> None:
    # shortest step 3 ms; three unused 10 ms bubbles, announced with predictions of 2 ms (too
    # short: the predictor stood in the way), 8 ms (room: left for the guard), and twice, once
    # short and once long enough (the host had room once)
    gaps = [(0.0, 10.0), (20.0, 30.0), (40.0, 50.0)]
    told = [(0.2, 9.0, 2.2), (20.2, 29.0, 28.2), (40.2, 44.0, 41.0), (44.5, 50.0, 49.0)]
    use = idle_use(gaps, [], fit_ms=3.0, announced=told)
    assert (use.unused_fit_ms, use.unused_silent_ms, use.unused_short_ms) == (30.0, 0.0, 10.0)
    # an announcement that starts before the bubble and reaches into it still tells of it
    early = idle_use([(10.0, 20.0)], [], fit_ms=3.0, announced=[(0.0, 30.0, 1.0), (5.0, 6.0, 6.0)])
    assert early.unused_short_ms == 10.0
    assert (use + use).unused_short_ms == 20.0


def test_announced_bubbles_predicted_within_their_guard_were_left_for_the_guard() -> None:
    # shortest step 3 ms; unused 10 ms bubbles announced with the guard the host held them to:
    # predicted 8 ms against a 9 ms guard (the guard stood in the way), 8 ms against 5 ms (room:
    # the host left it), and one announced without a guard (not split: results before it)
    gaps = [(0.0, 10.0), (20.0, 30.0), (40.0, 50.0)]
    told = [(0.2, 9.0, 8.2, 9.0), (20.2, 29.0, 28.2, 5.0), (40.2, 49.0, 48.2)]
    use = idle_use(gaps, [], fit_ms=3.0, announced=told)
    assert (use.unused_fit_ms, use.unused_short_ms, use.unused_guard_ms) == (30.0, 0.0, 10.0)
    # a prediction too short for the step counts as the predictor's, whatever the guard
    short = idle_use(gaps[:1], [], fit_ms=3.0, announced=[(0.2, 9.0, 2.2, 9.0)])
    assert (short.unused_short_ms, short.unused_guard_ms) == (10.0, 0.0)
    assert (use + use).unused_guard_ms == 20.0


def test_announced_bubbles_with_room_that_a_hosts_hold_overlapped_were_left_for_the_hold() -> None:
    # shortest step 3 ms; 10 ms bubbles announced with room past their 5 ms guard, unused: the
    # host checkpointed across the first and the third's start; the second it simply left.
    # A hold over a bubble the guard or the predictor already explains changes nothing.
    gaps = [(0.0, 10.0), (20.0, 30.0), (40.0, 50.0), (60.0, 70.0)]
    told = [(0.2, 9.0, 8.2, 5.0), (20.2, 29.0, 28.2, 5.0), (40.2, 49.0, 48.2, 5.0),
            (60.2, 69.0, 64.2, 5.0)]  # fmt: skip
    holds = [(-3.0, 12.0), (38.0, 40.5), (59.0, 70.0)]
    use = idle_use(gaps, [], fit_ms=3.0, announced=told, held=holds)
    assert (use.unused_guard_ms, use.unused_held_ms) == (10.0, 20.0)
    assert idle_use(gaps, [], fit_ms=3.0, announced=told).unused_held_ms == 0.0
    assert (use + use).unused_held_ms == 40.0


def test_the_tail_past_a_bubbles_predicted_end_is_the_predictors() -> None:
    """After its last step a bubble's rest splits at its prediction: a bubble that outlasted
    it leaves the part past it to the predictor; one predicted longer than it was, or ending
    before its last step, leaves none; a bubble without a predicted end adds nothing."""
    bubbles = [(0.0, 10.0), (20.0, 30.0), (40.0, 50.0), (60.0, 70.0)]
    steps = [(1.0, 6.0), (21.0, 26.0), (41.0, 49.0), (61.0, 65.0)]
    told = [(0.2, 9.8, 8.0), (20.2, 29.8, 31.0), (40.2, 49.8, 45.0), (60.2, 69.8)]
    use = idle_use(bubbles, steps, announced=told)
    assert use.tail_ms == 4.0 + 4.0 + 1.0 + 5.0
    assert use.tail_unpromised_ms == 2.0 + 0.0 + 1.0  # 8-10; none; 49-50 (past 45 and 49)
    # two announcements of one bubble: the latest predicted end is the promise
    late = idle_use(bubbles[:1], steps[:1], announced=[(0.2, 3.0, 4.0), (3.0, 9.8, 9.0)])
    assert late.tail_unpromised_ms == 1.0


_span = st.tuples(st.floats(0, 1000), st.floats(0.01, 50)).map(lambda t: (t[0], t[0] + t[1]))


@given(st.lists(_span, max_size=30), st.lists(_span, max_size=60))
def test_the_parts_sum_to_the_bubble_time_and_none_is_negative(bubbles, steps) -> None:
    told = [(s, e, s + (e - s) * (i % 3) / 2, *((e - s) / 2,) * (i % 2))
            for i, (s, e) in enumerate(steps[::2])]  # fmt: skip
    use = idle_use(bubbles, steps, fit_ms=5.0, announced=told, held=bubbles[1::3])
    assert 0.0 <= use.unused_silent_ms <= use.unused_fit_ms <= use.unused_ms + 1e-9
    assert 0.0 <= use.unused_short_ms <= use.unused_fit_ms - use.unused_silent_ms + 1e-9
    assert use.unused_guard_ms >= 0.0
    assert 0.0 <= use.tail_unpromised_ms <= use.tail_ms + 1e-9
    assert use.unused_held_ms >= 0.0
    assert use.unused_short_ms + use.unused_guard_ms + use.unused_held_ms <= (
        use.unused_fit_ms - use.unused_silent_ms + 1e-9
    )
    merged: list[tuple[float, float]] = []
    for s, e in sorted(bubbles):
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    assert use.total_ms == pytest.approx(sum(e - s for s, e in merged), abs=1e-6)
    assert all(use.ms(p) >= -1e-9 for p in PARTS)
    assert use.bubbles == len(merged)
