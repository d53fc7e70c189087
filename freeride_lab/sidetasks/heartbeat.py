"""Marks that a hung process cannot fake, for a watchdog in another process to judge.

Two kinds, both read against the reader's own ``CLOCK_MONOTONIC`` (one clock for every process
of the machine), both left by the process itself as it goes, never on request:

- ``TaskBeacon``: 64 bytes of shared memory between a worker and one task process (an anonymous
  ``memfd`` the worker creates and hands over as a file descriptor, like the control channel).
  The task host's main thread, the one that runs the steps, writes what it does: "step 12
  started at t with budget b", "waiting for an edge, back within 0.5 s", "busy" (a hook, a
  checkpoint: user code of any length). A step holding the GIL or a SIGSTOPped process leaves
  the mark as it was, and the worker sees its age grow (``sidetasks.watchdog``).
- ``WorkerHeartbeat``: the file ``<run_dir>/workers/worker-<r>.heartbeat``, rewritten in place
  by the worker's watchdog thread every ``period``; the session reads it (``read_heartbeat``)
  and finds a SIGSTOPped or starved worker by its silence (``lab.manager``).

    beacon = TaskBeacon.create()                     # worker; pass beacon.fd to the host
    beacon = TaskBeacon.attach(fd)                   # task host
    beacon.step_started(12, budget_ns=50_000_000)    # main thread, right before step()
    beacon.busy()                                    # right after it
    beacon.read()                                    # worker: BeaconReading(phase=STEP, …)

# [Note: beacon record]
Little-endian, 64 bytes: ``seq`` u64 at 0 (odd while a write is under way), then the payload
``seq`` u64, phase u32, flags u32 (bit 0: the process's first step), step i64, mark_ns i64,
budget_ns i64, period_ns i64 at 8, and a crc32 of the payload at 56. One writer (the host's
main thread). A reader keeps a copy only if ``seq`` is the same even number before and after,
the payload repeats it and the CRC matches (as in ``sidetasks.edges`` [Note: edge record and
seqlock]); otherwise it returns the last good copy, so a writer stopped in the middle of a
write is judged by what it wrote before.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import tempfile
import time
import zlib
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from freeride_lab.sidetasks.child_fd import ChildFd

__all__ = [
    "BeaconPhase",
    "BeaconReading",
    "Heartbeat",
    "TaskBeacon",
    "WorkerHeartbeat",
    "heartbeat_path",
    "read_heartbeat",
]

_BEACON_BYTES = 64
_SEQ = struct.Struct("<Q")
_PAYLOAD = struct.Struct("<QIIqqqq")  # seq, phase, flags, step, mark_ns, budget_ns, period_ns
_FIRST_STEP = 1  # flags: the first step of this process
_PAYLOAD_OFFSET = 8
_CRC = struct.Struct("<I")
_CRC_OFFSET = _PAYLOAD_OFFSET + _PAYLOAD.size
_READ_TRIES = 16

_HEARTBEAT_MAGIC = b"FRH1"
_HEARTBEAT = struct.Struct("<4sIqqqQ")  # magic, version, pid, period_ns, beat_ns, count
_HEARTBEAT_VERSION = 1


class BeaconPhase(StrEnum):
    """What a task host's main thread is doing, as its beacon says."""

    BUSY = "busy"  # starting, a hook, a checkpoint: user code of any length (not judged)
    WAITING = "waiting"  # waiting for an edge or a command, back within period_ns
    STEP = "step"  # running step(); judged by core.hangs.hung_step_reason


_PHASE_CODES = {BeaconPhase.BUSY: 0, BeaconPhase.WAITING: 1, BeaconPhase.STEP: 2}
_PHASES = {code: phase for phase, code in _PHASE_CODES.items()}


@dataclass(frozen=True, slots=True)
class BeaconReading:
    """A task host's latest mark. Times are ``time.monotonic_ns()``.

    Args:
        mark_ns: when the phase began (the step started, the wait began).
        step: STEP only: the training step whose bubble the step runs in (-1 = none).
        budget_ns: STEP only: the step guard in force when it started (0 = being profiled).
        period_ns: WAITING only: the longest the wait lasts before the host marks again.
        first: STEP only: the first step of this process (lazy initialisation runs in it).
    """

    phase: BeaconPhase
    mark_ns: int
    step: int = -1
    budget_ns: int = 0
    period_ns: int = 0
    first: bool = False


