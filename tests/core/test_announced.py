"""``announced_spans``: a rank's live bubble edges paired into spans, as every bench reading
of them (block rows, the predictor replays, the bubble ledger) takes them."""

from __future__ import annotations

from typing import Any

from freeride_lab.core.announced import AnnouncedSpan, announced_spans


def _edge(step: int, slot: int, edge: str, t_ns: int, rank: int = 2, **kw: Any) -> dict[str, Any]:
    return {"kind": "bubble_edge", "rank": rank, "step": step, "slot": slot, "edge": edge,
            "t_ns": t_ns, **kw}  # fmt: skip


EVENTS = [
    {"kind": "step", "rank": 2, "step": 1, "start_ns": 0},
    _edge(1, 1, "end", 40),  # its start came before the events begin: dropped
    _edge(1, 2, "start", 100, predicted_end_ns=150),
    _edge(1, 2, "start", 100, rank=3, predicted_end_ns=190),  # another rank's
    _edge(1, 3, "end", 300),
    _edge(1, 3, "start", 250),  # written after its end, earlier on the clock
    _edge(1, 2, "end", 160),
    _edge(2, 0, "start", 400, predicted_end_ns=480),
    _edge(2, 0, "end", 500),
    _edge(2, 1, "start", 600, predicted_end_ns=650),
]


def test_a_ranks_edges_pair_in_time_order_and_the_last_start_stays_open() -> None:
    spans, open_starts = announced_spans(EVENTS, rank=2)
    assert spans == [
        AnnouncedSpan(1, 2, 100, 160, 150),
        AnnouncedSpan(1, 3, 250, 300, None),
        AnnouncedSpan(2, 0, 400, 500, 480),
    ]
    assert open_starts == [600]


def test_a_window_keeps_its_edges_only_and_a_bubble_ending_past_it_is_open() -> None:
    spans, open_starts = announced_spans(EVENTS, rank=2, lo_ns=200, hi_ns=450)
    assert spans == [AnnouncedSpan(1, 3, 250, 300, None)]
    assert open_starts == [400]


def test_a_start_repeated_before_its_end_is_the_one_that_counts() -> None:
    events = [_edge(5, 0, "start", 10, predicted_end_ns=30), _edge(5, 0, "start", 12),
              _edge(5, 0, "end", 40)]  # fmt: skip
    assert announced_spans(events, rank=2).spans == [AnnouncedSpan(5, 0, 12, 40, None)]
    assert announced_spans(events, rank=0) == ([], [])
