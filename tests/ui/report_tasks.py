"""Custom side tasks for report tests, loaded by file path in a real run's task processes."""

from __future__ import annotations

import time

from freeride_lab.sidetasks.api import IterativeSideTask


class DeclaredCounting(IterativeSideTask):
    """Sleeps 2 ms per step and declares its speed on the reference GPU."""

    unit = "iterations"
    reference_throughput = 500.0

    def step(self) -> float:
        time.sleep(0.002)
        return 1.0


class FailingStep(IterativeSideTask):
    """Raises in its first step, with markup in the message (the report shows it as text)."""

    def step(self) -> float:
        raise RuntimeError("lost the <b>dataset</b> handle")