class TaskBeacon:
    """The shared-memory mark between a worker and one task process (see the module doc)."""

    def __init__(self, fd: int) -> None:
        self._map = mmap.mmap(fd, _BEACON_BYTES)
        self._fd = ChildFd(
            fd, closed_message="the beacon's descriptor is closed; only its mapping is left"
        )
        self._seq = 0
        self._last: BeaconReading | None = None

    @classmethod
    def create(cls) -> TaskBeacon:
        """A new beacon (marked BUSY now) whose ``fd`` a task process inherits."""
        try:
            fd = os.memfd_create("freeride-task-beacon")
        except (AttributeError, OSError):  # no memfd here: an unlinked temporary file
            with tempfile.TemporaryFile() as f:
                fd = os.dup(f.fileno())
        try:
            os.ftruncate(fd, _BEACON_BYTES)
            beacon = cls(fd)
        except BaseException:
            os.close(fd)
            raise
        beacon.busy()
        return beacon

    @classmethod
    def attach(cls, fd: int) -> TaskBeacon:
        """The beacon whose descriptor this process inherited (it is closed once mapped)."""
        beacon = cls(fd)
        beacon.close_fd()
        head = _SEQ.unpack_from(beacon._map, 0)[0]
        beacon._seq = head + (head & 1)  # continue the creator's count, even
        return beacon

    @property
    def fd(self) -> int:
        """The descriptor to hand to the task process (until ``close_fd``)."""
        return self._fd.fd

    def close_fd(self) -> None:
        """Close the descriptor (the mapping stays); after the task process has inherited it."""
        self._fd.close()

    def close(self) -> None:
        self.close_fd()
        with contextlib.suppress(BufferError, ValueError):
            self._map.close()

    # -- the task host's main thread --

    def step_started(self, step: int, budget_ns: int, *, first: bool = False) -> None:
        """A step starts now, under the guard ``budget_ns`` (0 while profiling); ``first``: the
        first of this process."""
        self._write(BeaconPhase.STEP, step=step, budget_ns=budget_ns, first=first)

    def waiting(self, period_s: float) -> None:
        """A wait starts now and returns within ``period_s`` (then the host marks again)."""
        self._write(BeaconPhase.WAITING, period_ns=max(1, int(period_s * 1e9)))

    def busy(self) -> None:
        """Host code or a hook runs now, for as long as it takes (not judged)."""
        self._write(BeaconPhase.BUSY)

    def _write(
        self,
        phase: BeaconPhase,
        *,
        step: int = -1,
        budget_ns: int = 0,
        period_ns: int = 0,
        first: bool = False,
    ) -> None:
        seq = self._seq + 2
        flags = _FIRST_STEP if first else 0
        now_ns = time.monotonic_ns()
        payload = _PAYLOAD.pack(seq, _PHASE_CODES[phase], flags, step, now_ns, budget_ns, period_ns)
        try:
            _SEQ.pack_into(self._map, 0, seq - 1)  # odd: a write is under way
            self._map[_PAYLOAD_OFFSET:_CRC_OFFSET] = payload
            _CRC.pack_into(self._map, _CRC_OFFSET, zlib.crc32(payload))
            _SEQ.pack_into(self._map, 0, seq)
        except ValueError:  # closed: nobody reads it any more
            return
        self._seq = seq

    # -- the worker --

    def read(self) -> BeaconReading | None:
        """The latest consistent mark (the last good one while a write is torn); None before
        any was read and once the beacon is closed."""
        for _ in range(_READ_TRIES):
            try:
                before = _SEQ.unpack_from(self._map, 0)[0]
                if before & 1:
                    continue
                payload = bytes(self._map[_PAYLOAD_OFFSET:_CRC_OFFSET])
                crc = _CRC.unpack_from(self._map, _CRC_OFFSET)[0]
                after = _SEQ.unpack_from(self._map, 0)[0]
            except ValueError:  # closed (the worker forgot the task, or restarts it)
                return None
            seq, code, flags, step, mark_ns, budget_ns, period_ns = _PAYLOAD.unpack(payload)
            if before != after or seq != before or crc != zlib.crc32(payload):
                continue
            phase = _PHASES.get(code)
            if phase is None:
                break
            first = bool(flags & _FIRST_STEP)
            self._last = BeaconReading(phase, mark_ns, step, budget_ns, period_ns, first)
            break
        return self._last

    def __repr__(self) -> str:
        return f"<TaskBeacon({self._last!r})>"


# --- the worker's heartbeat file ----------------------------------------------------------


def heartbeat_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    """Where the worker of ``rank`` beats."""
    return Path(run_dir) / "workers" / f"worker-{rank}.heartbeat"


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A worker's latest beat: its pid, its promise (one beat every ``period_ns``), when it last
    beat (``time.monotonic_ns()``) and how many beats so far."""

    pid: int
    period_ns: int
    beat_ns: int
    count: int


class WorkerHeartbeat:
    """Writes the heartbeat file of a worker: one fixed-size record, rewritten in place.

    The record is written once in full when the file is created, so later beats only overwrite
    blocks the file already has (a full disk cannot stop them); a beat that fails anyway is
    skipped without raising.
    """

    def __init__(self, path: Path, *, period_s: float) -> None:
        self.path = path
        self.period_ns = max(1, int(period_s * 1e9))
        self.count = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(
            path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        try:
            os.write(self._fd, self._record())
        except OSError:
            self.close()
            raise

    def _record(self) -> bytes:
        body = _HEARTBEAT.pack(
            _HEARTBEAT_MAGIC,
            _HEARTBEAT_VERSION,
            os.getpid(),
            self.period_ns,
            time.monotonic_ns(),
            self.count,
        )
        return body + _CRC.pack(zlib.crc32(body))

    def beat(self) -> None:
        """One beat (never raises)."""
        if self._fd is None:
            return
        self.count += 1
        with contextlib.suppress(OSError):
            os.pwrite(self._fd, self._record(), 0)

    def close(self, *, remove: bool = False) -> None:
        """Stop beating; ``remove`` deletes the file (a worker that ends normally)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        if remove:
            with contextlib.suppress(OSError):
                self.path.unlink()

    def __repr__(self) -> str:
        return f"<WorkerHeartbeat({str(self.path)!r}, beats={self.count})>"


def read_heartbeat(path: Path) -> Heartbeat | None:
    """The beat in ``path``, or None if there is none (no file, a torn or foreign record)."""
    size = _HEARTBEAT.size + _CRC.size
    try:
        with open(path, "rb") as f:
            data = f.read(size)
    except OSError:
        return None
    if len(data) != size:
        return None
    body, crc = data[: _HEARTBEAT.size], _CRC.unpack_from(data, _HEARTBEAT.size)[0]
    if crc != zlib.crc32(body):
        return None
    magic, version, pid, period_ns, beat_ns, count = _HEARTBEAT.unpack(body)
    if magic != _HEARTBEAT_MAGIC or version != _HEARTBEAT_VERSION or period_ns <= 0:
        return None
    return Heartbeat(pid=pid, period_ns=period_ns, beat_ns=beat_ns, count=count)
