"""A start gate for runs measured side by side: ``runtime=RuntimeOptions(edges_factory=GATE)``.

The rank calls ``edges_factory`` during setup, after the process group is up and before the
schedule is built. Here each rank marks itself ready in its run directory's parent and waits for
the parent's ``go`` file or its own run's (``run_go_file``), so every run of a batch starts its
steps once all of them have imported torch: one run's measured steps never share the cores with
another's start-up, and the farm may let the batch's runs train a few at a time. The rank then
trains without live bubble edges. Rank processes import this module through
``PYTHONPATH`` (the test adds this directory).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

GATE = "start_gate:wait_for_go"
WAIT_S = 600.0  # after this the rank starts anyway (the test's own timeout reports the rest)


def ready_file(batch: Path, run_name: str, rank: int) -> Path:
    return batch / f"{run_name}.rank{rank}.ready"


def go_file(batch: Path) -> Path:
    """Opens the gate for every run of the batch."""
    return batch / "go"


def run_go_file(batch: Path, run_name: str) -> Path:
    """Opens the gate for one run of the batch."""
    return batch / f"{run_name}.go"


def wait_for_go(*, run_dir: Any, rank: int) -> None:
    path = Path(run_dir.path)
    ready_file(path.parent, path.name, rank).touch()
    gates = (go_file(path.parent), run_go_file(path.parent, path.name))
    deadline = time.monotonic() + WAIT_S
    while not any(g.exists() for g in gates) and time.monotonic() < deadline:
        time.sleep(0.02)
