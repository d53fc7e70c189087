"""Toy side tasks for the runtime tests, loaded by file path ("…/tasks_for_tests.py:Counting").

None of them imports torch, so their task processes start fast and checkpoint as JSON.
"""

from __future__ import annotations

import mmap
import os
import time
from pathlib import Path

from freeride_lab.sidetasks.api import ImperativeSideTask, IterativeSideTask

HERE = Path(__file__).resolve()


def ref(name: str) -> str:
    """The file-path reference of a class defined here."""
    return f"{HERE}:{name}"


class Counting(IterativeSideTask):
    """Sleeps ``step_s`` per step; finishes after ``limit`` steps (None: never)."""

    unit = "iterations"

    def __init__(self, step_s: float = 0.002, limit: int | None = None) -> None:
        super().__init__(step_s=step_s, limit=limit)
        self.step_s = step_s
        self.limit = limit

    def step(self) -> float:
        time.sleep(self.step_s)
        return 1.0

    def is_finished(self) -> bool:
        return self.limit is not None and self.progress >= self.limit


class WarmingUp(Counting):
    """Counting whose first ``warmup`` steps sleep ``warm_s`` (a capture, a compilation)."""

    def __init__(self, step_s: float = 0.002, warmup: int = 3, warm_s: float = 0.03) -> None:
        super().__init__(step_s=step_s)
        self.warmup, self.warm_s, self.calls = warmup, warm_s, 0

    @property
    def warmup_steps(self) -> int:
        return self.warmup

    def step(self) -> float:
        self.calls += 1
        time.sleep(self.warm_s if self.calls <= self.warmup else self.step_s)
        return 1.0


class ColdStart(Counting):
    """Counting whose first step sleeps ``cold_s`` (a process's one-time costs: the device's
    libraries, a kernel's first launch) and declares no warm-up."""

    def __init__(self, step_s: float = 0.002, cold_s: float = 0.03) -> None:
        super().__init__(step_s=step_s)
        self.cold_s, self.calls = cold_s, 0

    def step(self) -> float:
        self.calls += 1
        time.sleep(self.cold_s if self.calls == 1 else self.step_s)
        return 1.0


class Sized(Counting):
    """Steps of ``sizes`` units; n units take ``unit_s`` x (1 + n) / 2 (a larger step is faster
    per unit, as a larger slice of a batch is) and make n units of progress."""

    def __init__(self, unit_s: float = 0.004, sizes: list[int] | None = None) -> None:
        super().__init__(step_s=unit_s)
        self.unit_s = unit_s
        self.sizes = tuple(sizes) if sizes is not None else (1, 2, 4)

    @property
    def step_sizes(self) -> tuple[int, ...]:
        return self.sizes

    def step(self, size: int = 1) -> float:
        time.sleep(self.unit_s * (1 + size) / 2)
        return float(size)


class Batched(Sized):
    """``Sized`` over batches of 4 units that a step may not cross (as a vision task's slices):
    it offers 1, 2 or 4 units, as many as the batch has left; ``start`` units of the first batch
    are done already."""

    def __init__(self, unit_s: float = 0.004, start: int = 0) -> None:
        super().__init__(unit_s=unit_s)
        self.done = start

    @property
    def step_sizes(self) -> tuple[int, ...]:
        left = 4 - self.done
        return tuple(2**j for j in range(left.bit_length()))

    def step(self, size: int = 1) -> float:
        assert size in self.step_sizes, (size, self.step_sizes)
        self.done = (self.done + size) % 4
        return super().step(size)


class RaisingInSetup(IterativeSideTask):
    def setup(self) -> None:
        raise ValueError("boom in setup")

    def step(self) -> float:
        return 1.0


class RaisingInStep(IterativeSideTask):
    """Raises in its third step."""

    def step(self) -> float:
        if self.progress >= 2:
            raise RuntimeError("boom in step")
        return 1.0


class HangingStep(IterativeSideTask):
    """Its first step never ends (a stuck kernel, say)."""

    def step(self) -> float:
        time.sleep(3600)
        return 1.0


class MemoryHog(IterativeSideTask):
    """Keeps ``chunk_bytes`` more memory per step."""

    def __init__(self, chunk_bytes: int = 64 << 20) -> None:
        super().__init__(chunk_bytes=chunk_bytes)
        self.chunk_bytes = chunk_bytes
        self.kept: list[bytearray] = []

    def step(self) -> float:
        self.kept.append(bytearray(self.chunk_bytes))
        return 1.0


class RaisingInTeardown(Counting):
    """Counts ``limit`` steps (default 3), then raises while it is torn down."""

    def __init__(self, step_s: float = 0.002, limit: int | None = 3) -> None:
        super().__init__(step_s=step_s, limit=limit)

    def teardown(self) -> None:
        raise RuntimeError("boom in teardown")


HTML = "<img src=x onerror=alert(1)>"


class HtmlUnit(Counting):
    """A user string with HTML in it (its unit) that reaches the tables and the report."""

    unit = HTML


class FreeCounter(ImperativeSideTask):
    """Counts in a loop, publishing the count in ``counter_path`` (8 bytes, for the test to read).

    With ``cooperative=False`` it never calls ``pause_point()``: only SIGSTOP can pause it.
    """

    unit = "iterations"

    def __init__(self, counter_path: str, cooperative: bool = False) -> None:
        super().__init__(counter_path=counter_path, cooperative=cooperative)
        self.counter_path = counter_path
        self.cooperative = cooperative

    def run(self) -> None:
        fd = os.open(self.counter_path, os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(fd, 8)
        counter = mmap.mmap(fd, 8)
        os.close(fd)
        count = 0
        while True:
            if self.cooperative:
                self.pause_point()
            time.sleep(0.001)
            count += 1
            counter[:8] = count.to_bytes(8, "little")
            if count % 10 == 0:
                self.report(10)


def read_counter(path: Path) -> int:
    """The count a ``FreeCounter`` published (0 before it started)."""
    try:
        return int.from_bytes(path.read_bytes()[:8].ljust(8, b"\0"), "little")
    except FileNotFoundError:
        return 0
