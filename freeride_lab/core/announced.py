"""The bubbles a rank announced live: its ``bubble_edge`` events paired into spans.

A rank announces each bubble twice (``pipeline.timed_stage``): a start, with its predicted end
where it had a prediction, and an end, both keyed by (step, slot). The bench's block rows, its
predictor replays and the bubble ledger all read those spans; ``announced_spans`` pairs them
once, in time order, and says which starts were still open where the events stop (a window's
close, or the run's end).

    >>> edges = [
    ...     {"kind": "bubble_edge", "rank": 1, "step": 3, "slot": 0, "edge": "start",
    ...      "t_ns": 100, "predicted_end_ns": 180},
    ...     {"kind": "bubble_edge", "rank": 1, "step": 3, "slot": 0, "edge": "end", "t_ns": 190},
    ...     {"kind": "bubble_edge", "rank": 1, "step": 3, "slot": 1, "edge": "start", "t_ns": 250},
    ... ]
    >>> announced = announced_spans(edges, rank=1)
    >>> announced.spans
    [AnnouncedSpan(step=3, slot=0, start_ns=100, end_ns=190, predicted_end_ns=180)]
    >>> announced.open_starts_ns
    [250]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

__all__ = ["Announced", "AnnouncedSpan", "announced_spans"]


class AnnouncedSpan(NamedTuple):
    """One announced bubble: its step and slot, start and end (ns on the run's clock), and
    the end the rank predicted for it at its start (None: announced without a prediction)."""

    step: int
    slot: int
    start_ns: int
    end_ns: int
    predicted_end_ns: int | None


class Announced(NamedTuple):
    """``announced_spans``' answer: the spans in time order, and the starts left open."""

    spans: list[AnnouncedSpan]
    open_starts_ns: list[int]


def announced_spans(
    events: Iterable[Mapping[str, Any]],
    rank: int,
    lo_ns: int | None = None,
    hi_ns: int | None = None,
) -> Announced:
    """``rank``'s ``bubble_edge`` events among ``events`` (other kinds and ranks are passed
    over) paired by (step, slot) in time order; only edges in [``lo_ns``, ``hi_ns``) where
    given, so a bubble whose end falls past ``hi_ns`` is an open start. An end without its
    start is dropped; a start repeated before its end replaces the earlier one."""
    edges = sorted(
        (
            e
            for e in events
            if e.get("kind") == "bubble_edge"
            and int(e["rank"]) == rank
            and (lo_ns is None or int(e["t_ns"]) >= lo_ns)
            and (hi_ns is None or int(e["t_ns"]) < hi_ns)
        ),
        key=lambda e: int(e["t_ns"]),
    )
    open_: dict[tuple[int, int], tuple[int, int | None]] = {}  # start, predicted end
    spans = []
    for e in edges:
        key = (int(e["step"]), int(e["slot"]))
        if e["edge"] == "start":
            predicted = e.get("predicted_end_ns")
            open_[key] = (int(e["t_ns"]), None if predicted is None else int(predicted))
        elif key in open_:
            start, predicted = open_.pop(key)
            spans.append(AnnouncedSpan(*key, start, int(e["t_ns"]), predicted))
    return Announced(spans, [start for start, _ in open_.values()])
