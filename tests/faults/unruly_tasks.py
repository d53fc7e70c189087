"""Side tasks that misbehave, for the hang, flood and exit tests; loaded by file path
("…/unruly_tasks.py:GilHog"). None imports torch, so their processes start fast.

Each writes ``marker_path`` (when given) right before it misbehaves, holding the time on
``time.monotonic_ns()``, so a test knows the moment without guessing.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from freeride_lab.sidetasks.api import IterativeSideTask

HERE = Path(__file__).resolve()


def ref(name: str) -> str:
    """The file-path reference of a class defined here."""
    return f"{HERE}:{name}"


def read_marker(path: Path) -> int | None:
    """The ``time.monotonic_ns()`` a task wrote to ``path``, or None before it did."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return int(text) if text.strip() else None


def _mark(path: str) -> None:
    if path:
        tmp = Path(f"{path}.tmp")
        tmp.write_text(str(time.monotonic_ns()))
        tmp.replace(path)


class GilHog(IterativeSideTask):
    """Sleeps ``step_s`` per step for ``normal_steps`` steps, then runs a step that holds the GIL
    in C code for hours (``sum`` over a huge ``range``: no bytecode runs, so no other thread of
    the process gets the GIL and no signal handler runs)."""

    unit = "iterations"

    def __init__(self, marker_path: str = "", normal_steps: int = 2, step_s: float = 0.002):
        super().__init__(marker_path=marker_path, normal_steps=normal_steps, step_s=step_s)
        self.marker_path = marker_path
        self.normal_steps = normal_steps
        self.step_s = step_s

    def step(self) -> float:
        if self.progress < self.normal_steps:
            time.sleep(self.step_s)
            return 1.0
        _mark(self.marker_path)
        return float(sum(range(10**13)) > 0)


class StuckStep(IterativeSideTask):
    """Its first step marks ``marker_path`` and then sleeps ``sleep_s`` (an hour by default)."""

    unit = "iterations"

    def __init__(self, marker_path: str = "", sleep_s: float = 3600.0) -> None:
        super().__init__(marker_path=marker_path, sleep_s=sleep_s)
        self.marker_path = marker_path
        self.sleep_s = sleep_s

    def step(self) -> float:
        _mark(self.marker_path)
        time.sleep(self.sleep_s)
        return 1.0


class Flood(IterativeSideTask):
    """Prints ``total_mib`` MiB to stdout in ``setup()``, then counts like a normal task."""

    unit = "iterations"

    def __init__(self, total_mib: int = 100, step_s: float = 0.002) -> None:
        super().__init__(total_mib=total_mib, step_s=step_s)
        self.total_mib = total_mib
        self.step_s = step_s

    def setup(self) -> None:
        line = "x" * 1023 + "\n"
        block = line * 1024  # 1 MiB
        for _ in range(self.total_mib):
            sys.stdout.write(block)
        sys.stdout.flush()

    def step(self) -> float:
        time.sleep(self.step_s)
        return 1.0


class _Recurse:
    def down(self, depth: int) -> int:
        return self.down(depth + 1) + 1


class Misbehaves(IterativeSideTask):
    """Leaves ``where`` ("setup" or "step") by ``how``: "exit" (``sys.exit(3)``), "systemexit"
    (``raise SystemExit``), "interrupt" (``raise KeyboardInterrupt``) or "recursion" (recursing
    without end)."""

    unit = "iterations"

    def __init__(self, how: str = "exit", where: str = "step") -> None:
        super().__init__(how=how, where=where)
        self.how = how
        self.where = where

    def _misbehave(self) -> None:
        if self.how == "exit":
            sys.exit(3)
        if self.how == "systemexit":
            raise SystemExit("leaving")
        if self.how == "interrupt":
            raise KeyboardInterrupt
        if self.how == "recursion":
            _Recurse().down(0)
        raise ValueError(f"how={self.how!r}: use exit, systemexit, interrupt or recursion")

    def setup(self) -> None:
        if self.where == "setup":
            self._misbehave()

    def step(self) -> float:
        if self.where == "step":
            self._misbehave()
        return 1.0
