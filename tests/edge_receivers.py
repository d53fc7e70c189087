"""Bubble-edge receivers for tests: one that accepts everything, one that records every call.

``QUIET_EDGES`` names a rank's ``edges_factory`` (``RunConfig.runtime``) for runs whose tests
read only the edges the rank itself records in its events. Rank processes import this module as
``tests.edge_receivers`` (the repository is on their ``PYTHONPATH``), test modules as
``edge_receivers`` (``tests/`` is on ``sys.path`` through its ``conftest.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from freeride_lab.io.rundir import RunDir

#: The ``edges_factory`` of a rank whose live edges nobody reads.
QUIET_EDGES = "tests.edge_receivers:quiet_edges"


class QuietEdges:
    """A bubble-edge receiver that accepts everything."""

    def bubble_start(self, step: int, slot: int, t_ns: int, predicted_end_ns: int | None) -> None:
        pass

    def bubble_end(self, step: int, slot: int, t_ns: int) -> None:
        pass


def quiet_edges(*, run_dir: RunDir, rank: int) -> QuietEdges:
    """An ``edges_factory``: the rank's edges go nowhere."""
    return QuietEdges()


class RecordingEdges:
    """Records each call it receives in ``calls``, in order, as a tuple led by its name."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def bubble_start(self, step: int, slot: int, t_ns: int, predicted_end_ns: int | None) -> None:
        self.calls.append(("start", step, slot, t_ns, predicted_end_ns))

    def bubble_end(self, step: int, slot: int, t_ns: int) -> None:
        self.calls.append(("end", step, slot, t_ns))

    def close(self) -> None:
        self.calls.append(("close",))
