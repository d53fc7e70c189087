"""A rank-side fault for tests, set with
``runtime=RuntimeOptions(edges_factory="fault_injection:fail_rank_1")``.

The rank calls ``edges_factory`` during setup, after the process group is up; rank 1 raises
there, every other rank goes on without live bubble edges. Rank processes import this module
through ``PYTHONPATH`` (the test adds this directory).
"""

from __future__ import annotations

from typing import Any


def fail_rank_1(*, run_dir: Any, rank: int) -> None:
    if rank == 1:
        raise RuntimeError("injected failure on rank 1")
