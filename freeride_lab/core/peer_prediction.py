"""A bubble's end from the peer it waits for: the end that peer published for the action whose
output ends the bubble.

[Note: awaited peer]
A rank of a pipeline idles until a neighbour's output arrives: the stage before it for a
forward, the stage after it for a backward. A slot predictor (FreeRide's minimum of the last
five, ``core.bubbles.SlotPredictor``) knows only the slot's past, so it predicts the slot's
short end every time and a side task leaves the rest of a longer bubble empty. The neighbour,
though, knows when it began the action the rank waits for and about how long such an action
takes it: each rank publishes, as it starts an action, when it expects to end it
(``io.peer_board``), and a rank opening a bubble reads the end its awaited peer
published. Where that peer has already started the action, the bubble ends about when the peer
does, plus the hand-over (the send, the receive, the rank's own start): this predictor learns
that remainder per slot, from every bubble whose peer's end it read, as ``residual`` = the
bubble's real end - the peer's published end, and predicts

    the peer's published end + the ``q``-th percentile of the slot's last ``k`` residuals,

so the residual absorbs both the hand-over and the peer's own bias. ``q`` is 0 by default:
the slot's quickest recent hand-over, as FreeRide takes the shortest of a slot's recent
lengths. A bubble whose peer has
not started yet (it waits for its own input) has no published end: the slot's fallback
predictor answers, as it does before a slot has ``min_residuals`` residuals, and the rank names
the awaited action with the slot's ``hand_over`` for the side task, which reads the peer's end
once it comes (``sidetasks.host.iterative`` [Note: told mid-bubble]). A prediction is
never longer than the longest of the slot's last ``k`` bubbles, nor negative, whatever a
neighbour's file says.

Replayed over a CPU run of the emulated-peer bench (M = 8, every stage real in turn, the
peers sleeping their calibrated costs; ``benchmarks/bench_predictor.py``), it beat the minimum
of five on all three counts: more of the bubbles' time planned for, less promised past their
ends and fewer bubbles shorter than predicted; the 10th percentile of the hand-overs planned a
little more still but missed more bubbles than the minimum of five. BENCHMARKS.md has the
table.

    >>> p = AwaitedPeerPredictor(min_residuals=2)
    >>> for length, peer_end, end in ((4_000, 3_600, 4_000), (6_000, 5_600, 6_000)):
    ...     p.observe(1, length)
    ...     p.observe_peer(1, end, peer_end)
    >>> p.predict(1)                       # no peer's word: the minimum of five
    4000
    >>> p.predict_from_peer(1, 0, 5_000)   # the peer ends at 5 000; its hand-over took 400
    5400
    >>> p.predict_from_peer(1, 0, 9_000)   # never past the slot's longest recent bubble
    6000
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

from freeride_lab.core.bubble_prediction import (
    Predictor,
    check_counts,
    check_length,
    percentile_of_sorted,
)
from freeride_lab.core.bubbles import SlotPredictor

__all__ = ["AwaitedPeerPredictor"]


class AwaitedPeerPredictor:
    """Per slot, a bubble's end from the end its awaited peer published ([Note: awaited
    peer]); the ``fallback`` predictor where there is none.

    Args:
        fallback: predicts a slot's bubble from its past alone (default: the minimum of the
            last five, FreeRide's); it sees every length this predictor sees.
        k: residuals and lengths kept per slot.
        q: the percentile of the slot's residuals added to the peer's end (0, the default:
            the quickest; the higher, the more of a bubble planned for and the more bubbles
            shorter than predicted).
        min_residuals: residuals a slot needs before the peer's end is used.
    """

    __slots__ = ("_lengths", "_residuals", "fallback", "k", "min_residuals", "q")

    def __init__(
        self,
        fallback: Predictor | None = None,
        *,
        k: int = 16,
        q: float = 0.0,
        min_residuals: int = 3,
    ) -> None:
        check_counts(k=k, min_residuals=min_residuals)
        if min_residuals > k:
            raise ValueError(
                f"min_residuals={min_residuals} > k={k}: no slot could ever use its peer's "
                "end; keep more residuals or ask for fewer"
            )
        if not 0 <= q <= 100:
            raise ValueError(f"q={q} must be a percentile in [0, 100]")
        self.fallback: Predictor = fallback if fallback is not None else SlotPredictor(5)
        self.k = k
        self.q = float(q)
        self.min_residuals = min_residuals
        self._lengths: dict[Hashable, deque[int]] = {}
        self._residuals: dict[Hashable, deque[int]] = {}

    def observe(self, slot: Hashable, duration_ns: int) -> None:
        """Record one measured bubble of ``slot`` (ns), for the fallback too."""
        check_length(slot, duration_ns)
        self.fallback.observe(slot, duration_ns)
        lengths = self._lengths.get(slot)
        if lengths is None:
            lengths = self._lengths[slot] = deque(maxlen=self.k)
        lengths.append(int(duration_ns))

    def observe_peer(self, slot: Hashable, end_ns: int, peer_end_ns: int) -> None:
        """A bubble of ``slot`` that ended at ``end_ns`` was opened with its peer's published
        end ``peer_end_ns`` (both on the run clock): learn the remainder."""
        residuals = self._residuals.get(slot)
        if residuals is None:
            residuals = self._residuals[slot] = deque(maxlen=self.k)
        residuals.append(int(end_ns) - int(peer_end_ns))

    def predict(self, slot: Hashable) -> int | None:
        """The fallback's prediction: a bubble whose awaited peer has published no end."""
        return self.fallback.predict(slot)

    def hand_over(self, slot: Hashable) -> int | None:
        """What ``slot``'s bubbles last past their peer's end (ns): the ``q``-th percentile of
        its residuals; None with fewer than ``min_residuals``."""
        residuals = self._residuals.get(slot)
        if residuals is None or len(residuals) < self.min_residuals:
            return None
        return percentile_of_sorted(sorted(residuals), self.q)

    def predict_from_peer(
        self, slot: Hashable, start_ns: int, peer_end_ns: int | None
    ) -> int | None:
        """Predicted length (ns) of ``slot``'s bubble that began at ``start_ns``, its awaited
        peer having published ``peer_end_ns`` (None: nothing published); the fallback's while
        the slot has fewer than ``min_residuals`` residuals or no length yet."""
        lengths = self._lengths.get(slot)
        hand_over = self.hand_over(slot)
        if peer_end_ns is None or not lengths or hand_over is None:
            return self.predict(slot)
        return min(max(0, peer_end_ns + hand_over - start_ns), max(lengths))

    def __repr__(self) -> str:
        return (
            f"AwaitedPeerPredictor(fallback={self.fallback!r}, k={self.k}, q={self.q:g}, "
            f"min_residuals={self.min_residuals}, slots={len(self._lengths)})"
        )
