"""Claims about predicting a bubble from the end its awaited peer published."""

from __future__ import annotations

import pytest

from freeride_lab.core.bubbles import SlotPredictor
from freeride_lab.core.peer_prediction import AwaitedPeerPredictor

MS = 1_000_000


def taught(residuals: list[int], lengths: list[int], **kwargs: int) -> AwaitedPeerPredictor:
    """A predictor whose slot 0 has seen ``lengths`` and, for them, ``residuals``."""
    p = AwaitedPeerPredictor(**kwargs)
    for length, residual in zip(lengths, residuals, strict=True):
        p.observe(0, length)
        p.observe_peer(0, 100 * MS + residual, 100 * MS)
    return p


def test_a_bubble_ends_at_its_peers_published_end_plus_the_slots_low_hand_over() -> None:
    p = taught([3 * MS // 10] * 3 + [MS], [4 * MS] * 3 + [6 * MS], q=0)
    # the bubble began at 10 ms; its peer ends at 13 ms; hand-overs took 0.3 ms or more
    assert p.predict_from_peer(0, 10 * MS, 13 * MS) == 3 * MS + 3 * MS // 10


def test_it_follows_the_peer_where_the_slots_past_would_predict_its_shortest() -> None:
    lengths = [2 * MS, 5 * MS, 5 * MS, 5 * MS, 5 * MS]
    p = taught([0] * 5, lengths)
    assert p.predict(0) == 2 * MS  # the minimum of five, FreeRide's
    assert p.predict_from_peer(0, 0, 5 * MS) == 5 * MS


def test_without_a_published_end_or_enough_residuals_the_fallback_answers() -> None:
    p = taught([0, 0], [3 * MS, 4 * MS], min_residuals=3)
    assert p.predict_from_peer(0, 0, 4 * MS) == 3 * MS  # two residuals: too few
    p.observe(0, 4 * MS)
    p.observe_peer(0, 4 * MS, 4 * MS)
    assert p.predict_from_peer(0, 0, None) == 3 * MS
    assert p.predict_from_peer(0, 0, 4 * MS) == 4 * MS
    assert p.predict_from_peer(1, 0, 4 * MS) is None  # a slot never seen


@pytest.mark.parametrize("peer_end", [-(10**18), 10**18])
def test_a_neighbours_wild_claim_is_held_inside_the_slots_recent_lengths(peer_end: int) -> None:
    p = taught([0] * 3, [3 * MS, 4 * MS, 5 * MS])
    assert 0 <= p.predict_from_peer(0, 0, peer_end) <= 5 * MS  # type: ignore[operator]


def test_the_fallback_sees_every_length() -> None:
    fallback = SlotPredictor(k=2, method="min")
    p = AwaitedPeerPredictor(fallback)
    for length in (1, 7, 9):
        p.observe(0, length)
    assert fallback.predict(0) == 7


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"k": 0}, "k=0"),
        ({"min_residuals": 0}, "min_residuals=0"),
        ({"k": 2, "min_residuals": 3}, "no slot could ever"),
        ({"q": 101.0}, "percentile"),
    ],
)
def test_bad_settings_are_refused_with_the_rule(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        AwaitedPeerPredictor(**kwargs)  # type: ignore[arg-type]


def test_a_negative_length_is_refused() -> None:
    with pytest.raises(ValueError, match="end_ns - start_ns"):
        AwaitedPeerPredictor().observe(0, -1)


def test_the_hand_over_is_the_slots_low_residual_once_there_are_enough() -> None:
    p = taught([5, 3, 9], [4 * MS] * 3, min_residuals=3)
    assert p.hand_over(0) == 3
    assert AwaitedPeerPredictor().hand_over(0) is None
    assert taught([5, 3], [MS] * 2, min_residuals=3).hand_over(0) is None
