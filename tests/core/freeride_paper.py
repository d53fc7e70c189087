"""FreeRide's side-task table (paper notes §9), written once for the tests that reproduce it:
the step budgets and memory requests, and placement by those requests and budgets."""

from __future__ import annotations

from typing import NamedTuple


class SideTaskRow(NamedTuple):
    """One task: median step (s), peak memory (GiB), memory request (GiB), step budget (s)."""

    name: str
    median_s: float
    peak_gib: float
    request_gib: int
    budget_s: float


SIDE_TASKS = [
    SideTaskRow("resnet18", 0.0306, 3.63, 4, 0.048),
    SideTaskRow("resnet50", 0.0889, 7.51, 8, 0.108),
    SideTaskRow("vgg19", 0.1748, 11.51, 12, 0.216),
    SideTaskRow("pagerank", 0.0035, 1.91, 2, 0.012),
    SideTaskRow("sgd", 0.145, 1.91, 2, 0.18),
    SideTaskRow("image", 0.047, 10.41, 11, 0.06),
]
