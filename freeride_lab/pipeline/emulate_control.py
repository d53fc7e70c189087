"""Emulate mode's control: the ``Control`` a benchmark writes, the ``ControlFile`` rank 0
reads before each step, and the ``EdgeGate`` that decides what a rank's side-task worker sees
of its bubbles. See ``pipeline.emulate`` [Note: emulation control]; no torch here.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from freeride_lab.io.rundir import RunDir, create_file, open_append

if TYPE_CHECKING:
    from freeride_lab.sidetasks.client import WorkerProcess

log = logging.getLogger(__name__)

__all__ = ["Control", "ControlFile", "EdgeGate", "Gate"]

_OPEN_SLOT = 1_000_000  # slot number of the gate's open-ended bubble (never a real slot)
_OPEN_FOR_NS = 3_600 * 10**9  # the open bubble's predicted length: "no end in sight"


class Gate(IntEnum):
    """What the real rank's side-task worker sees of its bubbles (see ``EdgeGate``)."""

    CLOSED = 0  # no bubble edges: side tasks stay parked (vanilla baseline)
    PASS = 1  # the real edges: FreeRide's bubble gating (managed)
    OPEN = 2  # one bubble with no end: side tasks run continuously (naive co-location)


@dataclass(frozen=True, kw_only=True)
class Control:
    """One emulation setting; ``seq`` grows with every new setting (0 = the start-up default).

    Args:
        real_rank: the rank that computes for real (the others sleep).
        gate: what the real rank's side tasks see (``Gate``); other ranks are always CLOSED.
        hold: park training before the next step until a control without ``hold`` arrives.
        timed: timed stages (ActionTimed, bubble edges) or plain ``PipelineStage`` (needs
            ``RuntimeOptions(timed="alternate")``, which builds both).
    """

    seq: int = 0
    real_rank: int = 0
    gate: Gate = Gate.CLOSED
    hold: bool = False
    timed: bool = True

    def __post_init__(self) -> None:
        if self.seq < 0 or self.real_rank < 0:
            raise ValueError(f"seq={self.seq} and real_rank={self.real_rank} must be >= 0")
        object.__setattr__(self, "gate", Gate(int(self.gate)))

    def to_values(self) -> list[int]:
        return [self.seq, self.real_rank, int(self.gate), int(self.hold), int(self.timed)]

    @classmethod
    def from_values(cls, values: Sequence[int]) -> Control:
        seq, real, gate, hold, timed = (int(v) for v in values[:5])
        return cls(seq=seq, real_rank=real, gate=Gate(gate), hold=bool(hold), timed=bool(timed))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "gate": self.gate.name}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Control:
        gate = data.get("gate", "CLOSED")
        return cls(
            seq=int(data.get("seq", 0)),
            real_rank=int(data.get("real_rank", 0)),
            gate=Gate[gate] if isinstance(gate, str) else Gate(int(gate)),
            hold=bool(data.get("hold", False)),
            timed=bool(data.get("timed", True)),
        )


class ControlFile:
    """``<run_dir>/emulate/control.json`` (the newest ``Control``) and ``applied.jsonl``.

    ``write`` replaces the file atomically (any process); ``read`` is what rank 0 calls before
    each step (one ``stat`` when nothing changed).
    """

    def __init__(self, run_dir: str | os.PathLike[str] | RunDir) -> None:
        root = run_dir.path if isinstance(run_dir, RunDir) else Path(run_dir)
        self.dir = root / "emulate"
        self.path = self.dir / "control.json"
        self.applied_path = self.dir / "applied.jsonl"
        self._stamp: tuple[int, int] | None = None
        self._cached: Control | None = None

    def write(self, control: Control) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".control.{os.getpid()}.{time.monotonic_ns()}.tmp")
        with os.fdopen(create_file(tmp), "w") as f:
            f.write(json.dumps(control.to_dict()))
        os.replace(tmp, self.path)

    def read(self) -> Control | None:
        """The newest control, or None if none was written (a torn or bad file keeps the last)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return self._cached
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            try:
                self._cached = Control.from_dict(json.loads(self.path.read_text()))
                self._stamp = stamp
            except (OSError, ValueError, KeyError):
                log.warning("emulate: unreadable control file %s; keeping the last", self.path)
        return self._cached

    def note_applied(self, seq: int, step: int, t_ns: int) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        with os.fdopen(open_append(self.applied_path), "a") as f:
            f.write(json.dumps({"seq": seq, "step": step, "t_ns": t_ns}) + "\n")

    def applied(self) -> list[dict[str, int]]:
        """Every ``{seq, step, t_ns}`` rank 0 has noted, in order."""
        try:
            lines = self.applied_path.read_text().splitlines()
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            with contextlib.suppress(ValueError):
                out.append({k: int(v) for k, v in json.loads(line).items()})
        return out


class EdgeGate:
    """The rank's ``edges``: forwards, withholds or fakes bubble edges for its side-task worker.

    Hot-path calls (``bubble_start``/``bubble_end``) only forward or drop; ``set_gate`` runs
    between steps. ``inner`` is None on ranks without a worker (then everything is dropped).
    """

    def __init__(self, inner: WorkerProcess | None) -> None:
        self.inner = inner
        self.gate = Gate.CLOSED
        self._open: tuple[int, int] | None = None  # (step, slot) of the published open bubble
        self._passed: tuple[int, int] | None = None  # a real bubble the worker saw start

    def bubble_start(self, step: int, slot: int, t_ns: int, predicted_end_ns: int | None) -> None:
        if self.gate is Gate.PASS and self.inner is not None:
            self._passed = (step, slot)
            self.inner.bubble_start(step, slot, t_ns, predicted_end_ns)

    def bubble_end(self, step: int, slot: int, t_ns: int) -> None:
        if self.gate is Gate.PASS and self.inner is not None and self._passed == (step, slot):
            self._passed = None
            self.inner.bubble_end(step, slot, t_ns)

    def set_gate(self, gate: Gate, *, step: int, t_ns: int) -> None:
        """Switch (between steps); idempotent. A real bubble the worker saw start (the one that
        spans the step boundary) is ended here, so no mode inherits the previous one's."""
        if gate is self.gate:
            return
        if self._passed is not None and self.inner is not None:
            self.inner.bubble_end(self._passed[0], self._passed[1], t_ns)
        self._passed = None
        if self._open is not None and self.inner is not None:
            self.inner.bubble_end(self._open[0], self._open[1], t_ns)
        self._open = None
        self.gate = gate
        if gate is Gate.OPEN and self.inner is not None:
            self._open = (step, _OPEN_SLOT)
            self.inner.bubble_start(step, _OPEN_SLOT, t_ns, t_ns + _OPEN_FOR_NS)

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()

    def __repr__(self) -> str:
        return f"<EdgeGate({self.gate.name}, {self.inner!r})>"
