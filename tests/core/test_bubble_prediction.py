"""Bubble-length prediction with miss-rate feedback, scored by replaying traces as a rank would."""

from __future__ import annotations

import random

import pytest

from freeride_lab.core.bubble_prediction import FeedbackSlotPredictor, replay
from freeride_lab.core.bubbles import SlotPredictor
from freeride_lab.core.peer_prediction import AwaitedPeerPredictor
from freeride_lab.pipeline.stage_build import make_predictor

MS = 1_000_000


def _steady(n: int, *, seed: int, sd_ns: float = 30_000) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    return [("s", round(4 * MS + rng.gauss(0, sd_ns))) for _ in range(n)]


def test_a_miss_lowers_the_slots_percentile_and_a_hit_raises_it() -> None:
    p = FeedbackSlotPredictor(k=4, q0=10.0, target_miss=0.1, gain=10.0)
    p.observe("a", 5 * MS)
    assert p.predict("a") == 5 * MS
    p.observe("a", 4 * MS)  # shorter than predicted: a miss, q - 10 x 0.9
    assert p.percentile("a") == pytest.approx(1.0)
    p.predict("a")
    p.observe("a", 6 * MS)  # a hit, q + 10 x 0.1
    assert p.percentile("a") == pytest.approx(2.0)
    p.observe("a", 1 * MS)  # no prediction was made for this one: nothing to learn
    assert p.percentile("a") == pytest.approx(2.0)


@pytest.mark.parametrize("target", [0.1, 0.2])
def test_misses_settle_at_the_target_rate_on_a_steady_slot(target: float) -> None:
    score = replay(FeedbackSlotPredictor(target_miss=target), _steady(4000, seed=7))
    assert score.miss_frac == pytest.approx(target, abs=0.02)


def test_a_large_gain_overshoots_the_target_where_the_percentile_hits_its_floor() -> None:
    steady = _steady(4000, seed=7)
    small, large = (replay(FeedbackSlotPredictor(gain=g), steady) for g in (2.0, 20.0))
    assert small.miss_frac < 0.11 < 0.13 < large.miss_frac


def test_minimum_of_five_misses_a_sixth_of_a_steady_slots_bubbles_and_never_learns() -> None:
    """The reason for the feedback: iid lengths fall below the last five one time in six."""
    score = replay(SlotPredictor(k=5), _steady(4000, seed=7))
    assert score.miss_frac == pytest.approx(1 / 6, abs=0.03)


def test_a_rare_short_bubble_costs_feedback_less_than_the_minimum_of_five() -> None:
    """One bubble in twenty is a quarter as long: min-of-5 then predicts it for the next five,
    the feedback predictor's percentile stays above it."""
    rng = random.Random(3)
    trace = [("s", MS if rng.random() < 0.05 else 4 * MS) for _ in range(4000)]
    fb, m5 = replay(FeedbackSlotPredictor(), trace), replay(SlotPredictor(), trace)
    assert fb.planned_frac > m5.planned_frac + 0.05
    assert fb.miss_frac < 0.1


def test_a_slot_whose_bubbles_shorten_is_followed_down() -> None:
    trace = [("s", 4 * MS)] * 200 + [("s", 3 * MS)] * 200
    p = FeedbackSlotPredictor()
    replay(p, trace)
    assert p.predict("s") == 3 * MS


def test_slots_learn_apart() -> None:
    p = FeedbackSlotPredictor()
    replay(p, [("a", 2 * MS), ("b", 7 * MS)] * 20)
    assert (p.predict("a"), p.predict("b")) == (2 * MS, 7 * MS)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"k": 0}, "k=0"), ({"target_miss": 0.0}, "target_miss"), ({"gain": -1.0}, "gain"),
     ({"q0": 60.0}, "q0=60.0"), ({"q_max": 101.0}, "q_max")],
)  # fmt: skip
def test_bad_settings_are_refused_naming_the_rule(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FeedbackSlotPredictor(**kwargs)  # type: ignore[arg-type]


def test_a_negative_length_is_refused() -> None:
    with pytest.raises(ValueError, match="duration_ns=-1"):
        FeedbackSlotPredictor().observe("a", -1)


def test_the_runtime_option_picks_the_ranks_predictor() -> None:
    assert isinstance(make_predictor("feedback"), FeedbackSlotPredictor)
    m = make_predictor("min")
    assert isinstance(m, SlotPredictor) and (m.k, m.method) == (5, "min")
    peers = make_predictor("peers")
    assert isinstance(peers, AwaitedPeerPredictor)
    assert isinstance(peers.fallback, SlotPredictor) and peers.fallback.k == 5
    with pytest.raises(ValueError, match="valid: min, feedback, peers"):
        make_predictor("oracle")
